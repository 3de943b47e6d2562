"""What the labs share: the command-line frame of the conversation lab, and the one way
every lab starts a service.

- `add_request_arguments` / `main_of`: the request options it takes, and the command
  line's frame: logging, the one place errors become a message and exit status 1, and
  the written paths printed.
- `started_now` / `document`: the run's clock, and the JSON document every lab writes
  (config with the settings and timing, summary, one row per request).
- `variant_service`: a service variant (serve_config.yaml with overrides) started, warmed
  up and stopped, the one way every lab starts its services; `squad_service` is it on the
  SQuAD index (`python -m bench.quality prepare` builds it); `keyed_service` is
  serve_config.yaml as shipped with keys required and extra environment for `serve run`.
- `machine` names the CPU every result is measured on; `write_run` stores a run's JSON and
  appends its report to the folder's README.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import quality
from bench.client import LabError, warm_up
from bench.outputs import label, positive_float, positive_int
from bench.squad import SquadFormatError
from harness.service import ROOT, RunningService, free_port, running_service, started_service
from harness.variant import write_variant

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 180.0
DEFAULT_BUDGET_S = 3600.0
DEFAULT_TOP_K = 5


def add_request_arguments(parser: argparse.ArgumentParser, name: str, budget_of: str) -> None:
    """--api-key, --top-k, --timeout-s, --budget-s and --label (default `name`)."""
    parser.add_argument("--api-key", default=None, help="sent as Authorization: Bearer")
    parser.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K)
    parser.add_argument("--timeout-s", type=positive_float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument(
        "--budget-s", type=positive_float, default=DEFAULT_BUDGET_S, help=f"for {budget_of}"
    )
    parser.add_argument("--label", type=label, default=name, help="output stem")


def main_of(run: Callable[[], list[Path]]) -> int:
    """Run a lab's command: its written paths printed, exit 0; a LabError, QualityError,
    SquadFormatError or OSError printed as one line, exit 1."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # httpx logs every request at INFO; the labs log their own line per request.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        written = run()
    except (LabError, quality.QualityError, SquadFormatError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def started_now() -> tuple[str, float]:
    """The start as UTC text, and a perf_counter reading to time the run from."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter()


def document(
    settings: Any, started: tuple[str, float], config: Mapping[str, Any], summary: Any, rows: Any
) -> dict[str, Any]:
    """{config, summary, results}: the settings (paths as text) and the run's timing first
    in config, then the lab's own keys."""
    settings_data = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()}
    return {
        "config": {
            **settings_data,
            **config,
            "started_at": started[0],
            "elapsed_s": round(time.perf_counter() - started[1], 1),
        },
        "summary": summary,
        "results": [asdict(r) for r in rows],
    }


# --- the service -----------------------------------------------------------------------------


@contextmanager
def variant_service(
    base_config: Path,
    overrides: Mapping[str, object],
    out_dir: Path,
    name: str,
    warm: bool = True,
) -> Iterator[str]:
    """`base_config` with `overrides` (harness.variant) on a free loopback port, its config
    and log at `out_dir/<name>.serve.{yaml,log}`, warmed up unless `warm` is False; yields
    its base URL and stops it on exit. Every lab starts its services this way."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = write_variant(base_config, dict(overrides), out_dir / f"{name}.serve.yaml", port)
    started = time.perf_counter()
    with running_service(config, port, out_dir / f"{name}.serve.log") as url:
        logger.info("%s ready in %.0f s", name, time.perf_counter() - started)
        if warm:
            warm_up(url)
        yield url


@contextmanager
def squad_service(
    base_config: Path,
    out_dir: Path,
    name: str,
    index_dir: Path = quality.DEFAULT_INDEX_DIR,
    overrides: Mapping[str, object] | None = None,
) -> Iterator[str]:
    """Start `base_config` serving the SQuAD index (variant_service, not warmed: the labs
    warm it their own way), yield its base URL, stop it on exit. LabError before anything
    starts when the index is missing."""
    index_on_disk = index_dir if index_dir.is_absolute() else ROOT / index_dir
    if not quality.index_is_built(index_on_disk):
        raise LabError(f"no index at {index_on_disk}; run `python -m bench.quality prepare`")
    overrides = {"retriever.index_path": str(index_dir), **(overrides or {})}
    with variant_service(base_config, overrides, out_dir, name, warm=False) as url:
        yield url


@contextmanager
def keyed_service(
    out_dir: Path, name: str, env_assignments: Sequence[str]
) -> Iterator[tuple[RunningService, str]]:
    """serve_config.yaml as shipped, only its port changed, with keys required (a key made
    for the run) and `env_assignments` (KEY=VALUE) added to `serve run`'s environment; its
    config and log at `out_dir/<name>.serve.{yaml,log}`. Yields the service and the key."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = write_variant(ROOT / "serve_config.yaml", {}, out_dir / f"{name}.serve.yaml", port)
    key = secrets.token_urlsafe(24)
    env = {"RAG_API_KEYS": key, **dict(v.split("=", 1) for v in env_assignments)}
    with started_service(config, port, out_dir / f"{name}.serve.log", env) as service:
        yield service, key


def run_name(prefix: str, env_assignments: Sequence[str]) -> str:
    """`<prefix>-shipped`, or `<prefix>-` and the variables' names when some are set."""
    names = "-".join(v.split("=")[0].lower() for v in env_assignments)
    return f"{prefix}-{names or 'shipped'}"


def write_run(out_dir: Path, name: str, document: Mapping[str, Any], report: str) -> None:
    """`out_dir/<name>.json`, and a README section headed by the run's command."""
    (out_dir / f"{name}.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    with (out_dir / "README.md").open("a", encoding="utf-8") as readme:
        readme.write(f"## `{document['command']}`\n\n{document['measured_at']}. {report}\n")
    print(report)


def machine() -> str:
    """The CPU's model, core count and wide-vector extensions, from /proc/cpuinfo."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
        "unknown CPU",
    )
    cores = sum(1 for line in lines if line.startswith("processor"))
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    extras = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model}, {cores} cores, {'/'.join(extras) or 'no AVX-512'}"
