"""LLMLingua's PromptCompressor behind the small `ChunkCompressor` protocol."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

logger = logging.getLogger(__name__)


class LLMLinguaCompressor:
    """Compresses one chunk's text with LongLLMLingua (question-aware) or LLMLingua-2."""

    def __init__(self, prompt_compressor: Any, use_llmlingua2: bool, rank_method: str) -> None:
        self._compressor = prompt_compressor
        self._use_llmlingua2 = use_llmlingua2
        self._rank_method = rank_method
        # One scorer model, one compression at a time: concurrent calls would only fight
        # over the same cores.
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls,
        model_path: str,
        device: str = "cpu",
        use_llmlingua2: bool = False,
        rank_method: str = "longllmlingua",
        tiktoken_cache_dir: str | None = None,
    ) -> LLMLinguaCompressor:
        """Load the scorer model. `tiktoken_cache_dir` must hold cl100k_base when offline."""
        if tiktoken_cache_dir:
            # PromptCompressor's constructor asks tiktoken for cl100k_base; point it at the
            # prepared offline copy instead of the network.
            os.environ.setdefault("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir)
        from llmlingua import PromptCompressor

        compressor = PromptCompressor(
            model_name=model_path, device_map=device, use_llmlingua2=use_llmlingua2
        )
        return cls(compressor, use_llmlingua2, rank_method)

    def compress_chunk(self, question: str, text: str, rate: float) -> str:
        """Return `text` compressed to about `rate` of its tokens."""
        with self._lock:
            return self._compress(question, text, rate)

    def _compress(self, question: str, text: str, rate: float) -> str:
        if self._use_llmlingua2:
            result = self._compressor.compress_prompt(
                [text], rate=rate, force_tokens=["\n", "?", "."], drop_consecutive=True
            )
        else:
            result = self._compressor.compress_prompt(
                [text],
                question=question,
                rate=rate,
                rank_method=self._rank_method,
                use_context_level_filter=False,
                condition_in_question="after_condition",
                condition_compare=True,
                concate_question=False,
            )
        return str(result["compressed_prompt"])
