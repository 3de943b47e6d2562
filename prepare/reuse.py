"""Which passages the generator likely still holds in its prefix cache, and an order of the
context that reuses them.

vLLM's prefix cache keys full KV blocks by every token from the start of the prompt, so a
passage's prefill is reused only when everything before it, the system prompt and the
passages ahead of it, is byte-identical to a prompt it served before. Passages in score
order rarely line up that way: two questions about the same paragraph rank the same
passages differently, and sentence selection rewrites each passage for each question.

`PassageCacheView` remembers the passage sequences this replica sent, as a tree under each
system prompt (RAGCache's knowledge tree, kept here without the engine's help), and forgets
the least recently used ones once they add up to more tokens than the engine's KV cache
holds (a model of vLLM's own LRU eviction). It also counts how often each passage was
retrieved. The layout (`PromptPreparer`) follows from it:
1. cached: the longest path of the tree along passages the request retrieved, in the order
   they were sent before, whole;
2. seed: the request's best-ranked passage not on that path, whole, when earlier requests
   retrieved it at least `seed_after` times: cached for the next request, the path grows
   by one passage a request. A seed costs its compressed form's saving now and pays only
   when later requests retrieve it again; a passage retrieved once before (a neighbour of
   some earlier question) seldom is, one retrieved twice or more (the paragraph a run of
   questions is about) often is (`python -m bench.reuse --seeding`);
3. the rest in score order, the only part compression touches; when nothing is compressed
   they too go whole, in the order of their keys (so every replica agrees on it).
A first version sent every passage retrieved before whole at once, in key order; on the
skewed workload it was slower (docs/benchmarks.md, "Reusing retrieved passages"); so, where
no later question came, was a second that seeded the passage retrieved most often before
after a single retrieval.

A wrong view only costs speed: a passage predicted cached and evicted is prefilled afresh,
its text is still the retrieved text.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def passage_key(rendered: str) -> str:
    """A passage's identity in the view: a digest of the exact text the prompt holds."""
    return hashlib.blake2b(rendered.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class ReuseLayout:
    """Passages to send first and whole, in order; the first `cached` of them are predicted
    cached, the rest (at most one) seeded."""

    first: list[str]
    cached: int


@dataclass
class _Node:
    tokens: int
    last_used: int
    children: dict[str, _Node] = field(default_factory=dict)


class PassageCacheView:
    """A tree of the passage sequences sent after each system prompt, LRU-bounded by tokens.

    Not thread-safe: the compressor replica calls it from one preparation at a time per
    thread, so callers hold a lock (PromptPreparer does).
    """

    def __init__(
        self,
        capacity_tokens: int,
        *,
        seed_after: int,
        remembered_passages: int = 4096,
        path_passages: int | None = None,
    ) -> None:
        if capacity_tokens < 1:
            raise ValueError("capacity_tokens must be at least 1")
        if path_passages is not None and path_passages < 1:
            raise ValueError("path_passages must be at least 1")
        if seed_after < 1:
            raise ValueError("seed_after must be at least 1")
        self._capacity_tokens = capacity_tokens
        # How many passages a layout keeps in the shared prefix (None: no limit).
        self.path_passages = path_passages
        # Earlier retrievals a passage needs before it is seeded.
        self.seed_after = seed_after
        self._roots: dict[str, _Node] = {}
        self._clock = itertools.count(1)
        self._tokens = 0
        # How often each passage was retrieved lately, most recent last (bounded).
        self._retrieved: OrderedDict[str, int] = OrderedDict()
        self._remembered = remembered_passages

    def retrieved_before(self, keys: Sequence[str]) -> dict[str, int]:
        """Of `keys`, those retrieved by earlier requests, with how often; then counts these."""
        earlier = {key: self._retrieved[key] for key in keys if key in self._retrieved}
        for key in keys:
            self._retrieved[key] = self._retrieved.get(key, 0) + 1
            self._retrieved.move_to_end(key)
        while len(self._retrieved) > self._remembered:
            self._retrieved.popitem(last=False)
        return earlier

    @property
    def tokens(self) -> int:
        """Passage tokens the view believes cached, at most the capacity."""
        return self._tokens

    def cached_prefix(self, root: str, keys: Sequence[str]) -> list[str]:
        """The longest path of passages sent after `root` whose every passage is among
        `keys`, in the order it was sent, at most `path_passages` long; where two branches
        fit, the most recently used."""
        node = self._roots.get(root)
        wanted = set(keys)
        path: list[str] = []
        while node is not None and (self.path_passages is None or len(path) < self.path_passages):
            fitting = [(child.last_used, key) for key, child in node.children.items()]
            fitting = [item for item in fitting if item[1] in wanted and item[1] not in path]
            if not fitting:
                break
            _, key = max(fitting)
            path.append(key)
            node = node.children[key]
        return path

    def layout(self, root: str, keys: Sequence[str]) -> ReuseLayout:
        """The layout for a request that retrieved `keys` (best first) after `root`: the
        cached path, then the seed if one qualifies (module docstring); counts the
        retrieval."""
        cached = self.cached_prefix(root, keys)
        earlier = self.retrieved_before(keys)
        room = self.path_passages is None or len(cached) < self.path_passages
        best = next((key for key in keys if key not in cached), None)
        seed = [best] if room and best and earlier.get(best, 0) >= self.seed_after else []
        return ReuseLayout([*cached, *seed], len(cached))

    def record(self, root: str, passages: Sequence[tuple[str, int]]) -> None:
        """Note that a prompt opened with `root` then `passages` ((key, tokens) in order)
        was sent, then evict the least recently used paths past the capacity."""
        now = next(self._clock)
        node = self._roots.setdefault(root, _Node(0, now))
        node.last_used = now
        for key, tokens in passages:
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(tokens, now)
                self._tokens += tokens
            child.last_used = now
            node = child
        while self._tokens > self._capacity_tokens and self._evict_one():
            pass

    def _evict_one(self) -> bool:
        """Drop the least recently used leaf; False when nothing is left to drop."""
        oldest: tuple[int, dict[str, _Node], str] | None = None
        stack = [root for root in self._roots.values()]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                if child.children:
                    stack.append(child)
                elif oldest is None or child.last_used < oldest[0]:
                    oldest = (child.last_used, node.children, key)
        if oldest is None:
            return False
        _, siblings, key = oldest
        self._tokens -= siblings.pop(key).tokens
        return True
