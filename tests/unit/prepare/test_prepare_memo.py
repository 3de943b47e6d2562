"""prepare.memo: the bounded LRU the compressor's memories share, and their key digest."""

from __future__ import annotations

import pytest

from prepare.memo import BoundedLru, parts_digest


def test_the_least_recently_used_entry_goes_first() -> None:
    lru: BoundedLru[str, int] = BoundedLru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "b" is now the least recently used
    lru.put("c", 3)

    assert len(lru) == 2
    assert lru.get("b") is None
    assert (lru.get("a"), lru.get("c")) == (1, 3)
    with pytest.raises(ValueError):
        BoundedLru(0)


def test_get_or_put_makes_a_missing_entry_once_and_keeps_it() -> None:
    lru: BoundedLru[str, int] = BoundedLru(2)
    made: list[str] = []

    def make(key: str) -> int:
        made.append(key)
        return len(made)

    assert lru.get_or_put("a", lambda: make("a")) == 1
    assert lru.get_or_put("a", lambda: make("a")) == 1
    assert made == ["a"] and lru.get("a") == 1


def test_parts_are_length_prefixed_so_splits_do_not_collide() -> None:
    assert parts_digest("ab", "c") != parts_digest("a", "bc")
    assert parts_digest("ab", "c") == parts_digest("ab", "c")
    assert len(parts_digest("x")) == 32
