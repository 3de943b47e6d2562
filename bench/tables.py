"""The lab's one Markdown table renderer: a header row, an alignment row, one row per item.

    markdown_table(["setting", "n", "F1"], [["none", "40", "0.512"]], numeric=(1, 2))

Cells are written as given (format numbers before); a column listed in `numeric` is
right-aligned. Every report of bench/ renders its tables here, so they all look alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], numeric: Iterable[int] = ()
) -> str:
    """The rows under `header` as a Markdown table (no trailing newline)."""
    right = set(numeric)
    align = "|".join("---:" if i in right else "---" for i in range(len(header)))
    lines = [_row(header), f"|{align}|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under a header of {len(header)}")
        lines.append(_row([str(cell) for cell in row]))
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
