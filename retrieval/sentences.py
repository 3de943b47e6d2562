"""Split text into sentences with character spans; no model, no NLTK data needed."""

from __future__ import annotations

import re

# A sentence ends at . ! or ? followed by whitespace and an opening character, or at a
# line break; Markdown headings and list items thereby become sentences of their own.
_BOUNDARY = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[A-Z0-9*`-])|\n+")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Return (start, end) character spans of the non-blank sentences of `text`, in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        _append_trimmed(text, start, match.start(), spans)
        start = match.end()
    _append_trimmed(text, start, len(text), spans)
    return spans


def _append_trimmed(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        spans.append((start, end))
