"""What every lab's command line shares: argument types, its HTTP client, and the JSON +
Markdown outputs."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def positive_int(text: str) -> int:
    """argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a float above 0."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def label(text: str) -> str:
    """argparse type: an output file stem (letters, digits, '.', '_', '-')."""
    if not _LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"label {text!r}: use letters, digits, '.', '_', '-'")
    return text


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
