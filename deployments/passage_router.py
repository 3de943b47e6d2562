"""A Ray Serve request router for the generator: the replica that likely holds the request's
first passage in its prefix cache, bounded by load (generation.routing).

Set with `generator.request_router.kind: passage_affinity`. It keeps no state beyond Serve's
own queue-length cache: no actor to reach, so a lost node cannot hang a call in routing.
"""

from __future__ import annotations

from ray.serve.request_router import (
    FIFOMixin,
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

from generation.routing import bounded_choice, rendezvous_order
from pipeline.messages import GenerationRequest


class PassageAffinityRouter(FIFOMixin, LocalityMixin, MultiplexMixin, RequestRouter):
    def initialize_state(self, max_queue_gap: float | None = 2.0) -> None:
        self._max_queue_gap = max_queue_gap

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Ranks for Serve to try in turn: the key's replica within the load bound, then
        the others in the key's order. Without a key, one rank of all (the least loaded
        that accepts wins)."""
        key = routing_key(pending_request)
        if not key or len(candidate_replicas) < 2:
            return [list(candidate_replicas)]
        by_id = {replica.replica_id.to_full_id_str(): replica for replica in candidate_replicas}
        order = rendezvous_order(key, list(by_id))
        cache = self._replica_queue_len_cache
        queues = {name: cache.get(replica.replica_id) for name, replica in by_id.items()}
        first = bounded_choice(order, queues, self._max_queue_gap)
        return [[by_id[first]], [by_id[name] for name in order if name != first]]


def routing_key(pending_request: PendingRequest | None) -> str:
    """The GenerationRequest's routing key, "" when the call carries none."""
    if pending_request is None or not pending_request.args:
        return ""
    request = pending_request.args[0]
    return request.routing_key if isinstance(request, GenerationRequest) else ""
