"""Answer and retrieval metrics for SQuAD-style evaluation.

`exact_match` and `f1` follow the official SQuAD v1.1 evaluation script: both sides are
normalised (lower-cased, punctuation dropped, the articles a/an/the dropped, whitespace
collapsed) and the best score over the gold answers counts. The rest measure the stages in
between: whether a gold answer is still in the (compressed) context, whether retrieval found
the gold paragraph, and whether an answer cites only sources it was given.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

from retrieval.sentences import split_sentences

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# One bracket group: `[doc#3]`, `[a#0, b#1]`; not a Markdown link `[text](url)`.
_CITATION_GROUP = re.compile(r"\[([^\[\]\n]+)\](?!\()")
_CITATION_SEPARATORS = re.compile(r"[,;]")
_CHUNK_SUFFIX = re.compile(r"#\d+$")


def normalize_answer(text: str) -> str:
    """The SQuAD v1.1 normal form: lower case, no punctuation, no articles, single spaces.

    The steps run in the official order; punctuation goes before articles, so "the-end"
    becomes "theend", not "end".
    """
    lowered = text.lower()
    without_punctuation = "".join(char for char in lowered if char not in _PUNCTUATION)
    without_articles = _ARTICLES.sub(" ", without_punctuation)
    return " ".join(without_articles.split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0."""
    normalized_prediction = normalize_answer(prediction)
    return max(
        float(normalized_prediction == normalize_answer(gold)) for gold in _require_golds(golds)
    )


def f1(prediction: str, golds: Iterable[str]) -> float:
    """Token-level F1 between the normalised prediction and the best-matching gold answer.

    Tokens are the whitespace-separated words of the normal form, counted with multiplicity;
    no shared token (including an empty side) scores 0.0.
    """
    prediction_tokens = normalize_answer(prediction).split()
    return max(
        _token_f1(prediction_tokens, normalize_answer(gold).split())
        for gold in _require_golds(golds)
    )


def _token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    shared = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(prediction_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _require_golds(golds: Iterable[str]) -> list[str]:
    gold_list = list(golds)
    if not gold_list:
        raise ValueError("at least one gold answer is needed to score a prediction")
    return gold_list


def answer_survives(context: str, golds: Iterable[str]) -> bool:
    """Whether any gold answer is still a substring of `context`, both sides normalised.

    A plain substring, not whole words: SQuAD spans can be parts of words ("gold" out of
    "golden"), and on SQuAD v1.1 dev this finds every question's gold in its own paragraph.
    The price is chance hits for short answers ("5" inside "1985"): about 1.3% of dev questions
    find their gold in a random other paragraph. Golds that normalise to nothing are ignored.
    """
    normalized_context = normalize_answer(context)
    return any(
        normalized_gold and normalized_gold in normalized_context
        for normalized_gold in map(normalize_answer, golds)
    )


def document_id(source_id: str) -> str:
    """The document id of a chunk id (`doc#3` -> `doc`); other ids are returned unchanged."""
    return _CHUNK_SUFFIX.sub("", source_id)


def recall_at_k(retrieved_doc_ids: Sequence[str], gold_doc_id: str, k: int | None = None) -> float:
    """1.0 if the gold document is among the first `k` retrieved (all if `k` is None), else 0.0.

    Retrieved ids may be document ids or chunk ids (`<doc id>#<n>`); a chunk counts for its
    document.
    """
    if k is not None and k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    considered = retrieved_doc_ids if k is None else retrieved_doc_ids[:k]
    return float(any(document_id(source_id) == gold_doc_id for source_id in considered))


def cited_ids(answer_text: str) -> list[str]:
    """Every id cited in square brackets, in order, repeats kept; `[a#0, b#1]` cites two."""
    citations: list[str] = []
    for group in _CITATION_GROUP.findall(answer_text):
        citations.extend(item.strip() for item in _CITATION_SEPARATORS.split(group) if item.strip())
    return citations


def citation_validity(answer_text: str, context_source_ids: Iterable[str]) -> float | None:
    """The fraction of the answer's citations that name a source the model was given.

    Ids must match exactly (a chunk id such as `doc#3`, as the prompt shows them). Any bracketed
    text counts as a citation, so `[1]` or `[see above]` count as invalid ones. None if the
    answer cites nothing.
    """
    citations = cited_ids(answer_text)
    if not citations:
        return None
    allowed = set(context_source_ids)
    return sum(citation in allowed for citation in citations) / len(citations)


# Shorter sentences ("Yes." "See above.") repeat without saying anything twice.
_REPEAT_MIN_WORDS = 4


def repeated_sentences(answer_text: str) -> int:
    """How many of the answer's sentences (as attribution splits them, of at least
    _REPEAT_MIN_WORDS words, citations left out, compared normalised) say word for word what
    an earlier one said."""
    seen: set[str] = set()
    repeats = 0
    for normalized in _long_sentences(answer_text):
        repeats += normalized in seen
        seen.add(normalized)
    return repeats


def _long_sentences(text: str) -> list[str]:
    """`text`'s sentences (as attribution splits them) of at least _REPEAT_MIN_WORDS words,
    citations left out, normalised."""
    sentences = []
    for start, end in split_sentences(text):
        normalized = normalize_answer(_CITATION_GROUP.sub(" ", text[start:end]))
        if len(normalized.split()) >= _REPEAT_MIN_WORDS:
            sentences.append(normalized)
    return sentences


_SOURCE_WORD = re.compile(r"\bsources?\b", re.IGNORECASE)


def sentences_about_sources(answer_text: str) -> int:
    """How many of the answer's sentences cite and speak of "the source(s)" themselves
    ("This is mentioned in the source [a#0].", "The sources [a] and [b] say so."): a sentence
    written to cite rather than to answer. The refusal ("The sources do not say.") cites
    nothing and is not counted."""
    count = 0
    for start, end in split_sentences(answer_text):
        sentence = answer_text[start:end]
        bare = _CITATION_GROUP.sub(" ", sentence)
        count += bare != sentence and bool(_SOURCE_WORD.search(bare))
    return count


# A sentence restates an earlier answer's when their word sets overlap this much (Jaccard):
# the same claim, a word or two changed.
RESTATE_JACCARD = 0.8


def restated_sentences(answer_text: str, earlier_answers: Iterable[str]) -> int:
    """How many of the answer's sentences say again, word for word or nearly (RESTATE_JACCARD),
    what a sentence of an earlier answer of the conversation said."""
    earlier = [set(s.split()) for text in earlier_answers for s in _long_sentences(text)]
    return sum(
        any(len(words & before) / len(words | before) >= RESTATE_JACCARD for before in earlier)
        for words in (set(s.split()) for s in _long_sentences(answer_text))
    )
