"""A Ray Serve request router that sends calls with one key to one replica, bounded by load
(generation.routing): the base of the generator's passage router and the compressor's
conversation router, which differ only in the key they read from a call.

It keeps no state beyond Serve's own queue-length cache: no actor to reach, so a lost node
cannot hang a call in routing; a lost replica moves only the keys it held. It counts where
each keyed call went (deployments.metrics.affinity_calls_counter): a call moved off its
key's replica is a cache miss the load bound chose.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from deployments.metrics import affinity_calls_counter
from generation.routing import bounded_choice, rendezvous_order


class AffinityRouter(FIFOMixin, LocalityMixin, MultiplexMixin, RequestRouter):
    stage = ""  # the stage whose replicas it picks, as the routed-calls counter names it

    def initialize_state(self, max_queue_gap: float | None = 2.0) -> None:
        self._max_queue_gap = max_queue_gap
        self._routed_calls = affinity_calls_counter()

    def routing_key(self, pending_request: PendingRequest | None) -> str:
        """The call's key, "" for a call that carries none (any replica may take it)."""
        raise NotImplementedError

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Ranks for Serve to try in turn: the key's replica within the load bound, then
        the others in the key's order. Without a key, one rank of all (the least loaded
        that accepts wins)."""
        key = self.routing_key(pending_request)
        if not key or len(candidate_replicas) < 2:
            return [list(candidate_replicas)]
        by_id = {replica.replica_id.to_full_id_str(): replica for replica in candidate_replicas}
        order = rendezvous_order(key, list(by_id))
        cache = self._replica_queue_len_cache
        queues = {name: cache.get(replica.replica_id) for name, replica in by_id.items()}
        first = bounded_choice(order, queues, self._max_queue_gap)
        return [[by_id[first]], [by_id[name] for name in order if name != first]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        """Count a keyed call that had a choice of replicas: kept on its key's or moved."""
        key = self.routing_key(pending_request)
        replicas = [replica.to_full_id_str() for replica in self.curr_replicas]
        if not key or len(replicas) < 2:
            return
        kept = replica_id.to_full_id_str() == rendezvous_order(key, replicas)[0]
        self._routed_calls.inc(tags={"stage": self.stage, "outcome": "kept" if kept else "moved"})


def call_argument(pending_request: PendingRequest, position: int, name: str) -> Any:
    """A handle call's argument, passed by position or by keyword (None where absent), so
    that a call made with keywords keeps its key."""
    if len(pending_request.args) > position:
        return pending_request.args[position]
    return (pending_request.kwargs or {}).get(name)
