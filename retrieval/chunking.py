"""Chunk documents by tokens with overlap, on sentence boundaries.

Sentences are packed into a chunk until it holds `chunk_tokens`; the next chunk starts with
the last sentences of the previous one, up to `overlap_tokens`. A sentence longer than a
whole chunk is cut into token windows. Each chunk keeps its sentence spans, so sentence-level
compression can later work inside the chunk without re-splitting it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retrieval.documents import Document
from retrieval.sentences import split_sentences

# Maps a text to the (start, end) character offsets of its tokens.
TokenOffsets = Callable[[str], Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class Chunk:
    """A retrievable piece of a document; `sentence_spans` are offsets into `text`."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    sentence_spans: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    @property
    def sentences(self) -> list[str]:
        return [self.text[start:end] for start, end in self.sentence_spans]


@dataclass(frozen=True)
class ChunkingParams:
    chunk_tokens: int = 200
    overlap_tokens: int = 40

    def __post_init__(self) -> None:
        if self.chunk_tokens < 8:
            raise ValueError("chunk_tokens must be at least 8")
        if not 0 <= self.overlap_tokens < self.chunk_tokens:
            raise ValueError("overlap_tokens must be >= 0 and smaller than chunk_tokens")


@dataclass(frozen=True)
class _Piece:
    start: int
    end: int
    tokens: int


def chunk_document(
    document: Document, token_offsets: TokenOffsets, params: ChunkingParams
) -> list[Chunk]:
    """Split one document into overlapping chunks of at most `params.chunk_tokens` tokens."""
    pieces = _sentence_pieces(document.text, token_offsets, params.chunk_tokens)
    chunks: list[Chunk] = []
    first = 0
    while first < len(pieces):
        last = first
        total = pieces[first].tokens
        while last + 1 < len(pieces) and total + pieces[last + 1].tokens <= params.chunk_tokens:
            last += 1
            total += pieces[last].tokens
        chunks.append(_make_chunk(document, pieces[first : last + 1], len(chunks)))
        if last + 1 >= len(pieces):
            break
        first = _overlap_start(pieces, first, last, params)
    return chunks


def chunk_documents(
    documents: Sequence[Document], token_offsets: TokenOffsets, params: ChunkingParams
) -> list[Chunk]:
    """Chunk every document, in order."""
    return [chunk for doc in documents for chunk in chunk_document(doc, token_offsets, params)]


def _overlap_start(pieces: list[_Piece], first: int, last: int, params: ChunkingParams) -> int:
    """First piece of the next chunk: walk back from `last` while the overlap fits.

    The overlap never crowds out the next new piece, so every chunk adds something.
    """
    start = last + 1
    carried = 0
    limit = min(params.overlap_tokens, params.chunk_tokens - pieces[last + 1].tokens)
    while start - 1 > first and carried + pieces[start - 1].tokens <= limit:
        start -= 1
        carried += pieces[start].tokens
    return start


def _sentence_pieces(text: str, token_offsets: TokenOffsets, max_tokens: int) -> list[_Piece]:
    pieces: list[_Piece] = []
    for start, end in split_sentences(text):
        offsets = list(token_offsets(text[start:end]))
        if len(offsets) <= max_tokens:
            pieces.append(_Piece(start, end, max(len(offsets), 1)))
            continue
        for window in range(0, len(offsets), max_tokens):
            part = offsets[window : window + max_tokens]
            pieces.append(_Piece(start + part[0][0], start + part[-1][1], len(part)))
    return pieces


def _make_chunk(document: Document, pieces: list[_Piece], ordinal: int) -> Chunk:
    base = pieces[0].start
    text = document.text[base : pieces[-1].end]
    spans = tuple((piece.start - base, piece.end - base) for piece in pieces)
    return Chunk(
        chunk_id=f"{document.doc_id}#{ordinal}",
        doc_id=document.doc_id,
        title=document.title,
        text=text,
        sentence_spans=spans,
    )
