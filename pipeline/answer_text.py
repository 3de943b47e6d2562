"""Clean what a small model writes around its answer: leaked source tags, made-up citations.

Three kinds of text are found, left to right:
- a `<source ...>` or `</source>` tag (any case, attributes of up to MAX_MARKER_CHARS), and
  at the very end of the answer an unclosed fragment of one (`<source id="x`): removed;
- a bracketed marker, `[` ids separated by `,` or `;` `]`, where each id is one of the
  source ids or looks like a chunk id (`kv-cache#0`, `guides/kv#12`): the valid ids are kept
  (`[a#1, bad#2]` -> `[a#1]`), a marker with none is removed. `[1]` and `[note]` are text;
- outside a marker, a bare source id, or the id of another chunk of a source's document
  (`... blocks kv-cache#0.`, `kv-cache#7` when `kv-cache#0` is a source): removed. Other
  chunk-id-like words stay: only these need a word held back while it streams.

Removals next to each other (only spaces or tabs between) and the spaces and tabs around them
form one group, replaced by a single space, or by nothing before punctuation, a closing
bracket, a line break or the end, and after an opening bracket, a line break or the start.
Nothing else in the text changes.

`AnswerStreamCleaner` applies the same rules to a stream: it emits a prefix only once no later
text can change how that prefix is cleaned, holding back at most a possible marker (up to
about MAX_MARKER_CHARS) and the spaces before it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable

# The longest tag attributes or bracket content that still counts as a tag or a marker; it
# bounds what the stream cleaner holds back.
MAX_MARKER_CHARS = 96

_HORIZONTAL = " \t"
_CLOSERS = ".,;:!?)]}"
_OPENERS = "([{"
# A chunk id as the index writes them: `<document id>#<ordinal>`, the document id a path.
_PATTERN_ID = r"\w[\w./-]{0,59}#\d{1,6}"
_PATTERN_ID_PREFIX = r"\w[\w./-]{0,59}(?:#\d{0,6})?"  # any beginning of one
_BARE_BEFORE = r"(?<![\w./#-])"
_BARE_AFTER = r"(?![\w#])"
_RUN_CHAR = re.compile(r"[\w./#-]")
# Ids with these characters cannot be told apart from the text around them.
_UNMATCHABLE_ID_CHARS = frozenset("[]<>,;\n\r")


def _prefixes(literal: str) -> str:
    """A regex matching every non-empty prefix of `literal`."""
    pattern = ""
    for char in reversed(literal[1:]):
        pattern = f"(?:{re.escape(char)}{pattern})?"
    return re.escape(literal[0]) + pattern


# Any beginning of `source` and its attributes, as a tag can be cut off in the stream.
_SOURCE_PREFIX = rf"s(?:o(?:u(?:r(?:c(?:e(?:\b[^<>]{{0,{MAX_MARKER_CHARS}}})?)?)?)?)?)?"
_TAG = rf"(?i:<\s{{0,2}}(?:/\s{{0,2}})?source\b[^<>]{{0,{MAX_MARKER_CHARS}}}>)"
_FRAGMENT = rf"(?i:<\s{{0,2}}(?:/\s{{0,2}}(?:{_SOURCE_PREFIX})?|{_SOURCE_PREFIX})\Z)"
_TAG_PREFIX = re.compile(rf"(?i:<\s{{0,2}}(?:/\s{{0,2}})?(?:{_SOURCE_PREFIX})?)")


class _Grammar:
    """The cleaning rules for one set of source ids."""

    def __init__(self, source_ids: frozenset[str]) -> None:
        exact = sorted(
            (i for i in source_ids if i and not _UNMATCHABLE_ID_CHARS & set(i)),
            key=lambda i: (-len(i), i),
        )
        self.valid = frozenset(exact)
        # Bare ids are those of the sources' documents, any ordinal (a model copies them
        # from the prompt, or miscopies the ordinal), and source ids of another shape. Not
        # any chunk-id-like word: holding back every word in case `#<n>` follows would
        # delay the whole stream by a token.
        documents = {m[1] for i in exact if (m := re.fullmatch(r"(.+)#\d{1,6}", i))}
        odd = [i for i in exact if not re.fullmatch(r".+#\d{1,6}", i)]
        self._stems = sorted(f"{d}#" for d in documents)
        self._odd_ids = odd
        self._first_chars = frozenset(i[0] for i in [*self._stems, *odd])
        exact_alternatives = "".join(f"{re.escape(i)}|" for i in exact)
        any_id = f"(?:{exact_alternatives}{_PATTERN_ID})"
        bracket = (
            rf"\[(?=[^\[\]]{{1,{MAX_MARKER_CHARS}}}\])"
            rf"\s*{any_id}(?:\s*[,;]\s*{any_id})*\s*\]"
        )
        known = [
            *(re.escape(i) for i in sorted(odd, key=lambda i: (-len(i), i))),
            *(rf"{re.escape(d)}#\d{{1,6}}" for d in sorted(documents, key=lambda d: (-len(d), d))),
        ]
        bare = f"{_BARE_BEFORE}(?:{'|'.join(known)}){_BARE_AFTER}" if known else r"(?!)"
        body = f"(?P<tag>{_TAG})|(?P<bracket>{bracket})|(?P<bare>{bare})"
        self.streaming = re.compile(body)
        self.final = re.compile(f"(?P<fragment>{_FRAGMENT})|{body}")
        id_prefix = "|".join([*(_prefixes(i) for i in exact), _PATTERN_ID_PREFIX])
        self._bracket_prefix = re.compile(rf"\[\s*(?:{any_id}\s*[,;]\s*)*(?:(?:{id_prefix})\s*)?")
        # Longer than any tag, marker or id: nothing that starts earlier can still change.
        self.longest_hold = max([MAX_MARKER_CHARS + 16, *(len(i) + 8 for i in exact)])

    def marker_ids(self, marker: str) -> tuple[list[str], bool]:
        """The valid ids of a bracketed marker, in order, without repeats, and whether
        that is every id the marker names."""
        parts = [part.strip() for part in re.split(r"[,;]", marker[1:-1])]
        ids = [part for n, part in enumerate(parts) if part in self.valid and part not in parts[:n]]
        return ids, len(ids) == len(parts)

    def clean(self, text: str, pos: int, final: bool) -> tuple[str, int]:
        """The cleaned text of `text[pos:cut]` and `cut`: the end of `text` when `final`,
        else the end of the part that no continuation of `text` can clean differently.

        `pos` is 0 or an earlier `cut`: no marker or removal group spans it.
        """
        end = len(text)
        pieces: list[str] = []
        kept: list[tuple[int, int, str]] = []  # (start, end, replacement) of valid markers
        # [start, end, whether spaces or tabs are in it]: removals with only spaces or tabs
        # between them, and the spaces and tabs around them.
        groups: list[list[int]] = []
        for match in (self.final if final else self.streaming).finditer(text, pos):
            start, stop = match.span()
            if match.lastgroup == "bracket":
                ids, all_valid = self.marker_ids(match[0])
                if ids:
                    kept.append((start, stop, match[0] if all_valid else f"[{', '.join(ids)}]"))
                    continue
            if groups and not text[groups[-1][1] : start].strip(_HORIZONTAL):
                groups[-1][2] |= start > groups[-1][1]
                groups[-1][1] = stop
            else:
                groups.append([start, stop, 0])
        for group in groups:
            while group[0] > pos and text[group[0] - 1] in _HORIZONTAL:
                group[0] -= 1
                group[2] = 1
            while group[1] < end and text[group[1]] in _HORIZONTAL:
                group[1] += 1
                group[2] = 1
        cut = end if final else self._stable_end(text, pos, groups)
        edits = sorted(
            [(s, e, r) for s, e, r in kept if e <= cut]
            + [(g[0], g[1], self._group_replacement(text, g)) for g in groups if g[1] <= cut]
        )
        at = pos
        for start, stop, replacement in edits:
            pieces.append(text[at:start])
            pieces.append(replacement)
            at = stop
        pieces.append(text[at:cut])
        return "".join(pieces), cut

    @staticmethod
    def _group_replacement(text: str, group: list[int]) -> str:
        start, stop, spaced = group
        after = text[stop] if stop < len(text) else None
        before = text[start - 1] if start > 0 else None
        if after is None or after in _CLOSERS or after.isspace():
            return ""
        if before is None or before in _OPENERS or before.isspace():
            return ""
        return " " if spaced else ""

    def _may_become_bare_id(self, tail: str) -> bool:
        """Whether text that begins a word, `tail`, may still grow into a bare id."""
        for stem in self._stems:
            if stem.startswith(tail):
                return True
            if tail.startswith(stem):
                digits = tail[len(stem) :]
                if len(digits) <= 6 and (not digits or digits.isdecimal()):
                    return True
        return any(i.startswith(tail) for i in self._odd_ids)

    def _stable_end(self, text: str, pos: int, groups: list[list[int]]) -> int:
        """Where the part that later text cannot change ends (see `clean`)."""
        end = len(text)
        cut = end
        window = max(pos, end - self.longest_hold)
        # A tag or marker that may still close.
        opening = text.rfind("<", window)
        if opening > text.rfind(">", window) and _TAG_PREFIX.fullmatch(text, opening):
            cut = min(cut, opening)
        opening = text.rfind("[", window)
        if (
            opening > text.rfind("]", window)
            and end - opening - 1 <= MAX_MARKER_CHARS
            and self._bracket_prefix.fullmatch(text, opening)
        ):
            cut = min(cut, opening)
        # A word that may still become a bare id.
        for start in range(window, end):
            starts_word = start == 0 or not _is_run(text[start - 1])
            if (
                starts_word
                and text[start] in self._first_chars
                and self._may_become_bare_id(text[start:])
            ):
                cut = min(cut, start)
                break
        # Spaces may join a removal that follows them.
        while cut > pos and text[cut - 1] in _HORIZONTAL:
            cut -= 1
        # A removal group's replacement depends on the character after it.
        for start, stop, _ in reversed(groups):
            if start < cut <= stop:
                cut = start
        return cut


def _is_run(char: str) -> bool:
    """Whether `char` can be part of a chunk id (a word character or one of `./#-`)."""
    return _RUN_CHAR.match(char) is not None


@functools.lru_cache(maxsize=256)
def _grammar(source_ids: frozenset[str]) -> _Grammar:
    return _Grammar(source_ids)


def clean_answer(text: str, source_ids: Collection[str]) -> str:
    """`text` without source tags, invalid citation markers and bare chunk ids (the rules in
    the module docstring); markers citing ids in `source_ids` are kept."""
    return _grammar(frozenset(source_ids)).clean(text, 0, final=True)[0]


def cited_ids(text: str, source_ids: Iterable[str]) -> list[tuple[int, int, str]]:
    """(start, end, id) of each valid id cited by a bracketed marker in `text`, in order;
    `start`/`end` are the marker's span (a marker citing two ids gives two entries)."""
    grammar = _grammar(frozenset(source_ids))
    cited: list[tuple[int, int, str]] = []
    for match in grammar.final.finditer(text):
        if match.lastgroup == "bracket":
            ids, _ = grammar.marker_ids(match[0])
            cited.extend((match.start(), match.end(), i) for i in ids)
    return cited


class AnswerStreamCleaner:
    """`clean_answer` over a stream of text pieces: what `feed` and `finish` return, joined,
    is `clean_answer` of the pieces joined. Emitted text is never taken back."""

    def __init__(self, source_ids: Collection[str]) -> None:
        self._grammar = _grammar(frozenset(source_ids))
        self._text = ""
        self._emitted_to = 0  # `_text[:_emitted_to]` is cleaned and emitted

    def feed(self, piece: str) -> str:
        """Take the next piece; return the cleaned text that is final now (maybe "")."""
        if not piece:
            return ""
        self._text += piece
        cleaned, self._emitted_to = self._grammar.clean(self._text, self._emitted_to, False)
        return cleaned

    def finish(self) -> str:
        """The cleaned rest, once the stream has ended."""
        cleaned, self._emitted_to = self._grammar.clean(self._text, self._emitted_to, True)
        return cleaned
