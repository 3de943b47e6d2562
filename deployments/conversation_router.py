"""The compressor's request router: every question of one conversation goes to the same
compressor replica, bounded by load (deployments.affinity_router), so that the replica that
remembers how the earlier questions were sent (prepare.continuation.SentTurns, kept per
replica) prepares the follow-up, and its prompt continues the one before it.

Set with `compression.request_router.kind: conversation_affinity`. A follow-up that lands
elsewhere (load moved it, its replica was lost) goes in the plain layout: a miss costs the
cache hit, never the answer's sources.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest

from deployments.affinity_router import AffinityRouter, call_argument
from pipeline.messages import Conversation, Retrieval
from prepare.continuation import conversation_key


class ConversationAffinityRouter(AffinityRouter):
    stage = "compressor"

    def routing_key(self, pending_request: PendingRequest | None) -> str:
        return routing_key(pending_request)


def routing_key(pending_request: PendingRequest | None) -> str:
    """The conversation's key for a `prepare(conversation, retrieval, ...)` call, "" for
    any other call (attribution)."""
    if pending_request is None:
        return ""
    conversation = call_argument(pending_request, 0, "conversation")
    retrieval = call_argument(pending_request, 1, "retrieval")
    if not isinstance(conversation, Conversation) or not isinstance(retrieval, Retrieval):
        return ""
    return conversation_key(conversation, retrieval.collection)
