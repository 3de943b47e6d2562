"""Split text into sentences with character spans; no model, no NLTK data needed."""

from __future__ import annotations

import re

# A sentence ends at . ! or ? followed by whitespace and an opening character, or at a
# line break; list items thereby become sentences of their own.
_BOUNDARY = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[A-Z0-9*`-])|\n+")
# A Markdown (ATX) heading line: no content of its own to select, cite or embed alone.
_HEADING = re.compile(r"#{1,6}(?:\s|$)")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Return (start, end) character spans of the non-blank sentences of `text`, in order.
    A heading line travels with the sentence after it (one span from the heading to that
    sentence's end); a heading with no sentence after it is left out."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        _append_trimmed(text, start, match.start(), spans)
        start = match.end()
    _append_trimmed(text, start, len(text), spans)
    return _headings_joined(text, spans)


def _headings_joined(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    joined: list[tuple[int, int]] = []
    heading_start: int | None = None
    for start, end in spans:
        if _HEADING.match(text, start):
            heading_start = start if heading_start is None else heading_start
            continue
        joined.append((start if heading_start is None else heading_start, end))
        heading_start = None
    return joined


def _append_trimmed(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        spans.append((start, end))
