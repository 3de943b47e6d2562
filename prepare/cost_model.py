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
retrieved (`prepare.methods.decide`; each method states its own cost from these terms).
The coefficients are fitted from the latency lab's context sweep (`python -m
bench.context_sweep`), per generator and machine, and set in serve_config.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """The fitted terms: generator prefill, and the own time of each compression component
    (sentence selection, LLMLingua) that the registered methods combine."""

    prefill: PrefillCost
    sentences: CompressorCost
    llmlingua: CompressorCost

    def saving_ms(self, other_uncached_tokens: int, tokens_before: int, tokens_after: int) -> float:
        """Predicted prefill time saved by sending `tokens_after` context tokens, not all."""
        return self.prefill.predict_ms(
            other_uncached_tokens + tokens_before
        ) - self.prefill.predict_ms(other_uncached_tokens + tokens_after)
