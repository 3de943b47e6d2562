"""Fakes shared by the index-building tests of this folder (test_retrieval_build,
test_retrieval_incremental, test_retrieval_lexical, test_retrieval_sentence_store).

Named retrieval_fakes, not fakes: the test folders are not packages, so each folder's helper
module is imported by its bare name and a shared name could clash with another folder's.

The embedder is faked where a test is about chunking, sentence-row bookkeeping and index
files, not about embedding quality; the real sentence-transformers embedder is exercised by
the integration tests."""

from __future__ import annotations

import hashlib
import re

import numpy as np

DIMENSION = 8


class HashEmbedder:
    """Deterministic unit vectors from a hash of the text; whitespace tokens. Records the
    texts of every `encode` call, so a test can see what was (re-)embedded."""

    dimension = DIMENSION

    def __init__(self) -> None:
        self.encode_calls: list[list[str]] = []

    @staticmethod
    def vector(text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        vector = np.random.default_rng(seed).standard_normal(DIMENSION).astype(np.float32)
        return vector / np.linalg.norm(vector)

    def encode(self, texts, show_progress: bool = False) -> np.ndarray:
        self.encode_calls.append(list(texts))
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        return np.stack([self.vector(t) for t in texts])

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in re.finditer(r"\S+", text)]
