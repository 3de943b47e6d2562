"""llama.cpp's server, the engine a CPU user would run instead of vLLM, as the labs' peer.

    python -m bench.peer timings RUN_DIR [RUN_DIR ...]   # the engine's own, from its log
    python -m bench.peer rounding                        # the GGUF's weights in bf16

`make peer` builds `llama-cpp-python[server]` into .venv-peer (requirements/peer.lock; not
part of `make test`) and keeps the Q4_K_M GGUF the 1.5B reader is converted from at
.models/gguf/. The labs start the server here, on a free loopback port, in a process group of
its own that they stop when done, and point the service at it through
`generator.engine: openai` (the pipeline unchanged, llama.cpp generating), with the
reader's own tokenizer for the token budgets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.stats import fmt_interval, one_sample
from bench.tables import markdown_table
from harness.service import ROOT, free_port, running_server
from scripts.prepare_models import QWEN_15B, gguf_path

PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
PEER_GGUF = ROOT / gguf_path(QWEN_15B)  # scripts.prepare_models --gguf-qwen15 keeps it
PEER_MODEL = "qwen2.5-coder-1.5b-instruct"  # the name the service asks the server for
PEER_TOKENIZER = ".models/qwen2.5-coder-1.5b-instruct"  # the GGUF's own vocabulary, converted
CONTEXT_TOKENS = 2048  # generator.max_model_len's default


def server_argv(port: int, threads: int, gguf: Path = PEER_GGUF) -> list[str]:
    """llama-cpp-python's OpenAI server on `gguf`, loopback only, `threads` for prefill and
    decode alike."""
    return [
        str(PEER_PYTHON), "-m", "llama_cpp.server", "--model", str(gguf),
        "--model_alias", PEER_MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(CONTEXT_TOKENS), "--n_threads", str(threads),
        "--n_threads_batch", str(threads),
    ]  # fmt: skip


@contextmanager
def llama_server(out_dir: Path, threads: int | None = None) -> Iterator[str]:
    """The peer server on every core this process may use (or `threads`), its log at
    `out_dir/llama.server.log`; yields its base URL up to /v1 and stops it on exit."""
    for needed in (PEER_PYTHON, PEER_GGUF):
        if not needed.exists():
            raise SystemExit(f"{needed} is missing: run `make peer` first")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = server_argv(port, threads or len(os.sched_getaffinity(0)))
    with running_server(argv, f"{url}/v1/models", out_dir / "llama.server.log",
                        env=os.environ, name="llama.cpp server", ready_timeout_s=300,
                        poll_s=1.0):  # fmt: skip
        yield f"{url}/v1"


def peer_generator(base_url: str) -> dict[str, object]:
    """The overrides that make the service's generator the peer server at `base_url`."""
    return {
        "generator.engine": "openai",
        "generator.openai": {"base_url": base_url, "model": PEER_MODEL,
                             "tokenizer": PEER_TOKENIZER},
    }  # fmt: skip


# llama.cpp's own account of each request, printed to the server's log when it ends.
_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_DECODE = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")


def engine_timings(log: str) -> list[dict[str, float]]:
    """Per request, in order: the uncached prompt tokens llama.cpp evaluated and in how many
    ms, and the tokens it generated after the first and in how many ms."""
    prompts, decodes = _PROMPT.findall(log), _DECODE.findall(log)
    return [{"prompt_tokens": int(pt), "prompt_ms": float(pms),
             "decode_tokens": int(dt), "decode_ms": float(dms)}
            for (pms, pt), (dms, dt) in zip(prompts, decodes, strict=True)]  # fmt: skip


def timings_report(runs: dict[str, list[dict[str, float]]]) -> str:
    """Per run (its first request, the service's warm-up, left out): the engine's median
    prefill rate and ms per generated token, with their 95% intervals."""
    rows = []
    for name, requests in runs.items():
        asked = requests[1:]
        rate = one_sample(r["prompt_tokens"] / r["prompt_ms"] * 1000 for r in asked)
        decode = one_sample(r["decode_ms"] / r["decode_tokens"] for r in asked
                            if r["decode_tokens"])  # fmt: skip
        rows.append([name, len(asked), fmt_interval(rate, 0), fmt_interval(decode, 1)])
    header = ["run", "n", "prefill tokens/s p50", "ms per generated token p50"]
    return markdown_table(header, rows) + "\n"


def bf16_rounding(gguf: Path = PEER_GGUF, block: str = "blk.0.") -> str:
    """Per quantized tensor of one transformer block: its type, weights, the share of its
    dequantized values that bf16 holds exactly, and bf16's largest relative error: what
    converting the GGUF to the bf16 reader rounds a second time."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    rows = []
    for tensor in GGUFReader(gguf).tensors:
        if not tensor.name.startswith(block) or tensor.tensor_type.name == "F32":
            continue
        exact = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
        rounded = exact.to(torch.bfloat16).to(torch.float32)
        error = float(((rounded - exact).abs() / exact.abs().clamp_min(1e-12)).max())
        share = float((rounded == exact).float().mean())
        rows.append([tensor.name, tensor.tensor_type.name, exact.numel(), f"{share:.3f}",
                     f"{error:.4f}"])  # fmt: skip
    header = ["tensor", "type", "weights", "exact in bf16", "largest relative error"]
    return markdown_table(header, rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    timings = commands.add_parser("timings", help="llama.cpp's own times, from its log")
    timings.add_argument("runs", type=Path, nargs="+", help="folders holding llama.server.log")
    commands.add_parser("rounding", help="the GGUF's first block converted to bf16")
    args = parser.parse_args(argv)
    if args.command == "rounding":
        sys.stdout.write(bf16_rounding())
        return 0
    runs: dict[str, Any] = {}
    for folder in args.runs:
        runs[str(folder)] = engine_timings((folder / "llama.server.log").read_text("utf-8"))
        (folder / "llama-engine.json").write_text(json.dumps(runs[str(folder)], indent=1))
    sys.stdout.write(timings_report(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
