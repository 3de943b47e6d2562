"""The advisor's floors for the 1.5B reader on this machine (advisor.cpu_probe's device.json)
beside what bench.quantization measured on the same kind of machine
(docs/results/quantization-int8), one request at a time.

    .venv/bin/python -m advisor.cpu_probe --out docs/results/advisor-cpu/device.json
    .venv/bin/python docs/results/advisor-cpu/predict.py > docs/results/advisor-cpu/predict.txt

The workload is the lab's own: its one-at-a-time prompts (blocks 0 and 1, 8 each, rebuilt as
bench.quantization builds them: SQuAD sample, seed 0, top 5, the short style, the 1.5B's
chat template), their median prompt length, 32 output tokens, nothing cached (the lab runs
with prefix caching off). Measured: the lab's TTFT and TPOT medians and its per-prompt
ratios against bf16 with their 95% intervals (summary.json). The 4-bit variant the lab
measured is W4A8 (int8 activations); the advisor's 4-bit formats are W4A16 (bf16 rate), so
its row is the advisor's W4A16 floor beside a W4A8 measurement.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from advisor.floors import EngineSettings, Workload, compute_floors  # noqa: E402
from advisor.hardware import MODELS, device_from_probe  # noqa: E402
from bench.engine_runs import service_messages  # noqa: E402
from bench.quantization import SQUAD_INDEX, squad_sample, system_prompt  # noqa: E402

HERE = Path(__file__).resolve().parent
MEASURED = ROOT / "docs/results/quantization-int8/summary.json"
READER = ROOT / ".models/qwen2.5-coder-1.5b-instruct"
# The lab's variant -> the advisor's weight format.
VARIANTS = {"fp32": "fp32", "bf16": "bf16", "int8rtn": "int8", "int4a8": "int4"}


def prompt_tokens() -> list[int]:
    """The lab's one-at-a-time prompts' token counts (bench.quantization latency, blocks 0, 1)."""
    from transformers import AutoTokenizer

    questions = squad_sample(16, 0)[:8] + squad_sample(32, 0)[16:24]
    messages = service_messages(
        [q.question for q in questions], 5, ROOT / SQUAD_INDEX, system_prompt("short")
    )
    tokenizer = AutoTokenizer.from_pretrained(READER)
    texts = [
        tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
        for m in messages
    ]
    return [len(tokenizer(text, add_special_tokens=False).input_ids) for text in texts]


def main() -> None:
    device = device_from_probe(json.loads((HERE / "device.json").read_text()))
    tokens = prompt_tokens()
    prompt = round(statistics.median(tokens))
    print(f"device: {device.name}; prompts n={len(tokens)}, median {prompt} tokens")
    workload = Workload(prompt, 32)
    model = MODELS["qwen2.5-coder-1.5b"]
    floors = {
        variant: compute_floors(model, device, workload, EngineSettings(quantization=weights))
        for variant, weights in VARIANTS.items()
    }
    measured = {e["variant"]: e["c1"] for e in json.loads(MEASURED.read_text())["entries"]}
    print(
        "variant | TTFT floor ms | TTFT p50 ms | p50/floor | TTFT floor / bf16 | "
        "TTFT / bf16 measured | TPOT floor ms | TPOT p50 ms | p50/floor | "
        "TPOT floor / bf16 | TPOT / bf16 measured"
    )
    for variant, floor in floors.items():
        seen = measured[variant]
        cells = [variant]
        for phase, floor_ms in (("ttft", floor.ttft_floor_ms), ("tpot", floor.tpot_floor_ms)):
            p50 = seen[f"{phase}_ms_p50"]
            bf16_floor = getattr(floors["bf16"], f"{phase}_floor_ms")
            ratio = seen[f"{phase}_vs_bf16"]
            shown = (
                f"{ratio['estimate']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}]"
                if ratio
                else "1"
            )
            cells += [
                f"{floor_ms:.1f}",
                f"{p50:.1f}",
                f"{p50 / floor_ms:.2f}",
                f"{floor_ms / bf16_floor:.2f}x",
                shown,
            ]
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
