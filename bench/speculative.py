"""Speculative decoding with a draft model: Qwen2.5-Coder-0.5B drafting for the 1.5B.

    python -m bench.speculative hf     # transformers generate() vs generate(assistant_model=...)
    python -m bench.speculative vllm --variant plain   # one engine per process
    python -m bench.speculative vllm --variant draft
    python -m bench.speculative report # joins them into summary.json / summary.md

Prompts are the service's: a question, its top-k chunks from an index, the default system
prompt, rendered with the chat template. The questions are bench.questions' 20 over the
default index, or (`--questions squad`) a seeded random sample of SQuAD dev over
indexes/squad-dev, enough for 30+ distinct prompts a point. Greedy, so the outputs with and
without the draft must be token-identical. Speed-ups are per prompt (plain / speculative
TPOT), summarized as a median with a paired bootstrap 95% interval on the log ratio.
transformers' assisted generation takes batch size 1 only.

The vLLM engines run one per process. To keep drift between them out of the comparison,
`--block B` gives each run its own slice of the prompt order and its own file, so the
variants can alternate (plain b0, draft b0, draft b1, plain b1); the report joins the
blocks per variant and pairs the prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import stats
from bench.engine_runs import engine_environment, measure_point, service_messages, utc_now
from bench.outputs import positive_int, write_json_and_markdown
from bench.questions import DEFAULT_QUESTIONS

TARGET = ".models/qwen2.5-coder-1.5b-instruct"
DRAFT = ".models/qwen2.5-coder-0.5b-instruct"
SPEC_PREFIX = "vllm:spec_decode_num_"
# Settings that change the engine's speed, saved with each vLLM run.
PAIRED_SETTINGS = ("target", "draft", "questions", "n", "n8", "seed", "top_k",
                   "max_new_tokens", "k", "dtype")  # fmt: skip


QUESTION_SETS = {"default": Path("indexes/default"), "squad": Path("indexes/squad-dev")}
SQUAD_PATH = Path(".cache/squad/squad-v1.1-dev.json")


def pick_questions(questions: Sequence[str], n: int, seed: int) -> list[str]:
    """`n` questions in a seeded random order; cycles through all of them when n > len."""
    order = list(questions)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(n)]


def question_order(kind: str, n: int, seed: int) -> list[str]:
    """The first `n` of the seeded order of a question set (see QUESTION_SETS)."""
    if kind == "default":
        return pick_questions(DEFAULT_QUESTIONS, n, seed)
    from bench.squad import load_squad, sample_questions

    return [q.question for q in sample_questions(load_squad(SQUAD_PATH), n, seed)]


def block_slice(order: Sequence[str], block: int | None, size: int) -> list[str]:
    """Block `block`'s `size` prompts: the order cut into consecutive blocks (None: block 0)."""
    start = (block or 0) * size
    return list(order[start : start + size])


def acceptance(accepted: int, drafted: int) -> float | None:
    """Share of draft tokens the target accepted; None when nothing was drafted."""
    return accepted / drafted if drafted else None


def speedup_ci(
    plain: Sequence[float | None], spec: Sequence[float | None]
) -> stats.Interval | None:
    """Median per-pair speed-up plain/spec with its paired 95% interval (bench.stats);
    pairs with a missing side (a one-token answer has no TPOT) are left out."""
    return stats.paired_ratio(zip(plain, spec, strict=True))


def verdict(interval: stats.Interval | None) -> str:
    return stats.ratio_verdict(
        interval, below="slower with the draft", above="faster with the draft"
    )


def point_summary(rows: Sequence[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Medians of one (engine, variant, concurrency) point and its output tokens/s."""
    tokens = sum(r["tokens"] for r in rows)
    return {
        "n": len(rows),
        "ttft_ms_p50": stats.median(r["ttft_ms"] for r in rows),
        "tpot_ms_p50": stats.median(r["tpot_ms"] for r in rows),
        "e2e_ms_p50": stats.median(r["e2e_ms"] for r in rows),
        "output_tokens": tokens,
        "wall_s": wall_s,
        "output_tok_s": stats.per_s(tokens, wall_s),
    }


def build_prompts(
    questions: Sequence[str], top_k: int, index: Path = QUESTION_SETS["default"]
) -> list[list[dict[str, str]]]:
    """Chat messages as the service builds them, in the default answer style."""
    from prepare.prompt import DEFAULT_SYSTEM_PROMPT

    return service_messages(questions, top_k, index, DEFAULT_SYSTEM_PROMPT)


def run_hf(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.candidate_generator import AssistedCandidateGenerator
    from transformers.generation.streamers import BaseStreamer

    torch.set_flush_denormal(True)  # ~4x faster CPU generation here (ENVIRONMENT.md)
    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).eval()
    counts = {"drafted": 0, "accepted": 0}
    original = AssistedCandidateGenerator.update_candidate_strategy

    def counting(self: Any, input_ids: Any, scores: Any, num_matches: int) -> None:
        counts["drafted"] += int(scores.shape[1]) - 1  # the target scores drafts + 1
        counts["accepted"] += int(num_matches)
        original(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.update_candidate_strategy = counting  # type: ignore[method-assign]

    class FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.calls, self.first_s = 0, 0.0

        def put(self, value: Any) -> None:
            self.calls += 1  # call 1 is the prompt, call 2 the first new token(s)
            if self.calls == 2:
                self.first_s = time.perf_counter()

        def end(self) -> None:
            pass

    def once(ids: Any, assisted: bool) -> dict[str, Any]:
        streamer = FirstToken()
        before = dict(counts)
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                do_sample=False, streamer=streamer, assistant_model=draft if assisted else None,
                pad_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
        end = time.perf_counter()
        print(f"hf generate assisted={assisted}: {end - start:.1f} s", file=sys.stderr)
        new = out[0, ids.shape[1] :].tolist()
        ttft_ms, e2e_ms = (streamer.first_s - start) * 1000, (end - start) * 1000
        return {
            "ttft_ms": ttft_ms, "e2e_ms": e2e_ms, "tokens": len(new),
            "tpot_ms": stats.tpot(ttft_ms, e2e_ms, len(new)), "token_ids": new,
            "drafted": counts["drafted"] - before["drafted"],
            "accepted": counts["accepted"] - before["accepted"],
        }  # fmt: skip

    questions = question_order(args.questions, args.n, args.seed)
    messages = build_prompts(questions, args.top_k, QUESTION_SETS[args.questions])
    rows = []
    once(_encode(tokenizer, messages[0]), True)  # warm-up, both models
    for i, message in enumerate(messages):
        ids = _encode(tokenizer, message)
        order = (False, True) if i % 2 == 0 else (True, False)  # alternate to cancel drift
        runs = {assisted: once(ids, assisted) for assisted in order}
        plain, spec = runs[False], runs[True]
        rows.append({"prompt_tokens": ids.shape[1], "plain": plain, "assisted": spec,
                     "identical": plain["token_ids"] == spec["token_ids"]})  # fmt: skip
        print(f"hf {i + 1}/{len(messages)} plain {plain['tpot_ms']:.0f} ms "
              f"assisted {spec['tpot_ms']:.0f} ms", file=sys.stderr, flush=True)  # fmt: skip
    gen = draft.generation_config
    assistant = {k: getattr(gen, k, None) for k in
                 ("num_assistant_tokens", "num_assistant_tokens_schedule",
                  "assistant_confidence_threshold")}  # fmt: skip
    return {"engine": "hf", "config": {**_config(args), "assistant": assistant}, "rows": rows}


def _command(args: argparse.Namespace) -> str:
    return "python -m bench.speculative " + " ".join(args.argv)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def _encode(tokenizer: Any, messages: list[dict[str, str]]) -> Any:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt").input_ids


def _spec_counters() -> dict[str, float]:
    from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

    return {m.name.removeprefix(SPEC_PREFIX): float(m.value) for m in get_metrics_snapshot()
            if isinstance(m, Counter) and m.name.startswith(SPEC_PREFIX)}  # fmt: skip


def run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    spec = None
    if args.variant == "draft":
        spec = {"method": "draft_model", "model": str(Path(args.draft).resolve()),
                "num_speculative_tokens": args.k}  # fmt: skip
    engine_args = AsyncEngineArgs(
        model=str(Path(args.target).resolve()), dtype=args.dtype, enforce_eager=True,
        max_model_len=2048, enable_prefix_caching=False, max_num_seqs=8,
        speculative_config=spec,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    size = max(args.n, args.n8)
    questions = question_order(args.questions, ((args.block or 0) + 1) * size, args.seed)
    messages = build_prompts(
        block_slice(questions, args.block, size), args.top_k, QUESTION_SETS[args.questions]
    )
    prompts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
               for m in messages]  # fmt: skip
    started_at = utc_now()
    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(engine_args)
    start_s = time.perf_counter() - started

    async def measure() -> list[dict[str, Any]]:  # one event loop: the engine is bound to it
        await measure_point(engine, prompts[:1], 1, 8)  # warm-up
        points = []
        for concurrency, n in ((1, args.n), (8, args.n8)):
            before = _spec_counters()
            rows, wall_s = await measure_point(
                engine, prompts[:n], concurrency, args.max_new_tokens
            )
            after = _spec_counters()
            delta = {k: after[k] - before.get(k, 0.0) for k in after}
            points.append(
                {"concurrency": concurrency, "rows": rows, "wall_s": wall_s, "spec": delta}
            )
            print(f"vllm {args.variant} C={concurrency}: {wall_s:.0f} s", file=sys.stderr)
            _save_vllm(args, {"engine_start_s": start_s, "points": points,
                              "started_at": started_at, "finished_at": None})  # fmt: skip
        return points

    try:
        points = asyncio.run(measure())
    finally:
        engine.shutdown()
    return _save_vllm(args, {"engine_start_s": start_s, "points": points,
                             "started_at": started_at, "finished_at": utc_now()})  # fmt: skip


def vllm_file(variant: str, block: int | None) -> str:
    return f"vllm-{variant}.json" if block is None else f"vllm-{variant}-b{block}.json"


def _save_vllm(args: argparse.Namespace, doc: dict[str, Any]) -> dict[str, Any]:
    environment = engine_environment()
    doc = {"engine": "vllm", "config": _config(args), "command": _command(args),
           "environment": environment} | doc  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / vllm_file(args.variant, args.block)).write_text(json.dumps(doc))
    return doc


def load_vllm_runs(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The saved plain and draft runs, paired by block (`vllm-<variant>[-b<B>].json`);
    a block with only one variant is left out, with a warning."""
    runs: dict[str, dict[str, dict[str, Any]]] = {"plain": {}, "draft": {}}
    for variant, by_block in runs.items():
        for path in sorted(out.glob(f"vllm-{variant}*.json")):
            block = path.stem.removeprefix(f"vllm-{variant}")
            by_block[block] = json.loads(path.read_text())
    blocks = sorted(runs["plain"].keys() & runs["draft"].keys())
    for lone in sorted(runs["plain"].keys() ^ runs["draft"].keys()):
        print(f"block {lone or '(none)'!r} has one variant only: left out", file=sys.stderr)
    plain, draft = [runs["plain"][b] for b in blocks], [runs["draft"][b] for b in blocks]
    settings = {_settings(run) for run in plain + draft}
    if len(settings) > 1:
        raise SystemExit(f"{out} holds runs of different settings {sorted(settings)}: "
                         "give each benchmark its own --out")  # fmt: skip
    return plain, draft


def _settings(run: dict[str, Any]) -> tuple[Any, ...]:
    """What must match for two saved runs to be joined or paired."""
    return tuple(str(run["config"].get(k)) for k in PAIRED_SETTINGS)


def summarize_hf(doc: dict[str, Any]) -> dict[str, Any]:
    rows = doc["rows"]
    plain, spec = [r["plain"] for r in rows], [r["assisted"] for r in rows]
    drafted, accepted = sum(r["drafted"] for r in spec), sum(r["accepted"] for r in spec)
    return {
        "plain": point_summary(plain, sum(r["e2e_ms"] for r in plain) / 1000),
        "assisted": point_summary(spec, sum(r["e2e_ms"] for r in spec) / 1000),
        "tpot_speedup": _interval(speedup_ci(*([r["tpot_ms"] for r in x] for x in (plain, spec)))),
        "e2e_speedup": _interval(speedup_ci(*([r["e2e_ms"] for r in x] for x in (plain, spec)))),
        "acceptance": acceptance(accepted, drafted),
        "drafted": drafted,
        "identical": sum(r["identical"] for r in rows),
        "n": len(rows),
    }


def join_blocks(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per concurrency over all blocks: rows in block order, wall times and spec
    counters summed (the blocks ran one after another)."""
    joined: list[dict[str, Any]] = []
    for points in zip(*(run["points"] for run in runs), strict=True):
        spec: dict[str, float] = {}
        for point in points:
            for key, value in point["spec"].items():
                spec[key] = spec.get(key, 0.0) + value
        joined.append({
            "concurrency": points[0]["concurrency"],
            "rows": [row for point in points for row in point["rows"]],
            "wall_s": sum(point["wall_s"] for point in points), "spec": spec,
        })  # fmt: skip
    return joined


def summarize_vllm(
    plain_runs: Sequence[dict[str, Any]], draft_runs: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per concurrency, the paired comparison of the joined blocks (same prompts, same order)."""
    out = []
    for p, d in zip(join_blocks(plain_runs), join_blocks(draft_runs), strict=True):
        pt, dt = p["rows"], d["rows"]
        out.append({
            "concurrency": p["concurrency"],
            "plain": point_summary(pt, p["wall_s"]), "draft": point_summary(dt, d["wall_s"]),
            "tpot_speedup": _interval(speedup_ci(*([r["tpot_ms"] for r in x] for x in (pt, dt)))),
            "ttft_speedup": _interval(speedup_ci(*([r["ttft_ms"] for r in x] for x in (pt, dt)))),
            "e2e_speedup": _interval(speedup_ci(*([r["e2e_ms"] for r in x] for x in (pt, dt)))),
            "throughput_ratio": stats.per_s(sum(r["tokens"] for r in dt), d["wall_s"])
            / stats.per_s(sum(r["tokens"] for r in pt), p["wall_s"]),
            "acceptance": acceptance(int(d["spec"].get("accepted_tokens", 0)),
                                     int(d["spec"].get("draft_tokens", 0))),
            "spec_counters": d["spec"],
            "identical": sum(a["token_ids"] == b["token_ids"] for a, b in zip(pt, dt, strict=True)),
            "n": len(pt),
            "blocks": len(plain_runs),
        })  # fmt: skip
    return out


def _interval(i: stats.Interval | None) -> dict[str, Any] | None:
    return None if i is None else {**asdict(i), "verdict": verdict(i)}


def markdown(hf: dict[str, Any] | None, vllm: list[dict[str, Any]] | None, command: str) -> str:
    """The summary table: one row per (engine, concurrency, variant)."""
    head = "| engine | C | variant | n | TTFT p50 ms | TPOT p50 ms | E2E p50 ms | out tok/s |"
    head += " acceptance | identical | TPOT speed-up [95% CI] |"
    lines = ["# Speculative decoding with a draft model", "", f"`{command}`", "", head]
    lines.append("|" + "---|" * 11)
    points = [("HF", 1, "assisted (0.5B)", hf)] if hf else []
    points += [("vLLM", p["concurrency"], "draft (0.5B)", p) for p in vllm or []]
    for engine, c, name, p in points:
        spec = p["assisted" if engine == "HF" else "draft"]
        acc = "n/a" if p["acceptance"] is None else f"{p['acceptance']:.2f}"
        for variant, s, extra in (("plain", p["plain"], " | | "),
                                  (name, spec, f"{acc} | {p['identical']}/{p['n']} | "
                                   f"{_ci(p['tpot_speedup'])}")):  # fmt: skip
            lines.append(f"| {engine} | {c} | {variant} | {s['n']} | "
                         + " | ".join(stats.format_ms(s[k]) for k in
                                      ("ttft_ms_p50", "tpot_ms_p50", "e2e_ms_p50"))
                         + f" | {s['output_tok_s']:.2f} | {extra} |")  # fmt: skip
    lines.append("")
    if hf:
        lines.append(f"HF E2E speed-up: {_ci(hf['e2e_speedup'])}. HF assisted generation takes "
                     "batch size 1 only: no concurrency-8 point.")  # fmt: skip
    for p in vllm or []:
        lines.append(f"vLLM C={p['concurrency']}: output tok/s draft/plain "
                     f"x{p['throughput_ratio']:.2f}; TTFT speed-up {_ci(p['ttft_speedup'])}; "
                     f"E2E speed-up {_ci(p['e2e_speedup'])}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def _ci(i: dict[str, Any]) -> str:
    return f"x{i['estimate']:.2f} [{i['low']:.2f}, {i['high']:.2f}] ({i['verdict']})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("hf", "vllm", "report"))
    parser.add_argument("--variant", choices=("plain", "draft"), default="draft")
    parser.add_argument("--target", default=TARGET)
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--n", type=positive_int, default=20, help="prompts at concurrency 1")
    parser.add_argument("--n8", type=positive_int, default=24, help="requests at concurrency 8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", choices=tuple(QUESTION_SETS), default="default")
    parser.add_argument(
        "--block", type=int, default=None, help="vLLM: this run's slice of the prompt order"
    )
    parser.add_argument("--top-k", type=positive_int, default=2, help="chunks per prompt")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--k", type=positive_int, default=3, help="vLLM draft tokens per step")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (HF)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--out", type=Path, default=Path("bench-results/speculative"))
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    command = _command(args)
    if args.step == "hf":
        doc = run_hf(args) | {"command": command}
        write_json_and_markdown(args.out, "hf", doc, markdown(summarize_hf(doc), None, command))
    elif args.step == "vllm":
        run_vllm(args)
    else:
        hf_path = args.out / "hf.json"
        hf = summarize_hf(json.loads(hf_path.read_text())) if hf_path.exists() else None
        plain_runs, draft_runs = load_vllm_runs(args.out)
        vl = summarize_vllm(plain_runs, draft_runs) if plain_runs else None
        write_json_and_markdown(args.out, "summary", {"command": command, "hf": hf, "vllm": vl},
                                markdown(hf, vl, command))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
