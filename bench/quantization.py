"""Quantized readers against their fp32 selves: speed, memory and answers on the same prompts.

    python -m bench.quantization latency --reader qwen1.5b --variant int4 --block 0
    python -m bench.quantization quality --reader qwen1.5b --variant int4 --questions 200
    python -m bench.quantization report

Variants of a reader (its prepared folder under .models; `make models-quantized` makes the
checkpoints with scripts/quantize_models.py):
- fp32: the prepared weights served in float32 (the service's CPU default);
- bf16: the same weights in bfloat16 (what `make run` serves where the CPU has native bf16);
- int8: W8A8 (SmoothQuant + GPTQ), the `-w8a8` checkpoint;
- int8rtn: W8A8 (SmoothQuant, weights rounded to nearest), the `-w8a8-rtn` checkpoint, in
  bfloat16 (the fast dtype where the CPU has AMX, whose int8 kernel it runs on);
- int4: W4A16 (GPTQ, groups of 128), the `-w4a16` checkpoint, in bfloat16: vLLM's CPU WNA16
  kernel has no float32 path (`"cpu_gemm_wna16" not implemented for 'Float'`);
- int4a8: the same checkpoint run as W4A8 (activations quantized to int8 per token at run
  time, AMX's int8 tiles): what vLLM 0.29 does with a 4-bit checkpoint by default on a CPU
  with AMX (VLLM_CPU_INT4_W4A8=1), so `int4` sets VLLM_CPU_INT4_W4A8=0 to stay W4A16, and
  `int4a8` refuses to run on a CPU without AMX, where vLLM would quietly run W4A16.
Every reader was prepared by dequantising a 4-bit GGUF (Q4_K_M for the Qwens), so "fp32"
already carries 4-bit rounding: a requantised model's loss measured here understates what a
full-precision model would lose.

Prompts are the service's (SQuAD dev questions drawn with a seed, their top-k chunks from
indexes/squad-dev, the answer style's system prompt, the chat template), one engine per
process, its threads on every core the process may use (VLLM_CPU_OMP_THREADS_BIND unless
set; the run records it), prefix caching off so that each prompt's whole prefill is the
reader's.
`latency` times n1 prompts at concurrency 1 and n8 at concurrency 8, each answer a fixed
`--max-new-tokens` (end of sequence ignored), so TTFT and TPOT are over the same work for
every variant; `--block B` takes the B-th slice of the prompt order, so that variants can
alternate (fp32 b0, int4 b0, int4 b1, fp32 b1) and the report pairs them prompt by prompt.
`quality` answers `--questions` prompts at concurrency 8 as the service would (greedy, stop
at end of sequence) and scores EM, F1 and contains-gold per question; a stopped `quality` run
of the same settings, asked again, keeps its answers and goes on. Each run also records
the engine's start time, its resident memory after loading, the checkpoint's bytes and the
CPU. `report` pairs every variant with fp32 of the same reader: ratios of TTFT and TPOT per
prompt, differences of the scores per question, each with a paired bootstrap 95% interval.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import stats
from bench.engine_runs import (
    engine_environment,
    engine_rss_bytes,
    every_cpu,
    measure_point,
    service_messages,
)
from bench.labs import cpu_info, positive_int, utc_now, write_json_and_markdown
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME
from bench.tables import markdown_table

READERS = {
    "smollm2": Path(".models/smollm2-135m-instruct"),
    "qwen0.5b": Path(".models/qwen2.5-coder-0.5b-instruct"),
    "qwen1.5b": Path(".models/qwen2.5-coder-1.5b-instruct"),
}
SQUAD_PATH = DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME
SQUAD_INDEX = Path("indexes/squad-dev")
OUT = Path("docs/results/quantization")
BASELINE = "fp32"
REFERENCES = ("fp32", "bf16")  # latency ratios are given against each
SAVE_EVERY = 40  # quality prompts between saves
CAVEAT = (
    "Every reader here was prepared by dequantising a 4-bit GGUF (Q4_K_M for the Qwens, Q4_1 "
    "for SmolLM2): the fp32 baseline already carries 4-bit rounding, so the loss measured for a "
    "requantised model understates what a full-precision model would lose."
)


@dataclass(frozen=True)
class Variant:
    suffix: str  # appended to the reader's folder name; "" for its own weights
    dtype: str
    weights: str
    environment: tuple[tuple[str, str], ...] = ()  # set for the engine, recorded in the run
    needs_cpu_flag: str | None = None  # /proc/cpuinfo flag without which it cannot run


VARIANTS = {
    "fp32": Variant("", "float32", "prepared weights"),
    "bf16": Variant("", "bfloat16", "prepared weights"),
    "int8": Variant("-w8a8", "float32", "W8A8 INT8 (SmoothQuant + GPTQ)"),
    "int8rtn": Variant("-w8a8-rtn", "bfloat16", "W8A8 INT8 (SmoothQuant, round to nearest)"),
    "int4": Variant(
        "-w4a16", "bfloat16", "W4A16 INT4 (GPTQ, group 128)", (("VLLM_CPU_INT4_W4A8", "0"),)
    ),
    "int4a8": Variant(
        "-w4a16",
        "bfloat16",
        "W4A8: the INT4 checkpoint, int8 activations (AMX)",
        (("VLLM_CPU_INT4_W4A8", "1"),),
        needs_cpu_flag="amx_int8",
    ),
}


def unmet_cpu_flag(variant: Variant, flags: set[str]) -> str | None:
    """Why `variant` cannot run on a CPU with `flags`, or None."""
    if variant.needs_cpu_flag is None or variant.needs_cpu_flag in flags:
        return None
    return f"{variant.weights} needs a CPU with {variant.needs_cpu_flag}; this one has none"


def checkpoint(reader: str, variant: str) -> Path:
    base = READERS[reader]
    return base.with_name(base.name + VARIANTS[variant].suffix)


def checkpoint_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def cpu_name() -> str:
    """The CPU's model name and the vector extensions that decide dtype speed here."""
    name, flags, _ = cpu_info()
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
    return (
        f"{name} ({', '.join(f for f in wanted if f in flags) or 'no AVX2'}), {os.cpu_count()} CPUs"
    )


def score(answer: str, golds: Sequence[str], context: str) -> dict[str, Any]:
    from bench.squad_metrics import answer_survives, exact_match, f1

    return {"em": exact_match(answer, golds), "f1": f1(answer, golds),
            "contains_gold": float(answer_survives(answer, golds)),
            "gold_in_context": float(answer_survives(context, golds))}  # fmt: skip


def system_prompt(style: str) -> str:
    from prepare.prompt import DEFAULT_SYSTEM_PROMPT, SHORT_ANSWER_SYSTEM_PROMPT

    return {"explained": DEFAULT_SYSTEM_PROMPT, "short": SHORT_ANSWER_SYSTEM_PROMPT}[style]


def squad_sample(n: int, seed: int) -> list[Any]:
    from bench.squad import load_squad, sample_questions

    return sample_questions(load_squad(SQUAD_PATH), n, seed)


def _run(args: argparse.Namespace, step: str) -> dict[str, Any]:
    """Start the variant's engine, run `step`'s points, save after each, shut it down."""
    import asyncio

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # Every core for the engine's threads (vLLM's own binding keeps one for its scheduler,
    # which on two cores halves the reader): one engine at a time runs here, nothing else.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", every_cpu())
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    folder, variant = checkpoint(args.reader, args.variant), VARIANTS[args.variant]
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{folder} is missing: run `make models-quantized` first")
    unmet = unmet_cpu_flag(variant, cpu_info()[1])
    if unmet is not None:
        raise SystemExit(unmet)
    os.environ.update(variant.environment)
    questions = squad_sample(args.questions if step == "quality" else
                             (args.block + 1) * (args.n1 + args.n8), args.seed)  # fmt: skip
    if step == "latency":
        questions = questions[args.block * (args.n1 + args.n8) :]
    messages = service_messages([q.question for q in questions], args.top_k, SQUAD_INDEX,
                                system_prompt(args.style))  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
               for m in messages]  # fmt: skip
    engine_args = AsyncEngineArgs(
        model=str(folder.resolve()), dtype=variant.dtype, enforce_eager=True,
        max_model_len=2048, enable_prefix_caching=False, max_num_seqs=8,
    )  # fmt: skip
    doc: dict[str, Any] = {
        "step": step, "reader": args.reader, "variant": args.variant, "weights": variant.weights,
        "dtype": variant.dtype, "checkpoint": str(folder),
        "checkpoint_bytes": checkpoint_bytes(folder), "cpu": cpu_name(),
        "environment": engine_environment(),
        "command": "python -m bench.quantization " + " ".join(args.argv),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                   if k != "argv"},
        "started_at": utc_now(), "points": [],
    }  # fmt: skip
    # A stopped run (SIGTERM) shuts its engine down like Ctrl-C does, instead of leaving
    # the engine's processes behind; what was answered is already saved.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(engine_args)
    doc["engine_start_s"] = time.perf_counter() - started
    doc["engine_rss_bytes_loaded"] = engine_rss_bytes()

    async def measure() -> None:
        await measure_point(engine, prompts[:1], 1, 4)  # warm-up
        if step == "latency":
            plan = [(1, prompts[: args.n1]), (8, prompts[args.n1 : args.n1 + args.n8])]
            for concurrency, batch in plan:
                rows, wall_s = await measure_point(
                    engine, batch, concurrency, args.max_new_tokens, ignore_eos=True
                )
                doc["points"].append({"concurrency": concurrency, "rows": rows, "wall_s": wall_s})
                _save(args.out, doc)
                print(f"{args.reader} {args.variant} C={concurrency}: {wall_s:.0f} s",
                      file=sys.stderr)  # fmt: skip
            return
        point: dict[str, Any] = {"concurrency": 8, "rows": [], "wall_s": 0.0}
        earlier = answered_before(args.out, doc)
        if earlier is not None:  # a stopped run of the same settings goes on where it stopped
            point, doc["started_at"] = earlier["points"][0], earlier["started_at"]
            doc["resumed_at"] = [*earlier.get("resumed_at", []), len(point["rows"])]
        doc["points"].append(point)
        for start in range(len(point["rows"]), len(prompts), SAVE_EVERY):  # saved as it
            end = start + SAVE_EVERY  # goes: a stopped run keeps what it answered
            rows, wall_s = await measure_point(engine, prompts[start:end], 8,
                                               args.max_new_tokens)  # fmt: skip
            for row, q, m in zip(rows, questions[start:end], messages[start:end], strict=True):
                row.update(id=q.question_id, question=q.question,
                           **score(row["text"], q.gold_answers, m[-1]["content"]))  # fmt: skip
                del row["token_ids"]
            point["rows"] += rows
            point["wall_s"] += wall_s
            _save(args.out, doc)
            print(f"{args.reader} {args.variant}: {len(point['rows'])}/{len(prompts)} answered",
                  file=sys.stderr)  # fmt: skip

    try:
        asyncio.run(measure())
    finally:
        doc["engine_rss_bytes_after"] = engine_rss_bytes()
        engine.shutdown()
    doc["finished_at"] = utc_now()
    return _save(args.out, doc)


def answered_before(out: Path, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The saved, unfinished quality run of the same reader, variant and settings as `doc`,
    or None: its answers are kept and the run goes on from the first unanswered prompt."""
    config = doc["config"]
    path = out / run_file("quality", doc["reader"], doc["variant"], config["style"], None)
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    same = all(saved["config"].get(key) == config.get(key)
               for key in (*PAIRED_SETTINGS["quality"], "style"))  # fmt: skip
    if not same or "finished_at" in saved or not saved["points"]:
        return None
    return saved


def run_file(step: str, reader: str, variant: str, style: str, block: int | None) -> str:
    tail = f"-b{block}" if step == "latency" else ""
    return f"{step}-{reader}-{variant}-{style}{tail}.json"


def _save(out: Path, doc: dict[str, Any]) -> dict[str, Any]:
    config = doc["config"]
    out.mkdir(parents=True, exist_ok=True)
    name = run_file(doc["step"], doc["reader"], doc["variant"], config["style"],
                    config.get("block"))  # fmt: skip
    (out / name).write_text(json.dumps(doc))
    return doc


# ---------------------------------------------------------------- report


# What must match for runs of one step to be paired (the prompts and the work per prompt).
PAIRED_SETTINGS = {
    "latency": ("seed", "top_k", "n1", "n8", "max_new_tokens"),
    "quality": ("seed", "top_k", "questions", "max_new_tokens"),
}


def load_runs(out: Path) -> list[dict[str, Any]]:
    """Every saved run in `out`; a folder whose runs of one step differ in a paired
    setting is refused: give each set of settings its own --out."""
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))
            if p.name.startswith(("latency-", "quality-"))]  # fmt: skip
    for step, keys in PAIRED_SETTINGS.items():
        seen = {tuple(r["config"].get(k) for k in keys) for r in runs if r["step"] == step}
        if len(seen) > 1:
            raise SystemExit(f"{out} holds {step} runs of different {keys}: {sorted(seen)}")
    return runs


def joined_latency(runs: Sequence[dict[str, Any]], reader: str, variant: str, style: str,
                   concurrency: int) -> dict[int, list[dict[str, Any]]]:  # fmt: skip
    """Per block, the rows of one (reader, variant, style) latency point."""
    out: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        if (run["step"], run["reader"], run["variant"], run["config"]["style"]) != (
            "latency", reader, variant, style):  # fmt: skip
            continue
        for point in run["points"]:
            if point["concurrency"] == concurrency:
                out[run["config"]["block"]] = point["rows"]
    return out


def latency_pairs(base: dict[int, list[dict[str, Any]]], other: dict[int, list[dict[str, Any]]],
                  key: str) -> list[tuple[float | None, float | None]]:  # fmt: skip
    """(variant, baseline) per prompt, over the blocks both have."""
    pairs = []
    for block in sorted(base.keys() & other.keys()):
        pairs += [(o[key], b[key]) for o, b in zip(other[block], base[block], strict=True)]
    return pairs


def quality_pairs(base: dict[str, Any], other: dict[str, Any],
                  key: str) -> list[tuple[float | None, float | None]]:  # fmt: skip
    """(variant, baseline) per question, matched by SQuAD id."""
    by_id = {r["id"]: r[key] for r in base["points"][0]["rows"]}
    return [(r[key], by_id[r["id"]]) for r in other["points"][0]["rows"] if r["id"] in by_id]


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (reader, style, variant): its own figures and its pairing with fp32."""
    entries = []
    keys = sorted({(r["reader"], r["config"]["style"], r["variant"]) for r in runs},
                  key=lambda k: (k[0], k[1], list(VARIANTS).index(k[2])))  # fmt: skip
    for reader, style, variant in keys:
        mine = [r for r in runs if (r["reader"], r["config"]["style"], r["variant"]) ==
                (reader, style, variant)]  # fmt: skip
        # Start and memory from the speed runs, which run alone; an answering run may have
        # been resumed beside other work (its start and memory are its last resume's).
        timed = [r for r in mine if r["step"] == "latency"] or mine
        entry: dict[str, Any] = {
            "reader": reader, "style": style, "variant": variant, "weights": mine[0]["weights"],
            "dtype": mine[0]["dtype"], "checkpoint_mb": mine[0]["checkpoint_bytes"] / 1e6,
            "engine_start_s": stats.median(r["engine_start_s"] for r in timed),
            "engine_rss_mb": stats.median(r["engine_rss_bytes_loaded"] / 1e6 for r in timed),
            "cpu": sorted({r["cpu"] for r in mine}), "runs": len(mine),
        }  # fmt: skip
        for c in (1, 8):
            rows = [row for rows in joined_latency(runs, reader, variant, style, c).values()
                    for row in rows]  # fmt: skip
            own = joined_latency(runs, reader, variant, style, c)
            entry[f"c{c}"] = {
                "n": len(rows),
                "ttft_ms_p50": stats.median(r["ttft_ms"] for r in rows),
                "tpot_ms_p50": stats.median(r["tpot_ms"] for r in rows),
            }
            for reference in REFERENCES:  # fp32: the service's dtype; bf16: int4's
                base = joined_latency(runs, reader, reference, style, c)
                for key in ("ttft", "tpot"):
                    ratio = None if variant == reference else stats.paired_ratio(
                        latency_pairs(base, own, f"{key}_ms"))  # fmt: skip
                    entry[f"c{c}"][f"{key}_vs_{reference}"] = stats.interval_dict(ratio)
        quality = [r for r in mine if r["step"] == "quality"]
        if quality:
            q = quality[-1]
            rows = q["points"][0]["rows"]
            entry["quality"] = {"n": len(rows), "ttft_ms_p50_c8": stats.median(
                r["ttft_ms"] for r in rows), "tpot_ms_p50_c8": stats.median(
                r["tpot_ms"] for r in rows)}  # fmt: skip
            for key in ("f1", "em", "contains_gold", "gold_in_context"):
                entry["quality"][key] = stats.interval_dict(
                    stats.one_sample((r[key] for r in rows), stat=stats.sample_mean)
                )
                for reference in REFERENCES:  # answers of the same machine's fp32 and bf16
                    base_q = [r for r in runs if (r["step"], r["reader"], r["config"]["style"],
                              r["variant"]) == ("quality", reader, style, reference)]  # fmt: skip
                    if base_q and variant != reference:
                        entry["quality"][f"{key}_vs_{reference}"] = stats.interval_dict(
                            stats.paired_difference(quality_pairs(base_q[-1], q, key))
                        )
        entries.append(entry)
    return entries


def _ratio(d: dict[str, Any] | None) -> str:
    return "-" if d is None else stats.fmt_ratio(stats.Interval(**d))


def _score(d: dict[str, Any] | None) -> str:
    return "-" if d is None else f"{d['estimate']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"


def _diff(d: dict[str, Any] | None) -> str:
    return stats.fmt_difference(None if d is None else stats.Interval(**d))


SPEED_HEADER = [
    "reader", "style", "variant", "dtype", "checkpoint MB", "engine RSS MB", "start s", "C", "n",
    "TTFT p50 ms", "TPOT p50 ms", "TTFT vs fp32", "TPOT vs fp32", "TTFT vs bf16", "TPOT vs bf16",
]  # fmt: skip
ANSWERS_HEADER = [
    "reader", "style", "variant", "n", "F1", "EM", "contains gold", "gold in context",
    "F1 vs fp32", "EM vs fp32", "contains gold vs fp32", "F1 vs bf16", "contains gold vs bf16",
]  # fmt: skip


def _speed_rows(entries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """One row per entry and concurrency that ran."""
    rows = []
    for e in entries:
        for c in (1, 8):
            p = e[f"c{c}"]
            if p["n"]:
                rows.append([
                    e["reader"], e["style"], e["variant"], e["dtype"], f"{e['checkpoint_mb']:.0f}",
                    f"{e['engine_rss_mb']:.0f}", f"{e['engine_start_s']:.1f}", str(c), str(p["n"]),
                    stats.format_ms(p["ttft_ms_p50"]), stats.format_ms(p["tpot_ms_p50"]),
                    _ratio(p["ttft_vs_fp32"]), _ratio(p["tpot_vs_fp32"]),
                    _ratio(p["ttft_vs_bf16"]), _ratio(p["tpot_vs_bf16"]),
                ])  # fmt: skip
    return rows


def _answer_row(e: dict[str, Any], q: dict[str, Any]) -> list[str]:
    """An entry's quality run: its scores and their differences from fp32."""
    return [
        e["reader"], e["style"], e["variant"], str(q["n"]), _score(q["f1"]), _score(q["em"]),
        _score(q["contains_gold"]), _score(q["gold_in_context"]), _diff(q.get("f1_vs_fp32")),
        _diff(q.get("em_vs_fp32")), _diff(q.get("contains_gold_vs_fp32")),
        _diff(q.get("f1_vs_bf16")), _diff(q.get("contains_gold_vs_bf16")),
    ]  # fmt: skip


def markdown(entries: Sequence[dict[str, Any]], command: str) -> str:
    cpus = "; ".join(sorted({c for e in entries for c in e["cpu"]}))
    return "\n".join([
        "# Quantized readers", "", f"`{command}`; runs and their commands in this folder.", "",
        CAVEAT, "", f"CPU: {cpus}", "",
        "## Speed and memory (fixed-length answers, prefix caching off)", "",
        markdown_table(SPEED_HEADER, _speed_rows(entries)), "",
        "Ratios are variant / reference per prompt (median, paired bootstrap 95% CI), over the "
        "blocks both ran; below 1 is faster.", "",
        "## Answers (SQuAD dev, concurrency 8, greedy)", "",
        markdown_table(
            ANSWERS_HEADER, [_answer_row(e, e["quality"]) for e in entries if e.get("quality")]
        ), "",
        "Scores are means with a bootstrap 95% CI; differences are variant - reference (fp32, "
        "bf16) per question (paired), where the reference answered the same questions. Speed "
        "comes from the table above only: the answering runs keep their timings in their "
        "records, but they may overlap other work.",
    ]) + "\n"  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("latency", "quality", "report"))
    parser.add_argument("--reader", choices=tuple(READERS), default="qwen1.5b")
    parser.add_argument("--variant", choices=tuple(VARIANTS), default=BASELINE)
    parser.add_argument("--style", choices=("short", "explained"), default="short")
    parser.add_argument("--block", type=int, default=0, help="latency: slice of the prompt order")
    parser.add_argument("--n1", type=positive_int, default=12, help="latency prompts at C=1")
    parser.add_argument("--n8", type=positive_int, default=16, help="latency prompts at C=8")
    parser.add_argument("--questions", type=positive_int, default=200, help="quality prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-k", type=positive_int, default=5, help="chunks per prompt")
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help="default: 32 for latency; for quality 64 short (as docs/quality.md's SQuAD runs), "
        "128 explained (the service's default)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    if args.max_new_tokens is None:
        quality = {"short": 64, "explained": 128}[args.style]
        args.max_new_tokens = quality if args.step == "quality" else 32
    if args.step == "report":
        entries = summarize(load_runs(args.out))
        command = "python -m bench.quantization " + " ".join(args.argv)
        write_json_and_markdown(args.out, "summary", {"command": command, "entries": entries},
                                markdown(entries, command))  # fmt: skip
        return 0
    _run(args, args.step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
