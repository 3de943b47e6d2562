"""PassageAffinityRouter's ranks, with Serve's replicas and queue-length cache stood in for
(the ordering and the load bound are generation.routing's, tested on their own)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

from deployments.passage_router import PassageAffinityRouter, routing_key
from generation.routing import rendezvous_order
from pipeline.messages import GenerationRequest


@dataclass(frozen=True)
class ReplicaId:
    name: str

    def to_full_id_str(self) -> str:
        return self.name


@dataclass(frozen=True)
class Replica:
    replica_id: ReplicaId


def router(queues: dict[str, int | None], gap: float | None = 2) -> SimpleNamespace:
    cache = SimpleNamespace(get=lambda replica_id: queues.get(replica_id.name))
    return SimpleNamespace(_replica_queue_len_cache=cache, _max_queue_gap=gap)


def pending(key: str) -> SimpleNamespace:
    return SimpleNamespace(args=[GenerationRequest([], 8, 0.0, "r1", routing_key=key)])


def ranks(state: SimpleNamespace, replicas: list[Replica], request) -> list[list[str]]:
    chosen = asyncio.run(PassageAffinityRouter.choose_replicas(state, replicas, request))
    return [[replica.replica_id.name for replica in rank] for rank in chosen]


REPLICAS = [Replica(ReplicaId(name)) for name in ("a", "b", "c")]


def test_the_keys_replica_comes_first_then_the_others_in_the_keys_order():
    order = rendezvous_order("passage", ["a", "b", "c"])

    assert ranks(router({}), REPLICAS, pending("passage")) == [[order[0]], order[1:]]


def test_a_long_queue_on_the_keys_replica_moves_the_request_to_the_next():
    order = rendezvous_order("passage", ["a", "b", "c"])
    queues = {order[0]: 5, order[1]: 0, order[2]: 0}

    assert ranks(router(queues), REPLICAS, pending("passage")) == [
        [order[1]],
        [order[0], order[2]],
    ]
    # Without a bound, affinity wins however long the queue.
    assert ranks(router(queues, gap=None), REPLICAS, pending("passage"))[0] == [order[0]]


def test_without_a_key_or_a_choice_every_replica_is_one_rank():
    assert ranks(router({}), REPLICAS, pending("")) == [["a", "b", "c"]]
    assert ranks(router({}), REPLICAS, None) == [["a", "b", "c"]]
    assert ranks(router({}), REPLICAS[:1], pending("passage")) == [["a"]]


def test_the_key_is_read_only_from_a_generation_request():
    assert routing_key(pending("k")) == "k"
    assert routing_key(SimpleNamespace(args=["a prompt"])) == ""
    assert routing_key(SimpleNamespace(args=[])) == ""
    assert routing_key(None) == ""
