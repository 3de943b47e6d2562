"""A compression method that only the tests register: the first sentence of each chunk.

It shows what adding a method takes: one `apply`, one cost, one `register` call, and no
other product file (the schema, the config, the preparer and the cost decision read the
registry). Registered for one test at a time through `registered_lead_method()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prepare.context import ContextChunk
from prepare.methods import CompressionInput, CompressionMethodSpec, register, unregister

LEAD = "lead"


def _first_sentences(given: CompressionInput) -> list[ContextChunk]:
    return [chunk.with_text(chunk.sentences[0], chunk.sentences[:1]) for chunk in given.chunks]


LEAD_METHOD = CompressionMethodSpec(
    LEAD,
    "The first sentence of each chunk (a test method).",
    apply=_first_sentences,
    # As cheap per token as sentence selection, with no per-chunk overhead.
    cost_ms=lambda model, size: model.sentences.ms_per_token * size.tokens_before,
    needs_sentence_embeddings=True,
)


@contextlib.contextmanager
def registered_lead_method() -> Iterator[CompressionMethodSpec]:
    register(LEAD_METHOD)
    try:
        yield LEAD_METHOD
    finally:
        unregister(LEAD)
