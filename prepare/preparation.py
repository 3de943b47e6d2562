"""From a retrieval to the chat messages vLLM receives: sanitise, compress, fit, assemble.

`PromptPreparer` is the compressor stage without Ray: the deployment wraps it, the ingress
keeps one without compressors as its fallback (the uncompressed context, cut to the token
budget), and tests and benchmarks construct it directly.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.messages import (
    DEFAULT_COLLECTION,
    AnswerStyle,
    CompressionDecision,
    CompressionPlan,
    Conversation,
    PreparedPrompt,
    PromptLayout,
    Retrieval,
    StageTiming,
    Turn,
)
from prepare.budget import context_budget_tokens, fit_to_budget
from prepare.chat_tokens import ChatTokens
from prepare.compression import ChunkCompressor, count_context_tokens
from prepare.context import ContextChunk
from prepare.continuation import (
    SentTurn,
    SentTurns,
    fully_shown,
    opening_passage,
    shown_sentences,
    turn_key,
    turn_scope,
    without_shown,
)
from prepare.cost_model import CompressionCostModel
from prepare.llmlingua_compressor import LLMLinguaCompressor, LLMLinguaOptions, ScorerDType
from prepare.methods import NO_COMPRESSION, ContextSize, compress_chunks, decide, get_method
from prepare.options import PREPARATION_DEFAULTS, PreparationOptions
from prepare.prompt import (
    SOURCE_SEPARATOR,
    SOURCES_HEADING,
    build_messages,
    history_messages,
    neutralize,
    render_context,
)
from prepare.sentence_store import SentenceStore
from prepare.tokens import RememberedCounts, ServingTokenizer

# (collection, index version) -> that version's sentence store, None when it cannot be read.
CollectionStores = Callable[[str, str], SentenceStore | None]

# What a chat template adds around one message's text (role markers, separators): counted per
# history turn against the history budget, so the budget holds under the real template.
_MESSAGE_OVERHEAD_TOKENS = 5


class PromptTooLongError(ValueError):
    """The question and the answer budget leave no room in the model's context window."""


@dataclass(frozen=True)
class LLMLinguaLoad:
    """Where LLMLingua's scorer comes from and how it scores (PromptPreparer.load)."""

    model_path: str
    options: LLMLinguaOptions = field(default_factory=LLMLinguaOptions)
    device: str = "cpu"
    dtype: ScorerDType = "float32"
    tiktoken_cache_dir: str | None = None


@dataclass
class _Draft:
    """A prompt as PromptPreparer.prepare makes it, step by step."""

    question: str
    style: AnswerStyle
    system_prompt: str
    scope: str  # what this conversation's remembered turns are kept under
    whole_history: tuple[Turn, ...]  # cleaned, uncut: what remembered turns are keyed by
    chunks: list[ContextChunk]  # the retrieved passages still to send
    plan: CompressionPlan
    degraded: str | None
    history: tuple[Turn, ...] = ()  # the earlier turns the prompt holds
    fixed_tokens: int = 0  # the prompt's tokens without sources
    budget: int = 0  # the tokens left for sources
    continued: list[SentTurn] = field(default_factory=list)  # earlier prompts continued
    shown_before: dict[str, frozenset[str]] = field(default_factory=dict)  # their sentences
    shown: list[ContextChunk] = field(default_factory=list)  # passages they showed all of


@dataclass(frozen=True)
class _Continuation:
    """A follow-up laid out to continue the prompts before it (PromptPreparer._continuation)."""

    history: tuple[Turn, ...]  # earlier questions as they were sent
    turns: list[SentTurn]  # those sent messages, oldest first
    shown: dict[str, frozenset[str]]  # per passage, the sentences they showed
    fixed_tokens: int  # the prompt's tokens without this turn's sources
    room: int  # the tokens left for them
    new: list[ContextChunk]  # retrieved passages with a sentence not shown yet
    old: list[ContextChunk]  # retrieved passages all of whose sentences were shown


class PromptPreparer:
    """Turns (question, retrieval, plan) into messages that fit the serving model."""

    def __init__(
        self,
        tokenizer: ServingTokenizer,
        system_prompts: Mapping[AnswerStyle, str],
        max_model_len: int,
        options: PreparationOptions = PREPARATION_DEFAULTS,
        *,
        chunk_compressor: ChunkCompressor | None = None,
        cost_model: CompressionCostModel | None = None,
        sentence_store: SentenceStore | None = None,
        collection_stores: CollectionStores | None = None,
        sent_turns: SentTurns | None = None,
    ) -> None:
        """`options` are the tunables; the rest are the parts it works with, each optional:
        LLMLingua's scorer, the `auto` policy's cost model, the index's sentence store and
        other collections', and the remembered turns (compression.reuse)."""
        self._tokenizer = tokenizer
        # Prompts' counts from their messages' (a continued history's sent questions are
        # tokenized once, not once per count per turn), where the template allows it.
        self._chat_tokens = ChatTokens(tokenizer)
        # Passages, sentences and fences recur across requests: counted once each (the last
        # `remembered_counts` texts; 0 counts every time).
        self._count = (
            RememberedCounts(tokenizer.count, options.remembered_counts)
            if options.remembered_counts
            else tokenizer.count
        )
        self._sent_turns = sent_turns
        # A continued follow-up's passages leave out the sentences the last
        # `skip_shown_turns` continued turns showed (None: any of them; 0: none; 1, as
        # compression.reuse's default: the turn before).
        self._skip_shown_turns = options.skip_shown_turns
        # Its top `resend_top_passages` passages go whatever was shown.
        self._resend_top_passages = options.resend_top_passages
        self._system_prompts = dict(system_prompts)
        self._max_model_len = max_model_len
        self._margin_tokens = options.margin_tokens
        self._chunk_compressor = chunk_compressor
        self._sentence_prefilter_rate = options.sentence_prefilter_rate
        self._cost_model = cost_model
        self._sentence_store = sentence_store
        self._collection_stores = collection_stores
        self._history_max_tokens = options.history_max_tokens
        self._reserved = tokenizer.reserved_strings()
        # The system prompts never change: count them once.
        self.system_prompt_tokens = {
            style: tokenizer.count_chat([{"role": "system", "content": prompt}])
            for style, prompt in self._system_prompts.items()
        }
        # The same without the generation prompt: where the next message starts.
        self._system_part_tokens = {
            style: tokenizer.count_chat([{"role": "system", "content": prompt}], False)
            for style, prompt in self._system_prompts.items()
        }
        # What opens the sources block (the user message's role marker and the heading),
        # and what joins two sources in it.
        self._sources_opening_tokens = _user_opening_tokens(tokenizer) + tokenizer.count(
            SOURCES_HEADING
        )
        self._source_join_tokens = tokenizer.count(SOURCE_SEPARATOR)

    @classmethod
    def load(
        cls,
        tokenizer_path: str,
        system_prompts: Mapping[AnswerStyle, str],
        max_model_len: int,
        options: PreparationOptions = PREPARATION_DEFAULTS,
        *,
        index_path: Path | None = None,
        llmlingua: LLMLinguaLoad | None = None,
        cost_model: CompressionCostModel | None = None,
        collection_stores: CollectionStores | None = None,
        sent_turns: SentTurns | None = None,
    ) -> PromptPreparer:
        """Load what preparation needs: the serving tokenizer, the index's sentence store
        (for sentence selection) and LLMLingua's scorer, each only when given;
        `collection_stores` finds the sentence store of another collection's version."""
        compressor = None
        if llmlingua is not None:
            compressor = LLMLinguaCompressor.load(
                llmlingua.model_path,
                llmlingua.options,
                device=llmlingua.device,
                dtype=llmlingua.dtype,
                tiktoken_cache_dir=llmlingua.tiktoken_cache_dir,
            )
        return cls(
            ServingTokenizer.load(tokenizer_path),
            system_prompts,
            max_model_len,
            options,
            chunk_compressor=compressor,
            cost_model=cost_model,
            sentence_store=SentenceStore.load(index_path) if index_path is not None else None,
            collection_stores=collection_stores,
            sent_turns=sent_turns,
        )

    def settle(self) -> None:
        """Wait for the counts begun in the background (ChatTokens.count_ahead)."""
        self._chat_tokens.settle()

    @property
    def sentence_store(self) -> SentenceStore | None:
        return self._sentence_store

    @property
    def has_chunk_compressor(self) -> bool:
        return self._chunk_compressor is not None

    def loaded_for(self, method_name: str) -> bool:
        """Whether this preparer loaded what the method needs to run at all (a missing
        sentence store only degrades a request; a compressor not loaded refuses it)."""
        return self._chunk_compressor is not None or not (
            get_method(method_name).needs_chunk_compressor
        )

    def cleaned(self, text: str) -> str:
        """`text` cleared of the tokenizer's control strings and the source fences."""
        return neutralize(text, self._reserved).strip()

    def _newest_that_fit(self, history: tuple[Turn, ...]) -> tuple[Turn, ...]:
        """The newest turns of a cleaned `history` that fit the history token budget,
        oldest first, starting with a user turn."""
        kept: list[Turn] = []
        used = 0
        for turn in reversed(history):
            tokens = self._count(turn.content) + _MESSAGE_OVERHEAD_TOKENS
            if used + tokens > self._history_max_tokens:
                break
            kept.append(turn)
            used += tokens
        return _from_first_user_turn(reversed(kept))

    def _cleaned_turns(self, history: Sequence[Turn]) -> tuple[Turn, ...]:
        return tuple(Turn(t.role, self.cleaned(t.content)) for t in history)

    def _continuation(self, draft: _Draft, max_output_tokens: int) -> _Continuation | None:
        """The draft's fitted history (a tail of the whole) continued (_Continuation);
        None when no question is remembered, or when the longer history would leave the
        passages not shown before less room than the plain one (its budget) does or than the
        plan's compression would leave of them (its target: where the compression keeps
        more, as sentence selection may by part of a sentence, the budget cuts the last
        passage). All or nothing: a continued history cut at its start
        continues nothing."""
        assert self._sent_turns is not None
        whole, chunks, plan = draft.whole_history, draft.chunks, draft.plan
        start = len(whole) - len(draft.history)
        history, sent = self._sent_turns.continued(draft.scope, whole, start)
        if not sent:
            return None
        # Only what the last `skip_shown_turns` turns showed counts as shown: older evidence
        # goes again beside the question (with 0 nothing does, and this turn's passages go
        # as the plain layout would send them, after the continued history).
        skip = len(sent) if self._skip_shown_turns is None else self._skip_shown_turns
        shown = shown_sentences(sent[max(len(sent) - skip, 0) :])
        for chunk in chunks[: self._resend_top_passages]:
            shown.pop(chunk.chunk_id, None)
        new: list[ContextChunk] = []
        old: list[ContextChunk] = []
        for chunk in chunks:
            (old if fully_shown(chunk, shown) else new).append(chunk)
        fixed_tokens, room = self._sources_room(
            draft.system_prompt, draft.question, history, max_output_tokens
        )
        # The room the new passages need: as much as the plan's compression leaves of them.
        new_tokens = count_context_tokens(new, self._count)
        wanted = min(
            draft.budget,
            new_tokens if plan.method == NO_COMPRESSION else plan.target_for(new_tokens),
        )
        if room <= 0 or room < wanted:
            return None
        return _Continuation(history, sent, shown, fixed_tokens, room, new, old)

    def _fit_to_window(
        self, system_prompt: str, question: str, history: tuple[Turn, ...], max_output: int
    ) -> tuple[tuple[Turn, ...], int, int]:
        """(history less its oldest exchanges until the context window leaves the sources
        some room, or none is left; the prompt's tokens without sources; the sources' room)."""
        while True:
            fixed_tokens, budget = self._sources_room(system_prompt, question, history, max_output)
            if budget > 0 or not history:
                return history, fixed_tokens, budget
            history = _without_oldest_exchange(history)

    def _sources_room(
        self, system_prompt: str, question: str, history: tuple[Turn, ...], max_output: int
    ) -> tuple[int, int]:
        """(the prompt's tokens without sources, the tokens left for sources)."""
        fixed_tokens = self._chat_tokens.count(build_messages(system_prompt, [], question, history))
        room = context_budget_tokens(
            self._max_model_len, max_output, fixed_tokens, self._margin_tokens
        )
        return fixed_tokens, room

    def prepare(
        self,
        conversation: Conversation,
        retrieval: Retrieval,
        plan: CompressionPlan,
        max_output_tokens: int,
        degraded: str | None = None,
    ) -> PreparedPrompt:
        """Compress the context per `plan`, cut it (and the history) to the token budget,
        build the messages in the answer style's layout.

        A plan this preparer cannot follow (no sentence store for this index, no LLMLingua)
        falls back to the uncompressed context and says why in `degraded`. Raises
        PromptTooLongError when even an empty context and no history do not fit.
        """
        started_at_s, started = time.time(), time.perf_counter()
        draft = self._cleaned(conversation, retrieval, plan, degraded)
        self._fit_history(draft, max_output_tokens)
        remembers = plan.reuse and self._sent_turns is not None
        if remembers and draft.history:
            self._continue(draft, max_output_tokens)
        tokens_before = count_context_tokens(draft.chunks, self._count)
        self._check_room(draft, max_output_tokens)
        decision = self._decided(draft, tokens_before)
        compress_started = time.perf_counter()
        compressed = self._compressed(draft, retrieval)
        compress_ms = (time.perf_counter() - compress_started) * 1000
        kept, truncated = fit_to_budget(compressed, self._count, draft.budget)
        messages = build_messages(
            draft.system_prompt, kept, draft.question, draft.history, bool(draft.shown)
        )
        if remembers:
            self._remember(draft, kept, messages[-1])
        return PreparedPrompt(
            messages=messages,
            layout=self._layout(draft, kept),
            # What the answer may cite: this turn's sources, and the retrieved passages
            # earlier turns of the prompt showed all of.
            sources=tuple(chunk.as_source() for chunk in (*kept, *draft.shown)),
            method=draft.plan.method,
            context_tokens_before=tokens_before,
            context_tokens_after=count_context_tokens(kept, self._count),
            compress_ms=compress_ms,
            truncated=truncated,
            timing=StageTiming(started_at_s, (time.perf_counter() - started) * 1000),
            decision=decision,
            degraded=draft.degraded,
            history_turns=len(draft.history),
            continued_turns=len(draft.continued),
            opening_passage=opening_passage(draft.history, draft.continued, kept),
        )

    def _cleaned(
        self,
        conversation: Conversation,
        retrieval: Retrieval,
        plan: CompressionPlan,
        degraded: str | None,
    ) -> _Draft:
        """Step 1, clean: the question, history and passages cleared of the tokenizer's
        control strings, and the plan, uncompressed where this preparer cannot follow it."""
        chunks, no_sentences = self._context_chunks(retrieval)
        if reason := self._unmet_need(plan, no_sentences):
            plan, degraded = replace(plan, method=NO_COMPRESSION), degraded or reason
        system_prompt = self._system_prompts[conversation.answer_style]
        return _Draft(
            question=self.cleaned(conversation.question),
            style=conversation.answer_style,
            system_prompt=system_prompt,
            scope=turn_scope(retrieval.collection, system_prompt),
            whole_history=self._cleaned_turns(conversation.history),
            chunks=chunks,
            plan=plan,
            degraded=degraded,
        )

    def _fit_history(self, draft: _Draft, max_output_tokens: int) -> None:
        """Step 2, fit history: the newest turns within the history budget, fewer while the
        context window leaves the sources no room; what the sources then have left."""
        draft.history, draft.fixed_tokens, draft.budget = self._fit_to_window(
            draft.system_prompt,
            draft.question,
            self._newest_that_fit(draft.whole_history),
            max_output_tokens,
        )

    def _continue(self, draft: _Draft, max_output_tokens: int) -> None:
        """Step 3, continue: a follow-up's earlier questions go as they were sent, and the
        sentences they showed are not sent again (prepare.continuation), where they fit."""
        found = self._continuation(draft, max_output_tokens)
        if found is not None:
            draft.history, draft.continued, draft.shown_before = (
                found.history,
                found.turns,
                found.shown,
            )
            draft.fixed_tokens, draft.budget = found.fixed_tokens, found.room
            draft.chunks, draft.shown = found.new, found.old

    def _check_room(self, draft: _Draft, max_output_tokens: int) -> None:
        if draft.budget <= 0:
            raise PromptTooLongError(
                f"the question ({draft.fixed_tokens} prompt tokens with the system prompt) and "
                f"max_tokens={max_output_tokens} exceed the model's {self._max_model_len}-token "
                "context"
            )

    def _decided(self, draft: _Draft, tokens_before: int) -> CompressionDecision | None:
        """Step 4a, under `auto`: whether compressing pays, by the cost model; the plan is
        left uncompressed where it does not."""
        plan = draft.plan
        if plan.policy != "auto" or plan.method == NO_COMPRESSION:
            return None
        uncached_fixed = draft.fixed_tokens - self.system_prompt_tokens[draft.style]
        decision = self._decide(
            plan, tokens_before, len(draft.chunks), draft.budget, uncached_fixed
        )
        if not decision.compress:
            draft.plan = replace(plan, method=NO_COMPRESSION)
        return decision

    def _compressed(self, draft: _Draft, retrieval: Retrieval) -> list[ContextChunk]:
        """Step 4b, compress: the passages as the plan's method keeps them, less what a
        continued follow-up's earlier turns showed."""
        compressed = compress_chunks(
            draft.plan,
            draft.question,
            retrieval.question_embedding,
            draft.chunks,
            self._count,
            self._chunk_compressor,
            self._sentence_prefilter_rate,
        )
        if draft.shown_before:  # what compression kept of a passage shown before: its new sentences
            compressed, all_shown = without_shown(compressed, draft.shown_before)
            draft.shown += all_shown
        return compressed

    def _remember(
        self, draft: _Draft, kept: Sequence[ContextChunk], message: dict[str, str]
    ) -> None:
        """Remember the user message this question was sent as, for its follow-ups."""
        assert self._sent_turns is not None
        sent = {chunk.chunk_id: frozenset(chunk.sentences) for chunk in kept if chunk.sentences}
        self._sent_turns.remember(
            turn_key(draft.scope, draft.whole_history, draft.question),
            SentTurn(message["content"], sent, kept[0].chunk_id if kept else ""),
        )
        # A follow-up's history holds this message: counted while the answer is made.
        self._chat_tokens.count_ahead(dict(message))

    def _layout(self, draft: _Draft, kept: Sequence[ContextChunk]) -> PromptLayout:
        """Token counts of the prompt's parts (build_messages' order): the system message,
        the earlier turns, and the opening of the last user message through its sources
        (each source as rendered in its tags, and the newlines that join them: the sum
        matched one count of the whole block on 300 SQuAD source sets, so the block is not
        tokenized again)."""
        system = self._system_part_tokens[draft.style]
        with_history = system
        if draft.history:
            opening = {"role": "system", "content": draft.system_prompt}
            messages = [opening, *history_messages(draft.history)]
            with_history = self._chat_tokens.count(messages, False)
        passages = 0
        if kept:
            count = self._count
            tagged = sum(count(c.text) + count(render_context([replace(c, text="")])) for c in kept)
            joins = (len(kept) - 1) * self._source_join_tokens
            passages = self._sources_opening_tokens + tagged + joins
        return PromptLayout(system, with_history - system, passages)

    def _context_chunks(self, retrieval: Retrieval) -> tuple[list[ContextChunk], str | None]:
        """The retrieved chunks, sanitised, with sentence embeddings where the store has them;
        the second value says why sentence selection is impossible, if it is."""
        store = self._store_of(retrieval)
        if store is None:
            chunks = [ContextChunk.without_embeddings(c) for c in retrieval.chunks]
            reason: str | None = "no_sentence_store"
        elif store.version != retrieval.index_version:
            chunks = [ContextChunk.without_embeddings(c) for c in retrieval.chunks]
            reason = "index_version_mismatch"
        else:
            chunks = [store.context_chunk(c) for c in retrieval.chunks]
            reason = None
        return [self._sanitized(chunk) for chunk in chunks], reason

    def _store_of(self, retrieval: Retrieval) -> SentenceStore | None:
        """The sentence store of the collection and version `retrieval` searched."""
        if retrieval.collection == DEFAULT_COLLECTION:
            return self._sentence_store
        if self._collection_stores is None:
            return None
        return self._collection_stores(retrieval.collection, retrieval.index_version)

    def _unmet_need(self, plan: CompressionPlan, no_sentences: str | None) -> str | None:
        """Why this preparer cannot apply `plan`'s method, if it cannot (the `degraded`
        reason): it needs sentence embeddings the store lacks, or a compressor not loaded."""
        if get_method(plan.method).needs_sentence_embeddings and no_sentences:
            return no_sentences
        if not self.loaded_for(plan.method):
            return "llmlingua_not_loaded"
        return None

    def _decide(
        self,
        plan: CompressionPlan,
        tokens_before: int,
        chunks: int,
        budget: int,
        uncached_fixed_tokens: int,
    ) -> CompressionDecision:
        """The cost model's verdict on `plan`, for what would actually be sent: both sides
        are cut to the context budget, and the cached system prompt is not prefilled."""
        if self._cost_model is None:
            raise ValueError("compression policy 'auto' needs a cost model")
        size = ContextSize(
            tokens_before=min(tokens_before, budget),
            tokens_after=min(plan.target_for(tokens_before), budget),
            chunks=chunks,
            sentence_prefilter_rate=self._sentence_prefilter_rate,
        )
        return decide(self._cost_model, plan.method, size, max(0, uncached_fixed_tokens))

    def _sanitized(self, chunk: ContextChunk) -> ContextChunk:
        return replace(
            chunk,
            chunk_id=neutralize(chunk.chunk_id, self._reserved),
            title=neutralize(chunk.title, self._reserved),
            text=neutralize(chunk.text, self._reserved),
            sentences=tuple(neutralize(s, self._reserved) for s in chunk.sentences),
        )


def _user_opening_tokens(tokenizer: ServingTokenizer) -> int:
    """Tokens the chat template puts before a user message's text (its role marker)."""
    system = [{"role": "system", "content": "s"}]
    marker = "\x00"
    before = tokenizer.render_chat(system, False)
    rendered = tokenizer.render_chat([*system, {"role": "user", "content": marker}], False)
    return tokenizer.count(rendered[len(before) : rendered.index(marker)])


def _without_oldest_exchange(history: tuple[Turn, ...]) -> tuple[Turn, ...]:
    """`history` less its oldest turn, and any assistant turn that would then lead."""
    return _from_first_user_turn(history[1:])


def _from_first_user_turn(turns: Iterable[Turn]) -> tuple[Turn, ...]:
    """`turns` from the first user turn on: a conversation never opens with an answer."""
    return tuple(itertools.dropwhile(lambda turn: turn.role != "user", turns))
