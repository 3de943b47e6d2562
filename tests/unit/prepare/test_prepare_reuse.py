"""prepare.reuse: the view of passage sequences the generator likely holds, and its LRU."""

from __future__ import annotations

import pytest

from prepare.reuse import PassageCacheView, passage_key

SYSTEM = "system-a"


def test_nothing_is_cached_before_anything_was_sent():
    assert PassageCacheView(1000, seed_after=1).cached_prefix(SYSTEM, ["a", "b"]) == []


def test_the_cached_path_is_in_the_order_sent_whatever_the_order_asked():
    view = PassageCacheView(1000, seed_after=1)
    view.record(SYSTEM, [("a", 100), ("b", 100), ("c", 100)])

    assert view.cached_prefix(SYSTEM, ["c", "a", "b"]) == ["a", "b", "c"]
    assert view.cached_prefix(SYSTEM, ["b", "a", "z"]) == ["a", "b"]
    # Only a prefix is reusable: without a, nothing after it is.
    assert view.cached_prefix(SYSTEM, ["b", "c"]) == []


def test_the_path_stops_at_its_passage_limit():
    view = PassageCacheView(1000, seed_after=1, path_passages=1)
    view.record(SYSTEM, [("a", 100), ("b", 100), ("c", 100)])

    assert view.path_passages == 1
    assert view.cached_prefix(SYSTEM, ["c", "a", "b"]) == ["a"]
    with pytest.raises(ValueError, match="path_passages"):
        PassageCacheView(1000, seed_after=1, path_passages=0)


def test_each_system_prompt_has_its_own_tree():
    view = PassageCacheView(1000, seed_after=1)
    view.record(SYSTEM, [("a", 100)])

    assert view.cached_prefix("system-b", ["a"]) == []


def test_of_two_fitting_branches_the_most_recent_is_followed():
    view = PassageCacheView(1000, seed_after=1)
    view.record(SYSTEM, [("a", 10), ("b", 10)])
    view.record(SYSTEM, [("a", 10), ("c", 10)])

    assert view.cached_prefix(SYSTEM, ["a", "b", "c"]) == ["a", "c"]
    view.record(SYSTEM, [("a", 10), ("b", 10)])
    assert view.cached_prefix(SYSTEM, ["a", "b", "c"]) == ["a", "b"]


def test_a_passage_is_counted_once_per_path():
    view = PassageCacheView(1000, seed_after=1)
    view.record(SYSTEM, [("a", 100), ("b", 50)])
    view.record(SYSTEM, [("a", 100), ("b", 50)])

    assert view.tokens == 150


def test_past_the_capacity_the_least_recently_used_passages_go_first():
    view = PassageCacheView(300, seed_after=1)
    view.record(SYSTEM, [("a", 100), ("b", 100)])
    view.record(SYSTEM, [("c", 100)])
    view.record(SYSTEM, [("a", 100), ("b", 100)])  # a, b used again: c is the oldest now
    view.record(SYSTEM, [("d", 100)])

    assert view.tokens <= 300
    assert view.cached_prefix(SYSTEM, ["c"]) == []
    assert view.cached_prefix(SYSTEM, ["a", "b"]) == ["a", "b"]
    assert view.cached_prefix(SYSTEM, ["d"]) == ["d"]


def test_a_path_longer_than_the_capacity_keeps_its_front():
    view = PassageCacheView(250, seed_after=1)
    view.record(SYSTEM, [("a", 100), ("b", 100), ("c", 100)])

    assert view.cached_prefix(SYSTEM, ["a", "b", "c"]) == ["a", "b"]
    assert view.tokens == 200


def test_retrieved_before_counts_earlier_requests_only():
    view = PassageCacheView(1000, seed_after=1)

    assert view.retrieved_before(["a", "b"]) == {}
    assert view.retrieved_before(["b", "c"]) == {"b": 1}
    assert view.retrieved_before(["a", "b", "c"]) == {"a": 1, "b": 2, "c": 1}


def test_retrieved_counts_forget_the_least_recent_past_their_bound():
    view = PassageCacheView(1000, seed_after=1, remembered_passages=2)
    view.retrieved_before(["a"])
    view.retrieved_before(["b"])
    view.retrieved_before(["c"])

    assert view.retrieved_before(["a", "b", "c"]) == {"b": 1, "c": 1}


def test_keys_are_the_exact_text():
    assert passage_key("text") == passage_key("text")
    assert passage_key("text") != passage_key("text ")


def test_a_capacity_below_one_token_is_refused():
    with pytest.raises(ValueError, match="capacity_tokens"):
        PassageCacheView(0, seed_after=1)


def test_the_best_ranked_passage_is_seeded_once_retrieved_often_enough():
    view = PassageCacheView(1000, seed_after=2, path_passages=1)

    assert view.layout(SYSTEM, ["a", "b"]).first == []  # never retrieved
    assert view.layout(SYSTEM, ["a", "c"]).first == []  # a retrieved once before
    seeded = view.layout(SYSTEM, ["a", "b"])  # a twice before: seeded, not yet cached
    assert (seeded.first, seeded.cached) == (["a"], 0)


def test_a_lower_ranked_passage_is_not_seeded_however_often_retrieved():
    view = PassageCacheView(1000, seed_after=1, path_passages=1)
    view.layout(SYSTEM, ["a", "b"])

    # b was retrieved before, but this request ranks c, never seen, first.
    assert view.layout(SYSTEM, ["c", "b"]).first == []


def test_a_cached_path_goes_first_and_a_full_path_takes_no_seed():
    view = PassageCacheView(1000, seed_after=1, path_passages=1)
    view.record(SYSTEM, [("a", 100)])
    view.layout(SYSTEM, ["b"])

    layout = view.layout(SYSTEM, ["b", "a"])
    assert (layout.first, layout.cached) == (["a"], 1)


def test_seed_after_below_one_is_refused():
    with pytest.raises(ValueError, match="seed_after"):
        PassageCacheView(1000, seed_after=0)
