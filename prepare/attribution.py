"""Attribute each sentence of a finished answer to the source sentence that supports it.

Small models do not write reliable citations, so they are computed: every answer sentence is
scored against every source sentence, `(1 - w) * cosine + w * lexical`, where cosine is
between sentence embeddings (the index's stored ones where the source text is unchanged) and
lexical is the fraction of the answer sentence's content words found in the source sentence.
A sentence whose model-written marker cites a given source is attributed within that source
first, with half the usual threshold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.answer_text import cited_ids
from pipeline.messages import Citation, PromptSource
from retrieval.sentences import split_sentences

# Texts -> unit vectors, one row per text (Embedder.encode).
Embed = Callable[[Sequence[str]], np.ndarray]

_WORD = re.compile(r"[^\W_]+")
_STOPWORDS = frozenset({
    "a", "an", "the", "and", "or", "but", "if", "then", "so", "of", "to", "in", "on", "at", "by",
    "for", "with", "from", "into", "onto", "as", "about", "is", "are", "was", "were", "be",
    "been", "being", "am", "do", "does", "did", "has", "have", "had", "it", "its", "this", "that",
    "these", "those", "there", "here", "what", "which", "who", "whom", "whose", "when", "where",
    "why", "how", "than", "too", "very", "can", "could", "will", "would", "should", "may",
    "might", "must", "shall", "not", "no", "nor", "i", "you", "he", "she", "we", "they", "me",
    "him", "her", "us", "them", "my", "your", "his", "our", "their", "also", "just", "only",
    "such", "each", "any", "all", "both", "some", "more", "most", "other", "same", "own", "up",
    "down", "out", "over", "under", "again", "further", "once"
})  # fmt: skip


@dataclass(frozen=True)
class AttributionOptions:
    """How sure an attribution must be, and how many citations a sentence may get."""

    # The least combined score a citation needs (half of it within a source the model cited).
    min_score: float = 0.45
    # w in (1 - w) * cosine + w * lexical.
    lexical_weight: float = 0.5
    max_citations_per_sentence: int = 1
    # Answer sentences with fewer letters and digits (markers aside) get no citation.
    min_answer_chars: int = 3

    def __post_init__(self) -> None:
        if not 0.0 <= self.lexical_weight <= 1.0:
            raise ValueError("lexical_weight must be between 0 and 1")
        if self.max_citations_per_sentence < 1:
            raise ValueError("max_citations_per_sentence must be at least 1")
        if self.min_answer_chars < 0:
            raise ValueError("min_answer_chars must not be negative")


@dataclass
class _AnswerSentence:
    start: int
    end: int
    text: str  # without markers
    cited: set[str]  # source ids the model's own valid markers cite


class Attributor:
    """Computes citations for an answer from the sources its prompt showed."""

    def __init__(self, embed: Embed, options: AttributionOptions | None = None) -> None:
        self._embed = embed
        self.options = options or AttributionOptions()

    def attribute(
        self,
        answer: str,
        sources: Sequence[PromptSource],
        known_embeddings: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[Citation, ...]:
        """Citations of `answer`'s sentences, in answer order, each naming one of `sources`.

        `known_embeddings` maps sentence texts to unit vectors already computed (the index's,
        `SentenceStore.embeddings_of`); every other sentence is embedded in one `embed` call.
        """
        answer_sentences = self._answer_sentences(answer, [s.chunk_id for s in sources])
        source_of: list[int] = []  # source sentence -> index into `sources`
        spans: list[tuple[int, int]] = []
        texts: list[str] = []
        for position, source in enumerate(sources):
            for start, end in split_sentences(source.text):
                source_of.append(position)
                spans.append((start, end))
                texts.append(source.text[start:end])
        if not answer_sentences or not texts:
            return ()

        answer_vectors, source_vectors = self._vectors(
            [s.text for s in answer_sentences], texts, known_embeddings or {}
        )
        cosine = np.clip(answer_vectors @ source_vectors.T, 0.0, 1.0)
        weight = self.options.lexical_weight
        scores = (1.0 - weight) * cosine + weight * _lexical_overlap(
            [s.text for s in answer_sentences], texts
        )

        source_ids = np.array([sources[p].chunk_id for p in source_of], dtype=object)
        citations: list[Citation] = []
        for row, sentence in enumerate(answer_sentences):
            for column in self._best(scores[row], source_ids, sentence.cited):
                start, end = spans[column]
                citations.append(
                    Citation(
                        answer_start=sentence.start,
                        answer_end=sentence.end,
                        source_id=sources[source_of[column]].chunk_id,
                        source_start=start,
                        source_end=end,
                        score=round(float(scores[row, column]), 4),
                    )
                )
        return tuple(citations)

    def _answer_sentences(self, answer: str, source_ids: list[str]) -> list[_AnswerSentence]:
        """The answer's sentences worth attributing; a marker standing alone after a sentence
        (`... blocks. [kv#0]`) counts as that sentence's."""
        markers = cited_ids(answer, source_ids)
        sentences: list[_AnswerSentence] = []
        for start, end in split_sentences(answer):
            inside = [m for m in markers if start <= m[0] < end]
            pieces, at = [], start
            for marker_start, marker_end, _ in inside:
                pieces.append(answer[at:marker_start])
                at = max(at, marker_end)
            pieces.append(answer[at:end])
            text = " ".join(" ".join(pieces).split())
            cited = {source_id for _, _, source_id in inside}
            if sum(char.isalnum() for char in text) >= max(self.options.min_answer_chars, 1):
                sentences.append(_AnswerSentence(start, end, text, cited))
            elif sentences and cited:
                sentences[-1].cited |= cited
        return sentences

    def _vectors(
        self,
        answer_texts: list[str],
        source_texts: list[str],
        known: Mapping[str, np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray]:
        missing = list(dict.fromkeys(t for t in [*answer_texts, *source_texts] if t not in known))
        embedded: dict[str, np.ndarray] = {}
        if missing:
            vectors = np.asarray(self._embed(missing), dtype=np.float32)
            if vectors.shape[0] != len(missing):
                raise ValueError(f"embed returned {vectors.shape[0]} rows for {len(missing)} texts")
            embedded = dict(zip(missing, vectors, strict=True))

        def matrix(texts: list[str]) -> np.ndarray:
            rows = [known[t] if t in known else embedded[t] for t in texts]
            return np.asarray(np.stack(rows), dtype=np.float32)

        return matrix(answer_texts), matrix(source_texts)

    def _best(self, scores: np.ndarray, source_ids: np.ndarray, cited: set[str]) -> list[int]:
        """Columns of the best source sentences for one answer sentence, best first."""
        limit = self.options.max_citations_per_sentence
        order = np.argsort(-scores, kind="stable")
        if cited:
            within = order[np.isin(source_ids[order], list(cited))]
            chosen = within[scores[within] >= self.options.min_score / 2][:limit]
            if chosen.size:
                return chosen.tolist()
        return order[scores[order] >= self.options.min_score][:limit].tolist()


def content_words(text: str) -> set[str]:
    """Lowercased words and numbers of `text` without stopwords, a plural `s` folded away."""
    words: set[str] = set()
    for word in _WORD.findall(text.lower()):
        if word in _STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        words.add(word)
    return words


def _lexical_overlap(answer_texts: list[str], source_texts: list[str]) -> np.ndarray:
    """(answers, sources): the fraction of each answer text's content words in each source."""
    answer_words = [content_words(t) for t in answer_texts]
    vocabulary = {w: i for i, w in enumerate(sorted(set[str]().union(*answer_words)))}
    if not vocabulary:
        return np.zeros((len(answer_texts), len(source_texts)), dtype=np.float32)
    in_answer = np.zeros((len(answer_texts), len(vocabulary)), dtype=np.float32)
    for row, words in enumerate(answer_words):
        in_answer[row, [vocabulary[w] for w in words]] = 1.0
    in_source = np.zeros((len(source_texts), len(vocabulary)), dtype=np.float32)
    for row, text in enumerate(source_texts):
        columns = [vocabulary[w] for w in content_words(text) if w in vocabulary]
        in_source[row, columns] = 1.0
    counts = np.maximum(in_answer.sum(axis=1, keepdims=True), 1.0)
    return (in_answer @ in_source.T) / counts
