"""Does compressing this request's context pay for itself? A cost model and the `auto` policy.

Compression removes context tokens the generator would otherwise prefill, but costs time of
its own before prefill can start. On a fast generator, or with a scorer model as large as
the generator, it costs more than it saves (docs/benchmarks.md measures both). The model:

- generator prefill of `n` uncached prompt tokens:
  `prefill_ms(n) = ms_per_token * n + ms_per_token_squared * n**2` (attention grows with n);
  the static system prompt is in the prefix cache and is not counted;
- a compression method's own time: `ms_per_chunk * chunks + ms_per_token * context tokens`;
- the saving: `prefill_ms(u + before) - prefill_ms(u + after)`, where `u` is the uncached
  tokens outside the context (question, chat template) and `after` the tokens the plan
  keeps.

Policy `always` applies the requested method; `auto` applies it only when the predicted
saving exceeds the predicted cost, per request, and otherwise sends the context as
retrieved. The coefficients are fitted from the latency lab's context sweep
(`python -m bench.context_sweep`), per generator and machine, and set in serve_config.yaml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.messages import CompressionDecision


@dataclass(frozen=True)
class PrefillCost:
    """Generator prefill time as a function of uncached prompt tokens."""

    ms_per_token: float
    ms_per_token_squared: float = 0.0

    def predict_ms(self, tokens: int) -> float:
        return self.ms_per_token * tokens + self.ms_per_token_squared * tokens * tokens


@dataclass(frozen=True)
class CompressorCost:
    """One compression method's own time: a per-chunk overhead plus a per-token cost."""

    ms_per_token: float
    ms_per_chunk: float = 0.0

    def predict_ms(self, tokens: int, chunks: int) -> float:
        return self.ms_per_chunk * chunks + self.ms_per_token * tokens


@dataclass(frozen=True)
class CompressionCostModel:
    prefill: PrefillCost
    sentences: CompressorCost
    llmlingua: CompressorCost

    def cost_ms(self, method: str, tokens_before: int, chunks: int, prefilter_tokens: int) -> float:
        """Predicted time of `method` on a context of `tokens_before` tokens in `chunks`.

        `prefilter_tokens` is what sentence selection keeps before LLMLingua runs, for
        `sentences+llmlingua`.
        """
        if method == "none":
            return 0.0
        if method == "sentences":
            return self.sentences.predict_ms(tokens_before, chunks)
        if method == "llmlingua":
            return self.llmlingua.predict_ms(tokens_before, chunks)
        if method == "sentences+llmlingua":
            return self.sentences.predict_ms(tokens_before, chunks) + self.llmlingua.predict_ms(
                prefilter_tokens, chunks
            )
        raise ValueError(f"unknown compression method {method!r}")

    def saving_ms(self, other_uncached_tokens: int, tokens_before: int, tokens_after: int) -> float:
        """Predicted prefill time saved by sending `tokens_after` context tokens, not all."""
        return self.prefill.predict_ms(
            other_uncached_tokens + tokens_before
        ) - self.prefill.predict_ms(other_uncached_tokens + tokens_after)

    def decide(
        self,
        method: str,
        tokens_before: int,
        tokens_after: int,
        chunks: int,
        other_uncached_tokens: int,
        prefilter_rate: float = 0.5,
    ) -> CompressionDecision:
        """Compress only when the predicted prefill saving exceeds the predicted cost."""
        prefilter_tokens = max(tokens_after, math.ceil(prefilter_rate * tokens_before))
        cost = self.cost_ms(method, tokens_before, chunks, prefilter_tokens)
        saving = self.saving_ms(other_uncached_tokens, tokens_before, tokens_after)
        return CompressionDecision(
            compress=method != "none" and saving > cost,
            predicted_saving_ms=round(saving, 1),
            predicted_cost_ms=round(cost, 1),
        )
