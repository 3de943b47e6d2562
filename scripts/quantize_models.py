"""Quantize a prepared reader into a checkpoint vLLM loads as is (compressed-tensors format).

Run from the repository root with the quantization tool's own environment (llmcompressor pins
a transformers and compressed-tensors that the serving lock does not have)::

    .venv-quantize/bin/python -m scripts.quantize_models \\
        --model .models/qwen2.5-coder-0.5b-instruct --scheme int4

Schemes (llmcompressor recipes, one-shot, on this CPU):
- ``int4``: W4A16, GPTQ, symmetric 4-bit weights in groups of ``--group-size`` (128), 16-bit
  activations. vLLM's CPU build runs it with its WNA16 kernel.
- ``int8``: W8A8, SmoothQuant then GPTQ: 8-bit weights per output channel, 8-bit activations
  quantized per token at run time. vLLM's CPU build runs it with oneDNN's int8 GEMM, or its
  AMX int8 kernel where the CPU has AMX.
``lm_head`` stays in 16 bits in both (tied to the embeddings in the Qwen readers).

``--weights rtn`` rounds the weights to the nearest step instead of GPTQ's error-correcting
search (SmoothQuant still calibrates ``int8``): minutes instead of the hour GPTQ takes on two
cores for the 1.5B, and at 8 bits per channel the rounding error GPTQ corrects is small. Its
checkpoint is named ``-rtn`` after the scheme, so both can sit side by side.

The calibration set is the project's own corpus (``data/corpus``), never the evaluation
questions: its documents' text, tokenized, cut into ``--samples`` windows of ``--seq-len``
tokens taken in a seeded random order. The checkpoint is written to a temporary folder beside
the output and renamed into place, with ``quantization.json`` saying what made it (source,
scheme, calibration, library versions, seconds, bytes). A complete output is left alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from scripts.prepare_models import TMP_PREFIX, dir_size, make_readable, remove_stale_tmp

logger = logging.getLogger(__name__)

CORPUS = Path("data/corpus")
MANIFEST = "quantization.json"
SCHEMES = ("int4", "int8")
SUFFIX = {"int4": "w4a16", "int8": "w8a8"}
WEIGHTS = ("gptq", "rtn")  # how the weights are rounded: GPTQ's search or to the nearest step


@dataclass(frozen=True)
class Calibration:
    samples: int
    seq_len: int
    seed: int
    corpus: str


def output_for(model: Path, scheme: str, weights: str = "gptq") -> Path:
    """Where `scheme`'s checkpoint of `model` goes: beside it, named by the scheme (and by
    the rounding when it is not GPTQ)."""
    rounding = "" if weights == "gptq" else f"-{weights}"
    return model.with_name(f"{model.name}-{SUFFIX[scheme]}{rounding}")


def corpus_texts(corpus: Path) -> list[str]:
    """Every document of the corpus, in name order."""
    files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix in (".md", ".txt"))
    if not files:
        raise SystemExit(f"no .md or .txt documents under {corpus}")
    return [p.read_text(encoding="utf-8") for p in files]


def windows(token_ids: Sequence[int], seq_len: int, samples: int, seed: int) -> list[list[int]]:
    """`samples` windows of `seq_len` tokens cut end to end from the token stream, drawn in a
    seeded random order; fewer when the stream is shorter than samples * seq_len."""
    starts = list(range(0, len(token_ids) - seq_len + 1, seq_len))
    random.Random(seed).shuffle(starts)
    return [list(token_ids[s : s + seq_len]) for s in starts[:samples]]


def recipe(scheme: str, group_size: int, weights: str = "gptq") -> list[Any]:
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier

    rounding = GPTQModifier if weights == "gptq" else QuantizationModifier
    if scheme == "int8":
        return [
            SmoothQuantModifier(smoothing_strength=0.8),
            rounding(targets="Linear", scheme="W8A8", ignore=["lm_head"]),
        ]
    args = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": group_size}  # fmt: skip
    groups = {"group_0": {"targets": ["Linear"], "weights": args}}
    return [rounding(config_groups=groups, ignore=["lm_head"])]


def source_dtype(model: Path) -> str:
    """The dtype the prepared model's weights are stored in (its config.json)."""
    config = json.loads((model / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def _versions() -> dict[str, str]:
    names = ("llmcompressor", "compressed-tensors", "transformers", "torch")
    return {name: metadata.version(name) for name in names}


def is_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and (folder / "config.json").is_file()


def quantize(model: Path, scheme: str, output: Path, calibration: Calibration,
             group_size: int, weights: str = "gptq") -> dict[str, Any]:  # fmt: skip
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(calibration.seed)
    tokenizer = AutoTokenizer.from_pretrained(model)
    stream: list[int] = []
    for text in corpus_texts(Path(calibration.corpus)):
        stream += tokenizer(text, add_special_tokens=False).input_ids
    rows = windows(stream, calibration.seq_len, calibration.samples, calibration.seed)
    logger.info("calibration: %d windows of %d tokens from %d corpus tokens", len(rows),
                calibration.seq_len, len(stream))  # fmt: skip
    dataset = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    started = time.perf_counter()
    oneshot(model=loaded, dataset=dataset, recipe=recipe(scheme, group_size, weights),
            max_seq_length=calibration.seq_len, num_calibration_samples=len(rows))  # fmt: skip
    seconds = time.perf_counter() - started
    # The tables left unquantized (embeddings, LM head) go back to the source's width:
    # they came from it, so this is exact, and it keeps them from doubling on disk.
    width = getattr(torch, source_dtype(model))
    for table in {
        id(t): t
        for t in (loaded.get_input_embeddings(), loaded.get_output_embeddings())
        if t is not None
    }.values():
        table.to(width)
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(output.parent, output.name)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{output.name}.", dir=output.parent))
    try:
        loaded.save_pretrained(tmp, save_compressed=True)
        tokenizer.save_pretrained(tmp)
        for extra in ("chat_template.jinja", "generation_config.json"):
            if (model / extra).is_file() and not (tmp / extra).exists():
                shutil.copy2(model / extra, tmp / extra)
        manifest = {
            "source": str(model), "scheme": scheme, "weights": weights,
            "group_size": group_size if scheme == "int4" else None,
            "calibration": asdict(calibration) | {"windows": len(rows)},
            "quantize_seconds": round(seconds, 1), "bytes": dir_size(tmp),
            "source_bytes": dir_size(model), "versions": _versions(),
        }  # fmt: skip
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        make_readable(tmp)
        if output.exists():
            shutil.rmtree(output)
        tmp.rename(output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a prepared model folder")
    parser.add_argument("--scheme", choices=SCHEMES, required=True)
    parser.add_argument("--output", type=Path, help="default: beside --model, named by scheme")
    parser.add_argument("--samples", type=int, default=32, help="calibration windows")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group-size", type=int, default=128, help="int4 weight group")
    parser.add_argument("--weights", choices=WEIGHTS, default="gptq",
                        help="GPTQ's search, or rounding to the nearest step")  # fmt: skip
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--force", action="store_true", help="redo a complete output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    output = args.output or output_for(args.model, args.scheme, args.weights)
    if is_complete(output) and not args.force:
        logger.info("%s is complete: left alone", output)
        return 0
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model} is not a prepared model folder (no config.json)")
    calibration = Calibration(args.samples, args.seq_len, args.seed, str(args.corpus))
    manifest = quantize(args.model, args.scheme, output, calibration, args.group_size, args.weights)
    logger.info("wrote %s: %.0f MB (source %.0f MB) in %.0f s", output, manifest["bytes"] / 1e6,
                manifest["source_bytes"] / 1e6, manifest["quantize_seconds"])  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
