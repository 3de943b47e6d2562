"""Which generator replica should take a request, so that prompts sharing passages meet the
KV blocks an earlier prompt left there.

vLLM's prefix cache is per replica. Requests whose prompts open alike (the same system
prompt, then the same first passage) should go where that prefix was prefilled before.
The key is the request's first passage (`GenerationRequest.routing_key`), and each key
has a preferred replica by rendezvous hashing (highest random weight): every router
computes the same order from the key and the replica ids alone, with no shared state to
keep, lose or wait on, and when a replica goes only the keys it held move.

Affinity is bounded by load: the preferred replica takes the request only while its queue
is at most `max_queue_gap` longer than the shortest one known; else the next in the key's
order that is. A hot passage can then never pin all traffic to one replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence


def rendezvous_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """`replica_ids` in `key`'s order of preference (the same for every caller)."""
    return sorted(replica_ids, key=lambda replica: _weight(key, replica), reverse=True)


def bounded_choice(
    order: Sequence[str], queue_lengths: Mapping[str, int | None], max_queue_gap: float | None
) -> str:
    """The first replica in `order` whose queue is within `max_queue_gap` of the shortest
    known queue. An unknown queue length (not probed yet) does not disqualify a replica;
    None for `max_queue_gap` means affinity always wins."""
    if not order:
        raise ValueError("no replica to choose from")
    known = [length for length in queue_lengths.values() if length is not None]
    if max_queue_gap is None or not known:
        return order[0]
    shortest = min(known)
    for replica in order:
        length = queue_lengths.get(replica)
        if length is None or length - shortest <= max_queue_gap:
            return replica
    return order[0]  # unreachable: the shortest queue is within any gap >= 0


def _weight(key: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
