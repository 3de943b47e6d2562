"""The generator's request router: the replica that likely holds the request's first
passage (or a conversation's first turn) in its prefix cache, bounded by load
(deployments.affinity_router).

Set with `generator.request_router.kind: passage_affinity`.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest

from deployments.affinity_router import AffinityRouter, call_argument
from pipeline.messages import GenerationRequest


class PassageAffinityRouter(AffinityRouter):
    stage = "generator"

    def routing_key(self, pending_request: PendingRequest | None) -> str:
        return routing_key(pending_request)


def routing_key(pending_request: PendingRequest | None) -> str:
    """The GenerationRequest's routing key, "" when the call carries none."""
    if pending_request is None:
        return ""
    request = call_argument(pending_request, 0, "request")
    return request.routing_key if isinstance(request, GenerationRequest) else ""
