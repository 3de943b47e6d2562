"""A BM25 index over the chunk texts (bm25s), saved in the dense index's folder.

Rows are the FAISS index's rows: chunk i of `chunks.jsonl` is document i here, so a lexical
hit is turned into a RetrievedChunk exactly as a dense one is. Text is tokenized by bm25s's
own tokenizer: lower case, words of two or more letters or digits, English stopwords removed,
no stemming (PyStemmer is not a dependency).

The index lives in `<index folder>/lexical/`; `retrieval.build` writes it in the same build as
the FAISS index and records `describe()` under `extra.lexical` in the manifest, so the index
version covers it. Indexes built before it existed have no such entry (`has_lexical` False).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.index import Manifest, SearchHit

logger = logging.getLogger(__name__)

LEXICAL_DIR = "lexical"
SETTINGS_FILE = "lexical.json"
MANIFEST_KEY = "lexical"


class LexicalIndexMissing(ValueError):
    """Lexical or hybrid retrieval was asked of an index built without a lexical part."""


@dataclass(frozen=True)
class LexicalParams:
    """BM25 and tokenizer settings; the defaults are bm25s's (Lucene's BM25, k1 1.5, b 0.75)."""

    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75
    stopwords: str = "en"
    lower: bool = True


def has_lexical(manifest: Manifest) -> bool:
    """Whether the index this manifest describes was built with a lexical part."""
    return MANIFEST_KEY in manifest.extra


class LexicalIndex:
    """BM25 scores of every chunk, searched one query at a time."""

    def __init__(self, bm25: Any, params: LexicalParams, num_rows: int) -> None:
        self._bm25 = bm25
        self.params = params
        self.num_rows = num_rows

    @classmethod
    def build(cls, texts: Sequence[str], params: LexicalParams | None = None) -> LexicalIndex:
        """Tokenize and index `texts` (one per row, in row order)."""
        import bm25s

        params = params or LexicalParams()
        if not texts:
            raise ValueError("a lexical index needs at least one text")
        bm25 = bm25s.BM25(method=params.method, k1=params.k1, b=params.b)
        bm25.index(_tokenize(list(texts), params), show_progress=False)
        return cls(bm25, params, len(texts))

    def save(self, directory: Path) -> None:
        """Write the index into `<directory>/lexical/`."""
        folder = Path(directory) / LEXICAL_DIR
        self._bm25.save(str(folder), show_progress=False)
        settings = asdict(self.params) | {"num_rows": self.num_rows}
        (folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=2))

    @classmethod
    def load(cls, directory: Path) -> LexicalIndex:
        """Read the lexical part of the index in `directory`; LexicalIndexMissing if absent."""
        import bm25s

        folder = Path(directory) / LEXICAL_DIR
        if not (folder / SETTINGS_FILE).is_file():
            raise LexicalIndexMissing(
                f"{directory} has no lexical index: rebuild it with `python -m retrieval.build`"
            )
        settings = json.loads((folder / SETTINGS_FILE).read_text())
        num_rows = int(settings.pop("num_rows"))
        bm25 = bm25s.BM25.load(str(folder), show_progress=False)
        if int(bm25.scores["num_docs"]) != num_rows:
            raise ValueError(f"{folder}: {bm25.scores['num_docs']} documents, not {num_rows}")
        return cls(bm25, LexicalParams(**settings), num_rows)

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this index (its settings and sizes)."""
        import bm25s

        return {
            "kind": "bm25",
            "library": f"bm25s=={bm25s.__version__}",
            "folder": LEXICAL_DIR,
            "num_rows": self.num_rows,
            "vocabulary_size": len(self._bm25.vocab_dict),
            **asdict(self.params),
        }

    def tokenize(self, query: str) -> list[str]:
        """The query's tokens as the index sees them (stopwords gone)."""
        return _tokenize([query], self.params)[0]

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        """The up to `top_k` rows with a positive BM25 score for `query`, best first (ties:
        lower row first); none when no query term is in the vocabulary."""
        token_ids = self._bm25.get_tokens_ids(self.tokenize(query))
        if not token_ids or top_k < 1:
            return []
        scores = np.asarray(self._bm25.get_scores_from_ids(token_ids))
        matching = np.flatnonzero(scores > 0)
        if matching.size > top_k:
            # The top_k-th best score, then every row at least that good (ties kept).
            threshold = np.partition(scores[matching], matching.size - top_k)[-top_k]
            matching = matching[scores[matching] >= threshold]
        order = np.lexsort((matching, -scores[matching]))[:top_k]
        return [SearchHit(int(matching[i]), float(scores[matching[i]])) for i in order]


def _tokenize(texts: list[str], params: LexicalParams) -> list[list[str]]:
    import bm25s

    tokens: list[list[str]] = bm25s.tokenize(
        texts,
        lower=params.lower,
        stopwords=params.stopwords,
        return_ids=False,
        show_progress=False,
    )
    return tokens
