"""Context-length sweep: TTFT of never / always / auto compression at 512 to 4k context tokens.

    python -m bench.context_sweep --lengths 512 1024 2048 4096 --repeats 2 \\
        --method llmlingua --out bench-results/context [--paired] \\
        [--set generator.model_source=...]

Long contexts are made by retrieving as many SQuAD dev chunks as it takes (top_k is chosen
per question, offline, from the same index and embedder the service uses), so every request
carries real retrieved text of about the target length. Each request asks a different
question, so no request's context can be a prefix-cache hit on an earlier one (the cached
tokens are recorded to show it); the static system prompt is cached as in production.

Two service starts, both with `serve run`:
1. calibrate: at every length, one request with compression `none` and one with the method
   (`always`); the cost model of prepare.cost_model is fitted from them (prefill ms per
   uncached prompt token, linear plus quadratic; the method's ms per context token and per
   chunk), and written to OUT/cost_model.json and as serve_config.yaml overrides;
2. measure: the service restarted with that cost model, then at every length and repeat,
   `never`, `always` and `auto`, each on its own question.
The report says, per length, whether `auto` was within the run's noise of the faster of
`never` and `always`. TTFT here is the service's own figure (timings_ms.ttft: request received
by the ingress to first token), read from non-streaming responses; bench.latency measures it
on the client.

With --paired, the measure phase asks each question under all three policies instead (the
order rotating from one question to the next) and runs with the prefix cache off, so that
no request can reuse the KV of the same question's other requests (the system prompt is then
prefilled on every request, alike on all three sides; `auto`'s cost model still assumes it
cached). The report then adds `auto` against the per-question oracle, the faster of `never`
and `always` on that same question: which side auto picked per request, how often that was
the faster one, and auto's TTFT over the oracle's, with 95% bootstrap intervals.

Needs `python -m bench.quality prepare` (SQuAD dev and its index). Writes OUT/context.json
(every request), OUT/context.md and OUT/ttft_vs_context.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.client import QueryOutcome, post_query, with_client
from bench.labs import variant_service
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, load_squad, sample_questions
from bench.stats import (
    Interval,
    fmt_ratio,
    independent_ratio,
    median,
    one_sample,
    paired_ratio,
    sample_mean,
)
from bench.tables import markdown_table
from harness.service import ROOT
from harness.variant import first_application, parse_assignment
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost
from retrieval.models import DEFAULT_EMBEDDING_MODEL

logger = logging.getLogger(__name__)

POLICIES = ("never", "always", "auto")
# The client waits as long as the service is told to (ingress.request_timeout_s below).
REQUEST_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class SweepRequest:
    question: str
    length: int
    policy: str
    top_k: int
    phase: str
    repeat: int = 0


@dataclass
class SweepRecord:
    request: SweepRequest
    ok: bool
    error: str | None = None
    ttft_ms: float | None = None
    compress_ms: float | None = None
    retrieve_ms: float | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    context_tokens_before: int | None = None
    context_tokens_after: int | None = None
    chunks: int | None = None
    method_applied: str | None = None
    predicted_saving_ms: float | None = None
    predicted_cost_ms: float | None = None

    @property
    def uncached_prompt_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.cached_prompt_tokens is None:
            return None
        return self.prompt_tokens - self.cached_prompt_tokens

    @property
    def prefill_ms(self) -> float | None:
        """Service TTFT less retrieval and compression: queueing, prefill and one step."""
        if None in (self.ttft_ms, self.retrieve_ms, self.compress_ms):
            return None
        return float(self.ttft_ms) - float(self.retrieve_ms) - float(self.compress_ms)  # type: ignore[arg-type]


def top_k_for_length(chunk_tokens: Sequence[int], length: int) -> int:
    """Fewest leading chunks (in retrieval order) whose tokens reach `length` (all if never)."""
    total = 0
    for k, tokens in enumerate(chunk_tokens, start=1):
        total += tokens
        if total >= length:
            return k
    return max(1, len(chunk_tokens))


def plan_requests(
    questions: Sequence[str],
    lengths: Sequence[int],
    policies: Sequence[str],
    repeats: int,
    phase: str,
    top_k_of: Callable[[str, int], int],
    paired: bool = False,
) -> list[SweepRequest]:
    """One request per (repeat, length, policy), each on the next unused question.

    Policies alternate within a length so that drift over the run hits them alike. Paired,
    one question per (repeat, length) is asked under every policy, the policies' order
    rotating by one from each question to the next. Raises ValueError when there are too
    few questions.
    """
    needed = repeats * len(lengths) * (1 if paired else len(policies))
    if len(questions) < needed:
        raise ValueError(f"{needed} distinct questions needed, {len(questions)} given")
    unused = iter(questions)
    requests = []
    for repeat in range(repeats):
        for position, length in enumerate(lengths):
            if paired:
                question = next(unused)
                shift = (repeat * len(lengths) + position) % len(policies)
                asked = [(question, p) for p in [*policies[shift:], *policies[:shift]]]
            else:
                asked = [(next(unused), p) for p in policies]
            requests += [
                SweepRequest(question, length, policy, top_k_of(question, length), phase, repeat)
                for question, policy in asked
            ]
    return requests


def request_body(request: SweepRequest, method: str, rate: float, max_tokens: int) -> dict:
    compression: dict[str, Any] = {"method": "none" if request.policy == "never" else method}
    if request.policy != "never":
        compression["rate"] = rate
        compression["policy"] = request.policy
    return {
        "question": request.question,
        "top_k": request.top_k,
        "max_tokens": max_tokens,
        "compression": compression,
    }


def record_from_outcome(request: SweepRequest, outcome: QueryOutcome) -> SweepRecord:
    """The record of one request: its figures, or the error bench.client recorded."""
    reply = outcome.reply
    if reply is None:
        return SweepRecord(request, ok=False, error=outcome.error)
    usage, timings, decision = reply.usage, reply.timings_ms, reply.compression_decision
    return SweepRecord(
        request,
        ok=True,
        ttft_ms=timings.ttft,
        compress_ms=timings.compress,
        retrieve_ms=timings.retrieve,
        prompt_tokens=usage.prompt_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
        context_tokens_before=usage.context_tokens_before,
        context_tokens_after=usage.context_tokens_after,
        chunks=len(reply.sources),
        method_applied=reply.compression_method,
        predicted_saving_ms=decision.predicted_saving_ms if decision else None,
        predicted_cost_ms=decision.predicted_cost_ms if decision else None,
    )


# --- the cost model fit ----------------------------------------------------------------------


def fit_prefill(records: Sequence[SweepRecord]) -> PrefillCost:
    """Least squares of prefill ms on (n, n^2, 1) over uncached prompt tokens n; the
    intercept (one decode step, hops) is fitted and dropped, negative terms are clamped."""
    points = [
        (r.uncached_prompt_tokens, r.prefill_ms)
        for r in records
        if r.ok and r.uncached_prompt_tokens is not None and r.prefill_ms is not None
    ]
    if len(points) < 3:
        raise ValueError(
            f"at least 3 measured requests are needed to fit prefill, got {len(points)}"
        )
    n = np.array([p[0] for p in points], dtype=float)
    ms = np.array([p[1] for p in points], dtype=float)
    design = np.stack([n, n * n, np.ones_like(n)], axis=1)
    (linear, quadratic, _), *_ = np.linalg.lstsq(design, ms, rcond=None)
    if quadratic < 0:  # fall back to a line through the points
        design = np.stack([n, np.ones_like(n)], axis=1)
        (linear, _), *_ = np.linalg.lstsq(design, ms, rcond=None)
        quadratic = 0.0
    return PrefillCost(max(0.0, float(linear)), max(0.0, float(quadratic)))


def fit_compressor(records: Sequence[SweepRecord]) -> CompressorCost:
    """Least squares of compress ms on (context tokens, chunks) over the compressed requests."""
    points = [
        (r.context_tokens_before, r.chunks, r.compress_ms)
        for r in records
        if r.ok
        and r.method_applied not in (None, "none")
        and r.context_tokens_before
        and r.chunks
        and r.compress_ms is not None
    ]
    if len(points) < 2:
        raise ValueError(f"at least 2 compressed requests are needed, got {len(points)}")
    design = np.array([[p[0], p[1]] for p in points], dtype=float)
    ms = np.array([p[2] for p in points], dtype=float)
    (per_token, per_chunk), *_ = np.linalg.lstsq(design, ms, rcond=None)
    if per_chunk < 0 or per_token < 0:  # one coefficient: the mean ms per token
        return CompressorCost(float(ms.sum() / design[:, 0].sum()))
    return CompressorCost(float(per_token), float(per_chunk))


def cost_model_overrides(model: CompressionCostModel, method: str) -> dict[str, float]:
    """Dotted serve_config overrides (harness.variant) that set the fitted coefficients."""
    compressor = model.sentences if method == "sentences" else model.llmlingua
    name = "sentences" if method == "sentences" else "llmlingua"
    return {
        "compression.cost_model.prefill_ms_per_token": round(model.prefill.ms_per_token, 4),
        "compression.cost_model.prefill_ms_per_token_squared": round(
            model.prefill.ms_per_token_squared, 7
        ),
        f"compression.cost_model.{name}.ms_per_token": round(compressor.ms_per_token, 4),
        f"compression.cost_model.{name}.ms_per_chunk": round(compressor.ms_per_chunk, 2),
    }


# --- the report --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    length: int
    policy: str
    requests: int
    ttft_ms: float | None
    compress_ms: float | None
    tokens_before: float | None
    tokens_after: float | None
    cached_tokens: float | None
    compressed: int


def summarize(records: Sequence[SweepRecord]) -> list[Cell]:
    """Medians per (length, policy) over the measured phase's successful requests."""
    cells = []
    for length in sorted({r.request.length for r in records}):
        for policy in POLICIES:
            group = [
                r
                for r in records
                if r.ok and r.request.length == length and r.request.policy == policy
            ]
            if not group:
                continue
            cells.append(
                Cell(
                    length,
                    policy,
                    len(group),
                    median([r.ttft_ms for r in group]),
                    median([r.compress_ms for r in group]),
                    median([r.context_tokens_before for r in group]),
                    median([r.context_tokens_after for r in group]),
                    median([r.cached_prompt_tokens for r in group]),
                    sum(1 for r in group if r.method_applied not in (None, "none")),
                )
            )
    return cells


def faster_policy(samples: Mapping[str, Sequence[float]]) -> tuple[str, Sequence[float]]:
    """The policy with the lowest median TTFT (the first on a tie; empty samples last)."""

    def key(policy: str) -> float:
        middle = median(samples[policy])
        return math.inf if middle is None else middle

    name = min(samples, key=key)
    return name, samples[name]


def auto_verdicts(records: Sequence[SweepRecord]) -> dict[int, str]:
    """Per length: auto's median TTFT over that of the faster of never and always, with a
    95% interval (independent requests: different questions per policy unless --paired,
    whose per-question oracle table is the sharper test); a ratio whose interval holds 1 is
    "no detectable difference", whatever its size."""
    measured = [r for r in records if r.ok and r.request.phase == "measure"]
    verdicts = {}
    for length in sorted({r.request.length for r in measured}):
        samples = {
            policy: [r.ttft_ms for r in measured if r.request.length == length
                     and r.request.policy == policy and r.ttft_ms is not None]
            for policy in POLICIES
        }  # fmt: skip
        if not all(samples.values()):
            continue
        best, best_ttfts = faster_policy({p: samples[p] for p in ("never", "always")})
        ratio = independent_ratio(samples["auto"], best_ttfts)
        n = min(len(samples["auto"]), len(best_ttfts))
        verdicts[length] = f"auto / `{best}` (the faster fixed policy): {fmt_ratio(ratio, n)}"
    return verdicts


# --- auto against the per-question oracle (--paired) ------------------------------------------


@dataclass(frozen=True)
class OracleRow:
    """One measured question's TTFT under each policy, and which side `auto` took."""

    length: int
    question: str
    never_ms: float
    always_ms: float
    auto_ms: float
    auto_compressed: bool

    @property
    def faster(self) -> str:
        """The faster fixed policy on this question (`never` on a tie)."""
        return "always" if self.always_ms < self.never_ms else "never"

    @property
    def auto_choice(self) -> str:
        return "always" if self.auto_compressed else "never"

    @property
    def right(self) -> bool:
        return self.auto_choice == self.faster

    @property
    def oracle_ms(self) -> float:
        return min(self.never_ms, self.always_ms)


def oracle_rows(records: Sequence[SweepRecord]) -> list[OracleRow]:
    """The measured questions asked under all three policies (successfully), in plan order."""
    runs: dict[tuple[int, str], dict[str, SweepRecord]] = {}
    for r in records:
        if r.ok and r.request.phase == "measure" and r.ttft_ms is not None:
            runs.setdefault((r.request.length, r.request.question), {})[r.request.policy] = r
    return [
        OracleRow(
            length,
            question,
            float(by["never"].ttft_ms),  # type: ignore[arg-type]
            float(by["always"].ttft_ms),  # type: ignore[arg-type]
            float(by["auto"].ttft_ms),  # type: ignore[arg-type]
            by["auto"].method_applied not in (None, "none"),
        )
        for (length, question), by in runs.items()
        if all(policy in by for policy in POLICIES)
    ]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score 95% interval of a proportion: unlike the bootstrap, not [1, 1] when
    every trial succeeded."""
    if n <= 0:
        raise ValueError("a proportion needs at least one trial")
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (share * (1 - share) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class OracleSummary:
    """auto against the oracle over the questions of one length (length None: all of them).

    right_share: the 0/1 right picks' mean with its bootstrap interval (None below 2
    questions); always_over_never and auto_over_oracle: median per-question TTFT ratios with
    bootstrap intervals (bench.stats.paired_ratio); total_ratio: auto's summed TTFT over
    the oracle's."""

    length: int | None
    questions: int
    always_faster: int
    auto_compressed: int
    right: int
    right_share: Interval | None
    right_wilson: tuple[float, float]
    always_over_never: Interval | None
    auto_over_oracle: Interval | None
    total_ratio: float


def summarize_oracle(rows: Sequence[OracleRow]) -> list[OracleSummary]:
    """One summary per length, then one over every question (when there is more than one
    length)."""
    lengths = sorted({r.length for r in rows})
    groups: list[tuple[int | None, list[OracleRow]]] = [
        (length, [r for r in rows if r.length == length]) for length in lengths
    ]
    if len(lengths) > 1:
        groups.append((None, list(rows)))
    summaries = []
    for length, group in groups:
        right = sum(r.right for r in group)
        summaries.append(
            OracleSummary(
                length,
                len(group),
                sum(r.faster == "always" for r in group),
                sum(r.auto_compressed for r in group),
                right,
                one_sample([float(r.right) for r in group], stat=sample_mean),
                wilson_interval(right, len(group)),
                paired_ratio((r.always_ms, r.never_ms) for r in group),
                paired_ratio((r.auto_ms, r.oracle_ms) for r in group),
                sum(r.auto_ms for r in group) / sum(r.oracle_ms for r in group),
            )
        )
    return summaries


def render_oracle(rows: Sequence[OracleRow], summaries: Sequence[OracleSummary]) -> str:
    lines = [
        "auto against the per-question oracle (the faster of never and always on the same "
        "question):",
        "",
        markdown_table(
            [
                "target length",
                "question",
                "never ms",
                "always ms",
                "faster",
                "auto took",
                "right",
                "auto ms",
                "auto / oracle",
            ],
            [
                [
                    f"{r.length:,}",
                    r.question,
                    _fmt(r.never_ms),
                    _fmt(r.always_ms),
                    r.faster,
                    r.auto_choice,
                    "yes" if r.right else "NO",
                    _fmt(r.auto_ms),
                    f"{r.auto_ms / r.oracle_ms:.2f}x",
                ]
                for r in rows
            ],
        ),
        "",
        markdown_table(
            [
                "target length",
                "n",
                "always faster",
                "auto compressed",
                "right picks [bootstrap; Wilson]",
                "always / never",
                "auto / oracle (median per question)",
                "auto / oracle (total)",
            ],
            [
                [
                    "all" if s.length is None else f"{s.length:,}",
                    s.questions,
                    f"{s.always_faster}/{s.questions}",
                    f"{s.auto_compressed}/{s.questions}",
                    f"{s.right}/{s.questions}: "
                    + ("n = 1: no interval" if s.right_share is None else s.right_share.text())
                    + f"; [{s.right_wilson[0]:.2f}, {s.right_wilson[1]:.2f}]",
                    fmt_ratio(s.always_over_never, s.questions),
                    fmt_ratio(s.auto_over_oracle, s.questions),
                    f"{s.total_ratio:.2f}x",
                ]
                for s in summaries
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def render_markdown(cells: Sequence[Cell], verdicts: dict[int, str], fitted: dict) -> str:
    lines = [
        markdown_table(
            [
                "target length",
                "policy",
                "n",
                "context tokens before → after",
                "compressed",
                "cached tokens",
                "compress ms",
                "TTFT ms",
            ],
            [
                [
                    f"{c.length:,}",
                    c.policy,
                    c.requests,
                    f"{_fmt(c.tokens_before)} → {_fmt(c.tokens_after)}",
                    f"{c.compressed}/{c.requests}",
                    _fmt(c.cached_tokens),
                    _fmt(c.compress_ms),
                    _fmt(c.ttft_ms),
                ]
                for c in cells
            ],
        )
    ]
    lines += ["", "auto against the faster fixed policy, per length:", ""]
    lines += [f"- {length:,} tokens: {verdict}" for length, verdict in verdicts.items()]
    lines += ["", "Fitted cost model (serve_config.yaml overrides):", "", "```yaml"]
    lines += [f"{key}: {value}" for key, value in fitted.items()]
    lines += ["```"]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


# --- running it ------------------------------------------------------------------------------


class TopKPlanner:
    """Chooses top_k per question from the same index and embedder as the service."""

    def __init__(self, index_dir: Path, embedder_model: str, tokenizer_source: str) -> None:
        from prepare.tokens import ServingTokenizer
        from retrieval.embedding import Embedder
        from retrieval.index import FaissIndex
        from retrieval.models import resolve_model_reference

        self._index = FaissIndex.load(index_dir)
        self._embedder = Embedder.load(resolve_model_reference(embedder_model, ROOT))
        self._count = ServingTokenizer.load(tokenizer_source).count
        self._tokens: dict[int, int] = {}

    def __call__(self, question: str, length: int, max_k: int = 64) -> int:
        [hits] = self._index.search(self._embedder.encode([question]), max_k)
        tokens = [self._chunk_tokens(hit.position) for hit in hits]
        return top_k_for_length(tokens, length)

    def _chunk_tokens(self, position: int) -> int:
        if position not in self._tokens:
            self._tokens[position] = self._count(self._index.chunks[position].chunk.text)
        return self._tokens[position]


def run_phase(
    url: str,
    requests: Sequence[SweepRequest],
    method: str,
    rate: float,
    max_tokens: int,
    client: httpx.Client | None = None,
) -> list[SweepRecord]:
    """Send `requests` one at a time (bench.client), a record per request; a failed request
    is recorded with its error, not raised."""

    def send_all(http: httpx.Client) -> list[SweepRecord]:
        records = []
        for request in requests:
            body = request_body(request, method, rate, max_tokens)
            record = record_from_outcome(request, post_query(http, body, REQUEST_TIMEOUT_S))
            logger.info(
                "%s %5d %-6s k=%-2d -> %s ttft=%s compress=%s tokens %s->%s",
                request.phase, request.length, request.policy, request.top_k,
                record.method_applied or record.error, record.ttft_ms, record.compress_ms,
                record.context_tokens_before, record.context_tokens_after,
            )  # fmt: skip
            records.append(record)
        return records

    return with_client(url, REQUEST_TIMEOUT_S, client, send_all)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--method", default="llmlingua", choices=["sentences", "llmlingua"])
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--index", default="indexes/squad-dev")
    parser.add_argument("--max-model-len", type=int, default=5120)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], type=parse_assignment
    )
    parser.add_argument("--base-config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--out", type=Path, default=Path("bench-results/context"))
    parser.add_argument(
        "--paired",
        action="store_true",
        help="measure each question under all three policies, prefix cache off, and report "
        "auto against the per-question oracle",
    )
    parser.add_argument(
        "--replot",
        action="store_true",
        help="only redo OUT's tables and plot from the records in OUT/context.json",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.replot:
        saved = json.loads((args.out / "context.json").read_text())
        write_report(args.out, load_records(saved), saved["cost_model"], saved["config"])
        return 0

    overrides: dict[str, Any] = {
        "retriever.index_path": args.index,
        "retriever.max_top_k": 64,
        "generator.max_model_len": args.max_model_len,
        "ingress.request_timeout_s": REQUEST_TIMEOUT_S,
        # The compressor's own cost is what is measured: the shipped timeout (20 s) would
        # send a slow LLMLingua call on uncompressed and count the wait as prefill.
        "compression.timeout_s": 600,
        **dict(args.overrides),
    }
    shipped = first_application(args.base_config)[1]["args"]["generator"]["model_source"]
    source = str(overrides.get("generator.model_source", shipped))
    squad = load_squad(DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME)
    lengths = sorted(args.lengths)
    needed = (args.repeats + 1) * len(lengths) * len(POLICIES)
    questions = [q.question for q in sample_questions(squad, needed, args.seed)]
    planner = TopKPlanner(ROOT / args.index, DEFAULT_EMBEDDING_MODEL, str(ROOT / source))
    calibration = plan_requests(
        questions[: 2 * len(lengths)], lengths, ("never", "always"), 1, "calibrate", planner
    )
    measured = plan_requests(
        questions[2 * len(lengths) :],
        lengths,
        POLICIES,
        args.repeats,
        "measure",
        planner,
        paired=args.paired,
    )
    args.out.mkdir(parents=True, exist_ok=True)

    records = _run_service(args, overrides, "calibrate", calibration)
    model = CompressionCostModel(
        prefill=fit_prefill(records),
        sentences=CompressorCost(0.05) if args.method != "sentences" else fit_compressor(records),
        llmlingua=fit_compressor(records) if args.method == "llmlingua" else CompressorCost(6.0),
    )
    fitted = cost_model_overrides(model, args.method)
    (args.out / "cost_model.json").write_text(json.dumps(fitted, indent=2) + "\n")
    logger.info("fitted cost model: %s", fitted)

    # Paired, a question's three requests must not reuse each other's KV.
    no_cache = {"generator.engine_kwargs.enable_prefix_caching": False} if args.paired else {}
    records += _run_service(args, overrides | fitted | no_cache, "measure", measured)
    print(
        write_report(
            args.out,
            records,
            fitted,
            vars(args) | {"out": str(args.out), "base_config": str(args.base_config)},
        )
    )
    return 0


def load_records(saved: dict[str, Any]) -> list[SweepRecord]:
    """The records of a saved context.json."""
    return [
        SweepRecord(SweepRequest(**r["request"]), **{k: v for k, v in r.items() if k != "request"})
        for r in saved["records"]
    ]


def write_report(
    out: Path, records: Sequence[SweepRecord], fitted: dict[str, Any], config: dict[str, Any]
) -> str:
    """Write OUT/context.md, context.json and the plot from a run's records; return the
    Markdown."""
    cells = summarize([r for r in records if r.request.phase == "measure"])
    verdicts = auto_verdicts(records)
    table = render_markdown(cells, verdicts, fitted)
    rows = oracle_rows(records)
    summaries = summarize_oracle(rows)
    if rows:
        table += "\n" + render_oracle(rows, summaries)
    (out / "context.md").write_text(table)
    (out / "context.json").write_text(
        json.dumps(
            {
                "config": config,
                "cost_model": fitted,
                "records": [asdict(r) for r in records],
                "cells": [asdict(c) for c in cells],
                "verdicts": verdicts,
                "oracle": {
                    "rows": [
                        asdict(r)
                        | {
                            "faster": r.faster,
                            "auto_choice": r.auto_choice,
                            "right": r.right,
                            "oracle_ms": r.oracle_ms,
                        }
                        for r in rows
                    ],
                    "summaries": [asdict(s) for s in summaries],
                },
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    _plot(cells, out / "ttft_vs_context.png")
    return table


def _run_service(
    args: argparse.Namespace,
    overrides: dict[str, Any],
    phase: str,
    requests: Sequence[SweepRequest],
) -> list[SweepRecord]:
    with variant_service(args.base_config, overrides, args.out, phase) as url:
        return run_phase(url, requests, args.method, args.rate, args.max_tokens)


def _plot(cells: Sequence[Cell], path: Path) -> None:
    from bench.plots import plot_lines

    series = {
        policy: [
            (float(c.length), float(c.ttft_ms))
            for c in cells
            if c.policy == policy and c.ttft_ms is not None
        ]
        for policy in POLICIES
    }
    try:
        plot_lines(
            {k: v for k, v in series.items() if v},
            "context tokens retrieved (target)",
            "TTFT ms (median)",
            "TTFT against context length, by compression policy",
            path,
            log_x=True,
        )
    except (ImportError, ValueError) as error:
        logger.warning("no plot: %s", error)


if __name__ == "__main__":
    raise SystemExit(main())
