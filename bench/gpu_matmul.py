"""The advisor's quantization claim, measured at the kernel: one Llama-3-8B decoder layer's
linear layers in bf16 against weight-only INT4 (W4A16), W8A8 INT8 and W8A8 FP8, at batch
sizes from one decode step to a prefill.

    python -m bench.gpu_matmul --out bench-results/gpu-matmul.json   # a CUDA GPU, torch only
    python -m bench.gpu_matmul --render docs/results/gpu-matmul/*.json  # their tables

The advisor (advisor/floors.py) says quantized weights help decode, where each step reads
every weight once and memory bandwidth is the bound, and not prefill, where many tokens
share each weight read and the tensor cores are the bound. This times the seven matmuls of
one layer (q, k, v, o, gate, up, down: 218 M weights) for M tokens at once with CUDA
events, `--iterations` times each after a warm-up (with `--graphs`, replayed from a CUDA
graph as vLLM replays its decode steps), and writes every timing beside the
advisor's floor for the same work on the GPU preset named by `--gpu`: max(weight bytes /
bandwidth, 2 M weights / peak FLOP/s). No model, no vLLM: torch's own kernels
(`torch.mm`, `torch._weight_int4pack_mm`, `torch._int_mm`, `torch._scaled_mm`); a kernel
this torch or GPU lacks is recorded with its error and the rest goes on. Weights are random:
a matmul's time does not depend on the values.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from advisor.hardware import GPUS, WEIGHT_BYTES_PER_PARAM
from bench.stats import fmt_interval, fmt_ratio, independent_ratio, one_sample
from bench.tables import markdown_table

# Llama-3-8B: hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336 (its config.json).
LAYER_SHAPES: dict[str, tuple[int, int]] = {  # name: (in features K, out features N)
    "q": (4096, 4096),
    "k": (4096, 1024),
    "v": (4096, 1024),
    "o": (4096, 4096),
    "gate": (4096, 14336),
    "up": (4096, 14336),
    "down": (14336, 4096),
}
LAYER_WEIGHTS = sum(k * n for k, n in LAYER_SHAPES.values())
TOKENS = (1, 8, 16, 64, 256, 1024, 4096)
INT4_GROUP = 128
# The advisor's bytes per weight for each kind (scales left out, as the advisor does).
KIND_BYTES = {"bf16": "bf16", "int4-w4a16": "int4", "int8-w8a8": "int8", "fp8-w8a8": "fp8"}

Layer = Callable[[], Any]


def floor_ms(kind: str, tokens: int, gpu: str) -> dict[str, float]:
    """The advisor's floors for one layer's matmuls: weight bytes over bandwidth, FLOPs
    over the rate the kind runs at (advisor.hardware.GpuSpec.compute_peak)."""
    spec = GPUS[gpu]
    weight_bytes = LAYER_WEIGHTS * WEIGHT_BYTES_PER_PARAM[KIND_BYTES[kind]]
    memory = weight_bytes / spec.memory_bandwidth_bytes_per_s * 1e3
    compute = 2 * tokens * LAYER_WEIGHTS / spec.compute_peak(KIND_BYTES[kind]) * 1e3
    return {"memory_ms": memory, "compute_ms": compute, "floor_ms": max(memory, compute)}


def build_layer(kind: str, tokens: int, torch: Any) -> Layer:
    """A closure running the layer's seven matmuls for `tokens` rows in `kind`."""
    device = "cuda"
    generator = torch.Generator(device=device).manual_seed(0)
    calls: list[Layer] = []
    for k, n in LAYER_SHAPES.values():
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16, generator=generator)
        if kind == "bf16":
            w = torch.randn(k, n, device=device, dtype=torch.bfloat16, generator=generator)
            calls.append(partial(torch.mm, x, w))
        elif kind == "int4-w4a16":
            calls.append(_int4_call(x, k, n, torch, generator))
        elif kind == "int8-w8a8":
            a = torch.randint(-128, 127, (tokens, k), device=device, dtype=torch.int8)
            b = torch.randint(-128, 127, (n, k), device=device, dtype=torch.int8).t()
            calls.append(partial(torch._int_mm, a, b))
        elif kind == "fp8-w8a8":
            a = x.to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=device, generator=generator).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=device)
            calls.append(
                partial(torch._scaled_mm, a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            )
        else:
            raise ValueError(kind)

    def layer() -> None:
        for call in calls:
            call()

    return layer


def _int4_call(x: Any, k: int, n: int, torch: Any, generator: Any) -> Layer:
    """tinygemm's W4A16 (what torchao's int4 weight-only uses): packed weights, bf16 scales
    and zeros per group of INT4_GROUP input features."""
    values = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.int32, generator=generator)
    try:  # torch >= 2.5 takes two 4-bit values per uint8
        packed_in = (values[:, ::2] << 4 | values[:, 1::2]).to(torch.uint8)
        packed = torch._convert_weight_to_int4pack(packed_in, 8)
    except (RuntimeError, TypeError):
        packed = torch._convert_weight_to_int4pack(values, 8)
    scales_zeros = torch.randn(k // INT4_GROUP, n, 2, device="cuda", dtype=torch.bfloat16)
    return lambda: torch._weight_int4pack_mm(x, packed, INT4_GROUP, scales_zeros)


def in_graph(layer: Layer, torch: Any) -> Layer:
    """`layer` captured once in a CUDA graph, as vLLM runs its decode steps: the replay has
    no launch gaps between the seven kernels."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            layer()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer()
    return graph.replay


def time_layer(layer: Layer, iterations: int, torch: Any) -> list[float]:
    """Milliseconds per run of `layer`, each run timed on its own with CUDA events, after
    five warm-up runs."""
    for _ in range(5):
        layer()
    torch.cuda.synchronize()
    timings = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        layer()
        end.record()
        end.synchronize()
        timings.append(start.elapsed_time(end))
    return timings


def measure(
    kinds: Sequence[str], tokens: Sequence[int], iterations: int, gpu: str, graphs: bool = False
) -> dict[str, Any]:
    import torch

    rows: list[dict[str, Any]] = []
    for kind in kinds:
        for m in tokens:
            row: dict[str, Any] = {"kind": kind, "tokens": m, **floor_ms(kind, m, gpu)}
            try:
                layer = build_layer(kind, m, torch)
                timings = time_layer(in_graph(layer, torch) if graphs else layer, iterations, torch)
            except Exception as exc:  # a kernel this torch/GPU lacks: record it, go on
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            else:
                row["timings_ms"] = timings
                row["median_ms"] = statistics.median(timings)
            torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "timings_ms"}), flush=True)
    return {
        "command": "python -m bench.gpu_matmul " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(),
        "gpu_preset": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "layer_weights": LAYER_WEIGHTS,
        "iterations": iterations,
        "cuda_graphs": graphs,
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    """Per kind and token count: the median ms [95% CI] of the layer, its ratio to bf16 at
    the same tokens [95% CI, the two samples resampled on their own], and the advisor's
    floor and floor ratio, recomputed from today's presets."""
    times = {(r["kind"], r["tokens"]): r.get("timings_ms") for r in result["rows"]}
    rows = []
    for r in result["rows"]:
        kind, m, mine = r["kind"], r["tokens"], r.get("timings_ms")
        floor = floor_ms(kind, m, result["gpu_preset"])["floor_ms"]
        bf16_floor = floor_ms("bf16", m, result["gpu_preset"])["floor_ms"]
        if mine is None:
            rows.append([kind, m, f"not run: {r.get('error', '')}", "-", f"{floor:.3f}",
                         f"{floor / bf16_floor:.2f}x", "-"])  # fmt: skip
            continue
        ratio = None if kind == "bf16" else independent_ratio(mine, times[("bf16", m)] or [])
        rows.append([
            kind, m, fmt_interval(one_sample(mine), 4).replace(" (n=", " (n = "),
            "-" if kind == "bf16" else fmt_ratio(ratio), f"{floor:.3f}",
            f"{floor / bf16_floor:.2f}x", f"{100 * floor / statistics.median(mine):.0f}%",
        ])  # fmt: skip
    header = ["kind", "tokens", "layer ms, median [95% CI]", "/ bf16 [95% CI]",
              "advisor floor ms", "floor / bf16 floor", "floor / measured"]  # fmt: skip
    graphs = "replayed from CUDA graphs" if result.get("cuda_graphs") else "launched eagerly"
    return (
        f"{result['gpu']} (torch {result['torch']}, CUDA {result['cuda']}), "
        f"{result['measured_at']}; one Llama-3-8B layer's seven matmuls "
        f"({result['layer_weights']:,} weights), {graphs}, "
        f"{result['iterations']} timed runs a row; advisor preset "
        f"`{result['gpu_preset']}`. Command: `{result['command']}`.\n\n"
        + markdown_table(header, rows, numeric=(1,))
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", type=Path, nargs="+", help="print stored results' tables")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h200", help="advisor preset")
    parser.add_argument("--kinds", nargs="+", choices=sorted(KIND_BYTES), default=list(KIND_BYTES))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--graphs", action="store_true", help="replay each layer as a CUDA graph")
    args = parser.parse_args(argv)
    if args.render:
        for path in args.render:
            print(render(json.loads(path.read_text(encoding="utf-8"))))
        return 0
    if args.out is None:
        parser.error("--out is required to measure")
    result = measure(args.kinds, args.tokens, args.iterations, args.gpu, args.graphs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
