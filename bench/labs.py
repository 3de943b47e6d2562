"""What the conversation and citation labs share (bench.conversation, bench.citations).

- `squad_service`: serve_config.yaml with `retriever.index_path` on the SQuAD index
  (`python -m bench.quality prepare` builds it), started and stopped by harness.service, the
  way bench.suite starts its variants.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from bench import quality
from bench.client import LabError
from harness.service import ROOT, free_port, running_service
from harness.variant import write_variant

# --- the service -----------------------------------------------------------------------------


@contextmanager
def squad_service(
    base_config: Path,
    out_dir: Path,
    name: str,
    index_dir: Path = quality.DEFAULT_INDEX_DIR,
    overrides: Mapping[str, object] | None = None,
) -> Iterator[str]:
    """Start `base_config` serving the SQuAD index on a free loopback port (the variant and
    its log go to `out_dir/<name>.serve.{yaml,log}`), yield its base URL, stop it on exit.
    LabError before anything starts when the index is missing."""
    index_on_disk = index_dir if index_dir.is_absolute() else ROOT / index_dir
    if not quality.index_is_built(index_on_disk):
        raise LabError(f"no index at {index_on_disk}; run `python -m bench.quality prepare`")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = write_variant(
        base_config,
        {"retriever.index_path": str(index_dir), **(overrides or {})},
        out_dir / f"{name}.serve.yaml",
        port,
    )
    with running_service(config, port, out_dir / f"{name}.serve.log") as url:
        yield url
