"""The affinity routers' ranks, with Serve's replicas and queue-length cache stood in for
(the ordering and the load bound are generation.routing's, tested on their own), and the
keys the generator's and the compressor's routers read from a call."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from deployments import conversation_router, passage_router
from deployments.affinity_router import AffinityRouter
from generation.routing import rendezvous_order
from pipeline.messages import (
    CompressionPlan,
    Conversation,
    GenerationRequest,
    Retrieval,
    StageTiming,
    Turn,
)


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
    return SimpleNamespace(
        _replica_queue_len_cache=cache,
        _max_queue_gap=gap,
        routing_key=lambda request: request.key if request is not None else "",
    )


def pending(key: str) -> SimpleNamespace:
    return SimpleNamespace(key=key)


def ranks(state: SimpleNamespace, replicas: list[Replica], request) -> list[list[str]]:
    chosen = asyncio.run(AffinityRouter.choose_replicas(state, replicas, request))
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


def test_when_the_keys_replica_is_gone_the_key_moves_to_its_next_choice_only():
    order = rendezvous_order("conversation", ["a", "b", "c"])
    left = [replica for replica in REPLICAS if replica.replica_id.name != order[0]]

    assert ranks(router({}), left, pending("conversation")) == [[order[1]], [order[2]]]


def test_the_passage_router_reads_its_key_only_from_a_generation_request():
    generation = GenerationRequest([], 8, 0.0, "r1", routing_key="k")
    assert passage_router.routing_key(SimpleNamespace(args=[generation], kwargs={})) == "k"
    by_name = SimpleNamespace(args=[], kwargs={"request": generation})
    assert passage_router.routing_key(by_name) == "k"
    assert passage_router.routing_key(SimpleNamespace(args=["a prompt"], kwargs={})) == ""
    assert passage_router.routing_key(SimpleNamespace(args=[], kwargs={})) == ""
    assert passage_router.routing_key(None) == ""


def prepare_call(conversation: Conversation, collection: str = "default") -> SimpleNamespace:
    retrieval = Retrieval(np.zeros(2), (), "v1", StageTiming(0.0, 0.0), collection)
    return SimpleNamespace(args=[conversation, retrieval, CompressionPlan("none"), 64], kwargs={})


def test_a_prepare_call_made_with_keywords_keeps_its_conversations_key():
    conversation = Conversation("Who wrote it?")
    positional = prepare_call(conversation)
    retrieval = positional.args[1]
    by_name = SimpleNamespace(
        args=[],
        kwargs={"conversation": conversation, "retrieval": retrieval, "plan": None},
    )
    mixed = SimpleNamespace(args=[conversation], kwargs={"retrieval": retrieval})

    key = conversation_router.routing_key(positional)
    assert key != ""
    assert conversation_router.routing_key(by_name) == key
    assert conversation_router.routing_key(mixed) == key


def test_every_question_of_a_conversation_has_its_opening_questions_key():
    first = Conversation("Who wrote it?", answer_style="short")
    second = Conversation(
        "When?", (Turn("user", "Who wrote it?"), Turn("assistant", "Ann.")), "short"
    )
    third = Conversation(
        "Why?", (*second.history, Turn("user", "When?"), Turn("assistant", "1901.")), "short"
    )
    keys = {conversation_router.routing_key(prepare_call(c)) for c in (first, second, third)}

    assert len(keys) == 1 and keys != {""}
    # Another opening question, style or collection is another conversation.
    assert (
        conversation_router.routing_key(prepare_call(Conversation("What?", answer_style="short")))
        not in keys
    )
    assert conversation_router.routing_key(prepare_call(Conversation("Who wrote it?"))) not in keys
    assert conversation_router.routing_key(prepare_call(first, "team")) not in keys


def test_the_conversation_router_has_no_key_for_other_calls():
    attribute = SimpleNamespace(args=["an answer", ()], kwargs={})
    assert conversation_router.routing_key(attribute) == ""
    assert (
        conversation_router.routing_key(SimpleNamespace(args=[Conversation("q")], kwargs={})) == ""
    )
    assert conversation_router.routing_key(None) == ""


class Counted:
    def __init__(self) -> None:
        self.tags: list[dict[str, str]] = []

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self.tags.append(dict(tags or {}))


def routed(replica: str, key: str, replicas=("a", "b", "c")) -> list[dict[str, str]]:
    counter = Counted()
    state = SimpleNamespace(
        stage="generator",
        curr_replicas={ReplicaId(name): Replica(ReplicaId(name)) for name in replicas},
        routing_key=lambda request: request.key if request is not None else "",
        _routed_calls=counter,
    )
    AffinityRouter.on_request_routed(state, pending(key), ReplicaId(replica), None)
    return counter.tags


def test_a_keyed_call_is_counted_as_kept_on_its_keys_replica_or_moved_off_it():
    order = rendezvous_order("passage", ["a", "b", "c"])

    assert routed(order[0], "passage") == [{"stage": "generator", "outcome": "kept"}]
    assert routed(order[1], "passage") == [{"stage": "generator", "outcome": "moved"}]


def test_a_call_without_a_key_or_a_choice_of_replicas_is_not_counted():
    assert routed("a", "") == []
    assert routed("a", "passage", replicas=("a",)) == []


def test_each_router_names_its_stage():
    assert passage_router.PassageAffinityRouter.stage == "generator"
    assert conversation_router.ConversationAffinityRouter.stage == "compressor"
