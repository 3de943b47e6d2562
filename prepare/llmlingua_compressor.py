"""LLMLingua's PromptCompressor behind the small `ChunkCompressor` protocol."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Literal

logger = logging.getLogger(__name__)

ScorerDType = Literal["float32", "bfloat16"]
# llmlingua 0.2.2's LLMLingua-2 path picks its token-to-word rules by a substring of the
# model's name and raises NotImplementedError, on every call, for any other name.
LLMLINGUA2_MODEL_FAMILIES = ("xlm-roberta-large", "bert-base-multilingual-cased")


@dataclass(frozen=True)
class LLMLinguaOptions:
    """Which LLMLingua scores tokens: LLMLingua-2's classifier, or LongLLMLingua
    (question-aware) or plain LLMLingua with a causal LM.

    LongLLMLingua runs one pass per chunk, its tokens conditioned on the question (scoring
    each segment twice, with and without the question, took twice the scorer time:
    docs/retired.md), over one segment sized to the chunk: LLMLingua 0.2.2
    compresses only the first (2 * length + question - segment) positions of a context
    shorter than its segment, so at its default 200 a 100-token chunk asked for rate 0.5
    kept ~75-85%; sized to the chunk, the rate holds. Segments shorter than a chunk fail
    under transformers 5 (LLMLingua slices the KV cache as tuples).
    """

    use_llmlingua2: bool = False
    rank_method: str = "longllmlingua"


class LLMLinguaCompressor:
    """Compresses one chunk's text with LongLLMLingua (question-aware) or LLMLingua-2."""

    def __init__(self, prompt_compressor: Any, options: LLMLinguaOptions) -> None:
        self._compressor = prompt_compressor
        self._options = options
        # One scorer model, one compression at a time: concurrent calls would only fight
        # over the same cores.
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls,
        model_path: str,
        options: LLMLinguaOptions = LLMLinguaOptions(),
        device: str = "cpu",
        dtype: ScorerDType = "float32",
        tiktoken_cache_dir: str | None = None,
    ) -> LLMLinguaCompressor:
        """Load the scorer model. `tiktoken_cache_dir` must hold cl100k_base when offline.

        ValueError, before anything loads, when LLMLingua-2 is asked for with a model whose
        name lacks one of `LLMLINGUA2_MODEL_FAMILIES` (it would load, then fail every call).
        """
        if options.use_llmlingua2 and not any(f in model_path for f in LLMLINGUA2_MODEL_FAMILIES):
            raise ValueError(
                f"LLMLingua-2 model {model_path!r}: llmlingua 0.2.2 supports only models whose "
                f"name contains {' or '.join(map(repr, LLMLINGUA2_MODEL_FAMILIES))}; keep that "
                "in the folder name of a local copy"
            )
        if tiktoken_cache_dir:
            # PromptCompressor's constructor asks tiktoken for cl100k_base; point it at the
            # prepared offline copy instead of the network.
            os.environ.setdefault("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir)
        import torch
        from llmlingua import PromptCompressor

        compressor = PromptCompressor(
            model_name=model_path,
            device_map=device,
            model_config={"torch_dtype": getattr(torch, dtype)},
            use_llmlingua2=options.use_llmlingua2,
        )
        return cls(compressor, options)

    def with_options(self, options: LLMLinguaOptions) -> LLMLinguaCompressor:
        """The same loaded scorer, scoring with other options."""
        return LLMLinguaCompressor(self._compressor, options)

    def compress_chunk(self, question: str, text: str, rate: float) -> str:
        """Return `text` compressed to about `rate` of its tokens."""
        with self._lock:
            return self._compress(question, text, rate)

    def _segment_for(self, text: str) -> int:
        # LLMLingua counts each context as its tokens + 2 when it splits them into segments.
        return int(self._compressor.get_token_length(text)) + 2

    def _compress(self, question: str, text: str, rate: float) -> str:
        options = self._options
        if options.use_llmlingua2:
            result = self._compressor.compress_prompt(
                [text], rate=rate, force_tokens=["\n", "?", "."], drop_consecutive=True
            )
        else:
            result = self._compressor.compress_prompt(
                [text],
                question=question,
                rate=rate,
                rank_method=options.rank_method,
                use_context_level_filter=False,
                condition_in_question="after_condition",
                condition_compare=False,
                iterative_size=self._segment_for(text),
                concate_question=False,
            )
        return str(result["compressed_prompt"])
