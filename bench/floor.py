"""The floor under the first token: the engine's own prefill time on this CPU, and each
request's TTFT against it.

    python -m bench.floor measure --out docs/results/floor/engine.json
    python -m bench.floor report docs/results/floor/engine.json RUN_DIR [RUN_DIR ...]

`measure` starts bare vLLM in this process (no Ray, no HTTP, no other stage) on the reader
`make run` serves, with `make run`'s own engine settings: the dtype `fastest` resolves to on
this CPU, eager mode, prefix caching, every core for the engine's threads. Each prompt opens
with the first 256 tokens of the service's own prompt (the static prefix, two full KV
blocks, cached by a warm-up as in the service) and goes on with N new tokens of SQuAD text,
N in 256, 512 and 1,024 in an order drawn with a fixed seed; one token is generated. The
median rate at each length, N / TTFT, interpolated between lengths (held at the nearest one
outside them), gives floor(n) = n / rate(n): the engine's own time to its first token when n
of a prompt's tokens are not cached, what no serving chain in front of it can beat.

`report` puts each request of a quality run (bench.quality, one at a time) beside its floor,
n = prompt_tokens − cached_prompt_tokens from the request's own usage: the median per-request
TTFT / floor with its 95% interval. The same prompts go on for 32 greedy tokens, so the
engine's own TPOT stands beside the service's: what the chain costs each token.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.engine_runs import make_run_engine_args
from bench.labs import machine, positive_int, utc_now, write_json_and_markdown
from bench.stats import (
    fmt_interval,
    fmt_ratio,
    independent_ratio,
    interval_dict,
    one_sample,
    paired_ratio,
    tpot,
)
from bench.tables import markdown_table

NEW_TOKENS = (256, 512, 1024)
CACHED_PREFIX_TOKENS = 256  # the explained prompt's two full 128-token KV blocks
DECODE_TOKENS = 32  # after the first: the engine's own TPOT on the same prompts
OUT = Path("docs/results/floor/engine.json")


def prefill_rates(rows: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Median uncached tokens per second at each measured length."""
    by_length: dict[int, list[float]] = {}
    for row in rows:
        n = row["uncached_tokens"]
        by_length.setdefault(n, []).append(n / row["ttft_ms"] * 1000)
    return {n: float(np.median(rates)) for n, rates in sorted(by_length.items())}


def floor_ms(rates: Mapping[int, float], uncached_tokens: int) -> float:
    """The engine's own time to the first token for `uncached_tokens` new tokens: their
    count over the prefill rate interpolated at that length."""
    lengths = sorted(rates)
    rate = float(np.interp(uncached_tokens, lengths, [rates[n] for n in lengths]))
    return uncached_tokens / rate * 1000


def drawn_lengths(repeats: int, seed: int) -> list[int]:
    """Every length of NEW_TOKENS `repeats` times, shuffled with `seed`."""
    lengths = [n for n in NEW_TOKENS for _ in range(repeats)]
    random.Random(seed).shuffle(lengths)
    return lengths


def _prompts(tokenizer: Any, lengths: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """The service's static prefix and one prompt a length: prefix + new SQuAD text, each
    prompt's text a different stretch so nothing past the prefix is ever cached."""
    from bench.quantization import SQUAD_PATH, squad_sample, system_prompt
    from bench.squad import load_squad
    from prepare.prompt import build_messages

    question = squad_sample(1, 0)[0].question
    messages = build_messages(system_prompt("explained"), [], question)
    templated = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prefix = tokenizer(templated, add_special_tokens=False)["input_ids"]
    prefix = prefix[:CACHED_PREFIX_TOKENS]
    text = "\n\n".join(p.context for p in load_squad(SQUAD_PATH).paragraphs)
    body = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(body) < sum(lengths):
        raise SystemExit(f"the SQuAD sample holds {len(body)} tokens, the prompts need more")
    prompts, start = [], 0
    for n in lengths:
        prompts.append(prefix + body[start : start + n])
        start += n
    return prefix, prompts


async def _time_prompts(engine: Any, prompts: Sequence[list[int]]) -> list[dict[str, Any]]:
    """DECODE_TOKENS greedy tokens for each prompt, one prompt at a time: its TTFT, its
    TPOT and the tokens the cache held."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    rows = []
    for ids in prompts:
        start, first, cached, tokens = time.perf_counter(), None, None, 0
        async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params,
                                         str(uuid.uuid4())):  # fmt: skip
            first = first or time.perf_counter()
            cached, tokens = out.num_cached_tokens, len(out.outputs[0].token_ids)
        end = time.perf_counter()
        ttft_ms, e2e_ms = ((first or end) - start) * 1000, (end - start) * 1000
        rows.append({"prompt_tokens": len(ids), "cached_tokens": cached, "ttft_ms": ttft_ms,
                     "output_tokens": tokens,
                     "tpot_ms": tpot(ttft_ms, e2e_ms, tokens)})  # fmt: skip
    return rows


def measure(repeats: int, seed: int, out: Path, argv: Sequence[str]) -> dict[str, Any]:
    """Start the engine, warm the prefix, time every drawn length, save."""
    import asyncio

    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    started_at = utc_now()
    source, kwargs = make_run_engine_args()
    tokenizer = AutoTokenizer.from_pretrained(source)
    lengths = drawn_lengths(repeats, seed)
    prefix, prompts = _prompts(tokenizer, [NEW_TOKENS[0], *lengths])
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    try:
        rows = asyncio.run(_time_prompts(engine, prompts))[1:]  # the first warms the prefix
    finally:
        engine.shutdown()
    for row in rows:
        row["uncached_tokens"] = row["prompt_tokens"] - (row["cached_tokens"] or 0)
    doc = {
        "command": "python -m bench.floor " + " ".join(argv),
        "machine": machine(), "started_at": started_at,
        "engine_args": {k: v for k, v in kwargs.items() if k != "model"}, "reader": source,
        "environment": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND",
                                                       "VLLM_CPU_KVCACHE_SPACE")},
        "cached_prefix_tokens": len(prefix), "repeats": repeats, "seed": seed,
        "rates": prefill_rates(rows), "rows": rows,
    }  # fmt: skip
    write_json_and_markdown(out.parent, out.stem, doc, engine_markdown(doc))
    return doc


def engine_markdown(doc: Mapping[str, Any]) -> str:
    """Per length: n, the median TTFT and prefill rate with their intervals."""
    table = []
    for n in NEW_TOKENS:
        rows = [r for r in doc["rows"] if r["uncached_tokens"] == n]
        ttft = one_sample(r["ttft_ms"] for r in rows)
        rate = one_sample(n / r["ttft_ms"] * 1000 for r in rows)
        decode = one_sample(r.get("tpot_ms") for r in rows)
        table.append([n, len(rows), fmt_interval(ttft, 0), fmt_interval(rate, 0),
                      fmt_interval(decode, 1)])  # fmt: skip
    header = ["uncached tokens", "n", "TTFT p50 ms", "prefill tokens/s p50",
              f"TPOT p50 ms ({DECODE_TOKENS} tokens)"]  # fmt: skip
    intro = f"`{doc['command']}` on {doc['machine']}, {doc['started_at']}."
    return f"{intro}\n\n{markdown_table(header, table)}\n"


def report(engine: Mapping[str, Any], runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict]:
    """Each run's TTFT p50, floor p50 and median per-request TTFT / floor; and its TPOT
    against the engine's own at the measured length nearest the run's uncached tokens
    (independent samples); each with its 95% interval."""
    rates = {int(n): r for n, r in engine["rates"].items()}
    table, data = [], {}
    for name, doc in runs.items():
        answered = [r for r in doc["results"] if r.get("ttft_ms") and r.get("prompt_tokens")]
        uncached = [r["prompt_tokens"] - (r.get("cached_prompt_tokens") or 0) for r in answered]
        floors = [floor_ms(rates, n) for n in uncached]
        ttft, floor = one_sample(r["ttft_ms"] for r in answered), one_sample(floors)
        ratio = paired_ratio((r["ttft_ms"], f) for r, f in zip(answered, floors, strict=True))
        typical = float(np.median(uncached or [0]))
        nearest = min(rates, key=lambda n: abs(n - typical))
        own = [r.get("tpot_ms") for r in engine["rows"] if r["uncached_tokens"] == nearest]
        chain = independent_ratio((r.get("tpot_ms") for r in answered), own)
        table.append([name, len(answered), fmt_interval(ttft, 0), fmt_interval(floor, 0),
                      fmt_ratio(ratio), f"{fmt_ratio(chain)} at {nearest}"])  # fmt: skip
        data[name] = {
            "n": len(answered),
            "ttft_ms_p50": interval_dict(ttft),
            "floor_ms_p50": interval_dict(floor),
            "ttft_over_floor": interval_dict(ratio),
            "tpot_over_engine": interval_dict(chain),
            "engine_tpot_length": nearest,
        }
    header = ["run", "n", "TTFT p50 ms", "floor p50 ms", "TTFT / floor, per request",
              "TPOT p50 / the engine's, at its length"]  # fmt: skip
    return markdown_table(header, table) + "\n", data


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="the engine's own prefill times on this CPU")
    run.add_argument("--repeats", type=positive_int, default=8, help="prompts a length")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--out", type=Path, default=OUT)
    against = commands.add_parser("report", help="quality runs' TTFT against the floor")
    against.add_argument("engine", type=Path, help="measure's JSON")
    against.add_argument("runs", type=Path, nargs="+", help="folders of one quality run each")
    args = parser.parse_args(argv)
    if args.command == "measure":
        measure(args.repeats, args.seed, args.out, argv)
        sys.stdout.write(args.out.with_suffix(".md").read_text(encoding="utf-8"))
        return 0
    from bench.quality_report import load_run

    engine = json.loads(args.engine.read_text(encoding="utf-8"))
    text, _ = report(engine, {str(p): load_run(p) for p in args.runs})
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
