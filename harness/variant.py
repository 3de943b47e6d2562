"""Ablations as config changes: a copy of a serve config with dotted-key overrides applied.

    python -m harness.variant --base serve_config.yaml \\
        --set retriever.index_path=indexes/squad-dev \\
        --set compression.default_method=none --out .cache/variants/squad.yaml [--port 8001]

Each `--set key=value` names a key under `applications[0].args` (the tree `app.config`
validates) with dots, e.g. `generator.engine_kwargs.dtype=bfloat16` (`--preset NAME` sets a
named group of them first, e.g. int8: make run's reader in INT8 on any CPU); the value is
read as a YAML scalar (`3` is an int, `false` a bool, `[1, 2]` a list). The result is validated with
`app.config.parse_config` before it is written, so a misspelt key fails here, naming the key,
and not minutes later when the service starts. `--port` sets `http_options.port`.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from app.config import ConfigError, parse_config

# Override sets that a make target and a benchmark both serve (`--preset`), kept in one place.
_INT8_READER = "qwen2.5-coder-1.5b-instruct-w8a8-rtn"  # what make models-int8 writes
PRESETS: dict[str, dict[str, Any]] = {
    # make run's reader as its INT8 checkpoint, served in bf16 on any CPU (bench.suite's
    # default-int8; make run serves it on a CPU with AMX-INT8 on its own).
    "int8": {
        "generator.model_id": _INT8_READER,
        "generator.model_source": f".models/{_INT8_READER}",
        "generator.engine_kwargs.dtype": "bfloat16",
    },
}


class VariantError(ValueError):
    """The base file or an override cannot be applied; the message says which."""


def apply_overrides(args: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `args` with each dotted key in `overrides` set to its value.

    Missing intermediate mappings are created (a field the base file leaves at its default can
    be set). Raises VariantError for an empty key segment or a key that goes through a value
    that is not a mapping. Unknown keys are left to `parse_config` to reject.
    """
    result: dict[str, Any] = copy.deepcopy(dict(args))
    for dotted_key, value in overrides.items():
        parts = dotted_key.split(".")
        if not all(part.strip() for part in parts):
            raise VariantError(f"override key {dotted_key!r} has an empty segment")
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                walked = ".".join(parts[: depth + 1])
                raise VariantError(
                    f"cannot set {dotted_key!r}: {walked!r} is a {type(child).__name__}, "
                    "not a mapping"
                )
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return result


def first_application(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parsed serve config at `path` and its applications[0]; VariantError when the
    file has no applications list or its first entry is not a mapping."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    applications = document.get("applications") if isinstance(document, dict) else None
    if not isinstance(applications, list) or not applications:
        raise VariantError(f"{path}: no 'applications' list")
    application = applications[0]
    if not isinstance(application, dict):
        raise VariantError(f"{path}: applications[0] is not a mapping")
    return document, application


def write_variant(
    base: Path, overrides: dict[str, Any], out: Path, port: int | None = None
) -> Path:
    """Write `base` (a serve config YAML) to `out` with `overrides` applied; return `out`.

    `overrides` maps dotted keys under `applications[0].args` to values; `port` sets
    `http_options.port`. The resulting args are validated with `app.config.parse_config`
    first: ConfigError (naming each bad key) or VariantError leave `out` unwritten. Comments of
    the base file are not kept; a header line records the base and the overrides.
    """
    base = Path(base)
    document, application = first_application(base)
    base_args = application.get("args") or {}
    if not isinstance(base_args, dict):
        raise VariantError(f"{base}: applications[0].args is not a mapping")

    new_args = apply_overrides(base_args, overrides)
    parse_config(new_args)
    application["args"] = new_args
    if port is not None:
        if not 1 <= port <= 65535:
            raise VariantError(f"port must be in 1..65535, got {port}")
        http_options = document.setdefault("http_options", {})
        if not isinstance(http_options, dict):
            raise VariantError(f"{base}: http_options is not a mapping")
        http_options["port"] = port

    changes = [f"{key}={value!r}" for key, value in overrides.items()]
    if port is not None:
        changes.append(f"http_options.port={port}")
    header = f"# Generated by harness.variant from {base}: {', '.join(changes) or 'no changes'}\n"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    return out


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` as (key, value), the value read as a YAML scalar or flow collection."""
    key, separator, raw_value = text.partition("=")
    if not separator or not key.strip():
        raise VariantError(f"expected key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError as exc:
        raise VariantError(f"{key.strip()}: value {raw_value!r} is not valid YAML") from exc
    return key.strip(), value


def main(argv: Sequence[str] | None = None) -> int:
    """Write a serve config variant with dotted-key overrides under applications[0].args."""
    parser = argparse.ArgumentParser(prog="python -m harness.variant", description=main.__doc__)
    parser.add_argument("--base", type=Path, default=Path("serve_config.yaml"))
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override under applications[0].args, e.g. retriever.default_top_k=3 (repeatable)",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a named set of overrides (PRESETS), applied before --set",
    )
    parser.add_argument("--port", type=int, default=None, help="http_options.port")
    parser.add_argument("--out", type=Path, required=True, help="variant YAML to write")
    args = parser.parse_args(argv)
    try:
        overrides = dict(PRESETS.get(args.preset, {}))
        overrides.update(parse_assignment(text) for text in args.assignments)
        out = write_variant(args.base, overrides, args.out, port=args.port)
    except (ConfigError, VariantError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
