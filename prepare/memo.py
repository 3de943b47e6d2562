"""What a compressor replica remembers between requests: a bounded LRU map shared by the
threads that prepare prompts, and the digest its keys are made of."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def parts_digest(*parts: str) -> str:
    """A digest of `parts` in order, each length-prefixed so that no two splits of the same
    text collide."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


class BoundedLru(Generic[K, V]):
    """The last `capacity` entries put or got, least recently used dropped first; thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def get_or_put(self, key: K, make: Callable[[], V]) -> V:
        """The entry under `key`; where there is none, `make()`'s value, put under it (made
        outside the lock: two threads may both make it, and either value is kept)."""
        value = self.get(key)
        if value is None:
            value = make()
            self.put(key, value)
        return value
