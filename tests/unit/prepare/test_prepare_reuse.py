"""prepare.reuse: the view of passage sequences the generator likely holds, and its LRU."""

from __future__ import annotations

import pytest

from prepare.reuse import PassageCacheView, passage_key

SYSTEM = "system-a"


def test_nothing_is_cached_before_anything_was_sent():
    assert PassageCacheView(1000).cached_prefix(SYSTEM, ["a", "b"]) == []


def test_the_cached_path_is_in_the_order_sent_whatever_the_order_asked():
    view = PassageCacheView(1000)
    view.record(SYSTEM, [("a", 100), ("b", 100), ("c", 100)])

    assert view.cached_prefix(SYSTEM, ["c", "a", "b"]) == ["a", "b", "c"]
    assert view.cached_prefix(SYSTEM, ["b", "a", "z"]) == ["a", "b"]
    # Only a prefix is reusable: without a, nothing after it is.
    assert view.cached_prefix(SYSTEM, ["b", "c"]) == []


def test_the_path_stops_at_its_passage_limit():
    view = PassageCacheView(1000, path_passages=1)
    view.record(SYSTEM, [("a", 100), ("b", 100), ("c", 100)])

    assert view.path_passages == 1
    assert view.cached_prefix(SYSTEM, ["c", "a", "b"]) == ["a"]
    with pytest.raises(ValueError, match="path_passages"):
        PassageCacheView(1000, path_passages=0)


def test_each_system_prompt_has_its_own_tree():
    view = PassageCacheView(1000)
    view.record(SYSTEM, [("a", 100)])

    assert view.cached_prefix("system-b", ["a"]) == []


def test_of_two_fitting_branches_the_most_recent_is_followed():
    view = PassageCacheView(1000)
    view.record(SYSTEM, [("a", 10), ("b", 10)])
    view.record(SYSTEM, [("a", 10), ("c", 10)])

    assert view.cached_prefix(SYSTEM, ["a", "b", "c"]) == ["a", "c"]
    view.record(SYSTEM, [("a", 10), ("b", 10)])
    assert view.cached_prefix(SYSTEM, ["a", "b", "c"]) == ["a", "b"]


def test_a_passage_is_counted_once_per_path():
    view = PassageCacheView(1000)
    view.record(SYSTEM, [("a", 100), ("b", 50)])
    view.record(SYSTEM, [("a", 100), ("b", 50)])

    assert view.tokens == 150


def test_past_the_capacity_the_least_recently_used_passages_go_first():
    view = PassageCacheView(300)
    view.record(SYSTEM, [("a", 100), ("b", 100)])
    view.record(SYSTEM, [("c", 100)])
    view.record(SYSTEM, [("a", 100), ("b", 100)])  # a, b used again: c is the oldest now
    view.record(SYSTEM, [("d", 100)])

    assert view.tokens <= 300
    assert view.cached_prefix(SYSTEM, ["c"]) == []
    assert view.cached_prefix(SYSTEM, ["a", "b"]) == ["a", "b"]
    assert view.cached_prefix(SYSTEM, ["d"]) == ["d"]


def test_a_path_longer_than_the_capacity_keeps_its_front():
    view = PassageCacheView(250)
    view.record(SYSTEM, [("a", 100), ("b", 100), ("c", 100)])

    assert view.cached_prefix(SYSTEM, ["a", "b", "c"]) == ["a", "b"]
    assert view.tokens == 200


def test_retrieved_before_counts_earlier_requests_only():
    view = PassageCacheView(1000)

    assert view.retrieved_before(["a", "b"]) == {}
    assert view.retrieved_before(["b", "c"]) == {"b": 1}
    assert view.retrieved_before(["a", "b", "c"]) == {"a": 1, "b": 2, "c": 1}


def test_retrieved_counts_forget_the_least_recent_past_their_bound():
    view = PassageCacheView(1000, remembered_passages=2)
    view.retrieved_before(["a"])
    view.retrieved_before(["b"])
    view.retrieved_before(["c"])

    assert view.retrieved_before(["a", "b", "c"]) == {"b": 1, "c": 1}


def test_keys_are_the_exact_text():
    assert passage_key("text") == passage_key("text")
    assert passage_key("text") != passage_key("text ")


def test_a_capacity_below_one_token_is_refused():
    with pytest.raises(ValueError, match="capacity_tokens"):
        PassageCacheView(0)
