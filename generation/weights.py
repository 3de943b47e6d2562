"""`weights: fastest`: the checkpoint the generator replica serves on its own CPU.

The reader's INT8 checkpoint (W8A8: 8-bit weights per output channel rounded to nearest,
8-bit activations per token; `make models-int8` writes it beside the reader) ran through the
whole service on an Intel Xeon with AMX at 0.76x bf16's TTFT and 0.61x its TPOT, with no
detectable change in its answers (docs/quantization.md). vLLM's CPU build runs it with its
AMX int8 kernel there; on a CPU without AMX it was never measured. So `fastest` serves
`<model_source>-w8a8-rtn` on a node whose CPU has AMX-INT8 and that holds the finished
checkpoint, and `model_source` everywhere else (a GPU, another CPU, no checkpoint made);
`given` always serves `model_source`. Like `dtype: fastest` it is resolved in the replica
(GeneratorServer), on the node that runs the engine; the model keeps its `model_id`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

Weights = Literal["fastest", "given"]
AMX_INT8_FLAG = "amx_int8"
# scripts.quantize_models' name for a W8A8 checkpoint with rounded-to-nearest weights, and
# the manifest it writes last (a folder without it is not finished).
INT8_SUFFIX = "-w8a8-rtn"
FINISHED_MARK = "quantization.json"


def int8_checkpoint(model_source: str) -> Path:
    """Where `make models-int8` writes the INT8 checkpoint of the reader at `model_source`."""
    source = Path(model_source)
    return source.with_name(source.name + INT8_SUFFIX)


def fastest_weights(model_source: str, flags: Iterable[str], has_gpu: bool) -> str:
    """What `weights: fastest` serves for `model_source` on a machine with these CPU
    `flags`: the INT8 checkpoint where the CPU has AMX-INT8 and the checkpoint is finished,
    else `model_source` itself."""
    if has_gpu or AMX_INT8_FLAG not in set(flags):
        return model_source
    int8 = int8_checkpoint(model_source)
    return str(int8) if (int8 / FINISHED_MARK).is_file() else model_source


def resolve_weights(
    weights: Weights, model_source: str, flags: Iterable[str], has_gpu: bool
) -> str:
    """The folder vLLM loads for `model_source` under `weights` on this machine."""
    return fastest_weights(model_source, flags, has_gpu) if weights == "fastest" else model_source
