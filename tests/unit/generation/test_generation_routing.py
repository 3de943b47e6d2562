"""generation.routing: a key's replica order (rendezvous hashing) and the load bound."""

from __future__ import annotations

from collections import Counter

import pytest

from generation.routing import bounded_choice, rendezvous_order

REPLICAS = ["replica-a", "replica-b", "replica-c"]


def test_the_order_is_a_permutation_that_depends_only_on_the_key_and_the_replicas():
    order = rendezvous_order("passage-1", REPLICAS)

    assert sorted(order) == sorted(REPLICAS)
    assert rendezvous_order("passage-1", list(reversed(REPLICAS))) == order
    orders = {tuple(rendezvous_order(f"passage-{i}", REPLICAS)) for i in range(50)}
    assert len(orders) > 1


def test_keys_spread_evenly_over_the_replicas():
    firsts = Counter(rendezvous_order(f"passage-{i}", REPLICAS)[0] for i in range(3000))

    assert set(firsts) == set(REPLICAS)
    assert all(850 < count < 1150 for count in firsts.values()), firsts


def test_losing_a_replica_moves_only_the_keys_it_held():
    keys = [f"passage-{i}" for i in range(500)]
    before = {key: rendezvous_order(key, REPLICAS)[0] for key in keys}
    survivors = ["replica-a", "replica-c"]
    after = {key: rendezvous_order(key, survivors)[0] for key in keys}

    moved = [key for key in keys if before[key] != after[key]]
    assert moved and all(before[key] == "replica-b" for key in moved)
    assert all(after[key] in survivors for key in keys)


def test_the_preferred_replica_wins_while_its_queue_is_within_the_gap():
    order = ["replica-b", "replica-a", "replica-c"]

    assert bounded_choice(order, {"replica-a": 0, "replica-b": 2, "replica-c": 1}, 2) == "replica-b"
    # Three longer than the shortest: the next in the key's order that is within the gap.
    assert bounded_choice(order, {"replica-a": 0, "replica-b": 3, "replica-c": 0}, 2) == "replica-a"
    assert bounded_choice(order, {"replica-a": 5, "replica-b": 3, "replica-c": 0}, 2) == "replica-c"


def test_unknown_queues_do_not_disqualify_and_no_gap_means_affinity_always_wins():
    order = ["replica-b", "replica-a"]

    assert bounded_choice(order, {"replica-a": None, "replica-b": None}, 2) == "replica-b"
    assert bounded_choice(order, {"replica-a": 0, "replica-b": None}, 0) == "replica-b"
    assert bounded_choice(order, {"replica-a": 0, "replica-b": 50}, None) == "replica-b"
    with pytest.raises(ValueError, match="no replica"):
        bounded_choice([], {}, 2)


def test_a_hot_key_under_load_spills_over_instead_of_taking_every_request():
    # A burst of one key's requests, none finished yet: the preferred replica's queue grows
    # until the bound sends the rest elsewhere.
    queues = dict.fromkeys(REPLICAS, 0)
    order = rendezvous_order("hot", REPLICAS)
    for _ in range(12):
        queues[bounded_choice(order, queues, 2)] += 1

    assert queues[order[0]] == max(queues.values()) < 12
    assert max(queues.values()) - min(queues.values()) <= 3
