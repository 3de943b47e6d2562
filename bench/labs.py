"""What the labs share: their command lines, the one way every lab starts a service, and
how a run is written.

- `positive_int`, `positive_float`, `label`: argparse types of the labs' options.
- `started_variant`: a service variant (serve_config.yaml with overrides) started and
  stopped, the one way every lab starts its services; `variant_service` warms it up first;
  `keyed_service` is serve_config.yaml as shipped with keys required and extra environment
  for `serve run`.
- `machine` names the CPU every result is measured on, `utc_now` when; `write_run` stores a
  run's JSON and appends its report to the folder's README; `write_json_and_markdown` writes
  a run's `<stem>.json` and `<stem>.md`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.client import warm_up
from generation.cpuinfo import read_cpuinfo
from harness.service import ROOT, RunningService, free_port, started_service
from harness.variant import first_application, write_variant

logger = logging.getLogger(__name__)

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def positive_int(text: str) -> int:
    """argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float above 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def label(text: str) -> str:
    """argparse type: an output file stem (letters, digits, '.', '_', '+', '-')."""
    if not _LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"label {text!r}: use letters, digits, '.', '_', '+', '-'")
    return text


@contextmanager
def variant_service(
    base_config: Path,
    overrides: Mapping[str, object],
    out_dir: Path,
    name: str,
    warm: bool = True,
) -> Iterator[str]:
    """`started_variant`, warmed up unless `warm` is False; yields its base URL."""
    started = time.perf_counter()
    with started_variant(base_config, overrides, out_dir, name) as service:
        logger.info("%s ready in %.0f s", name, time.perf_counter() - started)
        if warm:
            warm_up(service.base_url)
        yield service.base_url


@contextmanager
def started_variant(
    base_config: Path,
    overrides: Mapping[str, object],
    out_dir: Path,
    name: str,
    env: Mapping[str, str] | None = None,
) -> Iterator[RunningService]:
    """`base_config` with `overrides` (harness.variant) on a free loopback port, its config
    and log at `out_dir/<name>.serve.{yaml,log}`, `env` added to `serve run`'s environment;
    yields the running service and stops it on exit. Every lab starts its services this way."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = write_variant(base_config, dict(overrides), out_dir / f"{name}.serve.yaml", port)
    with started_service(config, port, out_dir / f"{name}.serve.log", env) as service:
        yield service


def reader(model_id: str) -> dict[str, object]:
    """The overrides that serve the reader prepared at .models/<model_id> (make models-*)."""
    return {"generator.model_id": model_id, "generator.model_source": f".models/{model_id}"}


def _smollm2_cost_model() -> dict[str, object]:
    """SmolLM2's `auto` cost model as dotted overrides: what the profiles that serve it ship
    (serve_config.scale.yaml), and what its stored figures ran with (the default is the
    1.5B's)."""
    args = first_application(ROOT / "serve_config.scale.yaml")[1]["args"]
    model = args["compression"]["cost_model"]
    overrides: dict[str, object] = {}
    for key, value in model.items():
        inner = value.items() if isinstance(value, dict) else [(None, value)]
        for name, number in inner:
            overrides[".".join(filter(None, ("compression.cost_model", key, name)))] = number
    return overrides


# The tests' reader (SmolLM2-135M), with its cost model: starts in seconds, for labs that
# measure what is in front of the generator, and the reader the stored figures of the older
# plans were read by.
SMOLLM2_GENERATOR = {**reader("smollm2-135m-instruct"), **_smollm2_cost_model()}


@contextmanager
def keyed_service(
    out_dir: Path,
    name: str,
    env_assignments: Sequence[str],
    overrides: Mapping[str, object] | None = None,
) -> Iterator[tuple[RunningService, str]]:
    """serve_config.yaml as shipped, only its port changed (and `overrides`, dotted keys),
    with keys required (a key made for the run) and `env_assignments` (KEY=VALUE) added to
    `serve run`'s environment; its config and log at `out_dir/<name>.serve.{yaml,log}`.
    Yields the service and the key."""
    key = secrets.token_urlsafe(24)
    env = {"RAG_API_KEYS": key, **dict(v.split("=", 1) for v in env_assignments)}
    with started_variant(
        ROOT / "serve_config.yaml", overrides or {}, out_dir, name, env
    ) as service:
        yield service, key


def run_name(prefix: str, env_assignments: Sequence[str]) -> str:
    """`<prefix>-shipped`, or `<prefix>-` and the variables' names when some are set."""
    names = "-".join(v.split("=")[0].lower() for v in env_assignments)
    return f"{prefix}-{names or 'shipped'}"


def write_run(out_dir: Path, name: str, document: Mapping[str, Any], report: str) -> None:
    """`out_dir/<name>.json` (`<name>-2.json` and on when the folder holds that run's
    settings already: a run never overwrites another's records), and a README section
    headed by the run's command, naming its records."""
    records = out_dir / f"{name}.json"
    for again in itertools.count(2):
        if not records.exists():
            break
        records = out_dir / f"{name}-{again}.json"
    records.write_text(json.dumps(document, indent=1), encoding="utf-8")
    with (out_dir / "README.md").open("a", encoding="utf-8") as readme:
        readme.write(
            f"## `{document['command']}`\n\n{document['measured_at']}, records in "
            f"{records.name}. {report}\n"
        )
    print(report)


def write_json_and_markdown(
    out_dir: Path, stem: str, document: dict[str, Any], markdown: str
) -> list[Path]:
    """Write `<out_dir>/<stem>.json` (config, summary, raw rows) and `<stem>.md`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    markdown_path = out_dir / f"{stem}.md"
    markdown_path.write_text(markdown, encoding="utf-8")
    return [json_path, markdown_path]


def utc_now() -> str:
    """A run's start or end, as its records write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def cpu_info() -> tuple[str, set[str], int]:
    """The CPU's model name, its flags and its logical cores, from /proc/cpuinfo (an
    unknown model, no flags and no cores where it cannot be read)."""
    info = read_cpuinfo()
    return info.model or "unknown CPU", set(info.flags), info.logical_cores


def machine() -> str:
    """The CPU's model, core count and wide-vector extensions, from /proc/cpuinfo."""
    model, flags, cores = cpu_info()
    extras = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model}, {cores} cores, {'/'.join(extras) or 'no AVX-512'}"
