"""Sentence-transformers embeddings: batched, L2-normalised float32 (cosine = inner product)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Embedder:
    """Wraps a SentenceTransformer; the import of sentence-transformers happens in `load`."""

    def __init__(self, model, batch_size: int = 64) -> None:
        self._model = model
        self.batch_size = batch_size

    @classmethod
    def load(cls, model_path: str, device: str = "cpu", batch_size: int = 64) -> Embedder:
        """Load a local sentence-transformers folder (or hub id, where a hub is reachable)."""
        from sentence_transformers import SentenceTransformer

        return cls(SentenceTransformer(model_path, device=device), batch_size=batch_size)

    @property
    def dimension(self) -> int:
        return int(self._model.get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        """Embed `texts` into an (n, dimension) float32 array of unit vectors."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character offsets of the embedder's own tokens in `text` (for chunk sizing)."""
        encoded = self._model.tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return [tuple(span) for span in encoded["offset_mapping"]]

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens the model reads of `texts`, special tokens included, each cut at the
        model's input length as `encode` cuts it."""
        limit = int(getattr(self._model, "max_seq_length", 0) or 0)
        counts = [len(ids) for ids in self._model.tokenizer(list(texts))["input_ids"]]
        return sum(min(count, limit) if limit else count for count in counts)
