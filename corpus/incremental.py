"""Build the next version of an index folder from the previous version plus document changes.

A collection that changes a few documents at a time should not pay for embedding all of them
again. This reads the previous version's folder (manifest, chunks, FAISS vectors, sentence
embeddings, documents.jsonl), drops the chunks of deleted and replaced documents, chunks and
embeds only the upserted documents, and writes a complete new version into a folder that the
caller owns and publishes. The previous folder is only read.

What is incremental and what is rebuilt:
- Chunks: kept chunks stay in their previous order with their vectors, read back from the
  previous FAISS index; the upserted documents' chunks follow, in upsert order, and are the
  only chunks embedded. Chunking follows the previous version's manifest, so every version
  of a collection chunks alike.
- Sentence embeddings: the matrix is rebuilt densely (one row per distinct sentence of the
  kept and new chunks); a sentence text the previous version held keeps its stored
  embedding, and only sentence texts new to the collection are embedded.
- FAISS (corpus.incremental_faiss): the previous index is copied and updated where it has
  the kind and build settings resolved now (`flat`: rows removed and the new vectors
  appended; `hnsw`: appended to when nothing is removed, else rebuilt; `ivf`: refilled on
  its trained quantizer until the collection outgrows its lists), else a new index is built
  from the kept vectors, read back from the previous index, and the new ones.
- BM25 (retrieval.lexical) is rebuilt from every chunk text each version: bm25s cannot update
  an index in place. It tokenizes, which costs far less than embedding.
- A version with no chunks (everything deleted) has an empty flat index, a (0, dimension)
  sentence matrix and no lexical part.
"""

from __future__ import annotations

import calendar
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from corpus.incremental_faiss import next_faiss_index
from retrieval.build import index_sentences
from retrieval.chunking import Chunk, ChunkingParams, chunk_document
from retrieval.documents import Document
from retrieval.embedding import Embedder
from retrieval.index import (
    AUTO_TIERS,
    AutoTiers,
    FaissIndex,
    IndexedChunk,
    IndexParams,
    Manifest,
    manifest_version,
    read_manifest,
    resolve_index_params,
)
from retrieval.lexical import MANIFEST_KEY as LEXICAL_MANIFEST_KEY
from retrieval.lexical import LexicalIndex

logger = logging.getLogger(__name__)

DOCUMENTS_FILE = "documents.jsonl"
# Upserted documents are embedded in blocks of about this many chunks (well under a second
# here), so progress moves and a throttled job (corpus.ingestion) pauses often.
EMBED_BLOCK_CHUNKS = 32
BUILT_AT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
AUTO_INDEX = IndexParams(kind="auto")


@dataclass(frozen=True)
class DocumentChanges:
    """One batch of changes: `upserts` add documents or replace those with the same doc_id;
    `deletes` remove documents by id (repeats count once). An id both upserted and deleted,
    or upserted twice, is a ValueError."""

    upserts: tuple[Document, ...] = ()
    deletes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "upserts", tuple(self.upserts))
        object.__setattr__(self, "deletes", tuple(dict.fromkeys(self.deletes)))
        upserted = [document.doc_id for document in self.upserts]
        if len(set(upserted)) != len(upserted):
            twice = sorted({doc_id for doc_id in upserted if upserted.count(doc_id) > 1})
            raise ValueError(f"documents upserted twice in one change: {twice}")
        both = sorted(set(upserted) & set(self.deletes))
        if both:
            raise ValueError(f"documents both upserted and deleted in one change: {both}")


@dataclass(frozen=True)
class DocumentInfo:
    """One line of a version's documents.jsonl."""

    doc_id: str
    title: str
    chunks: int
    chars: int
    updated_at: float


@dataclass(frozen=True)
class VersionBuild:
    """What `build_next_version` wrote and how much of it was reused."""

    manifest: Manifest
    added: int  # documents new to the collection
    replaced: int
    deleted: int
    not_found: tuple[str, ...]  # deletes naming no document (reported, not an error)
    num_documents: int
    num_chunks: int
    embedded_chunks: int  # the upserted documents' chunks
    reused_chunks: int  # kept chunks, their vectors read back from the previous index
    embedded_sentences: int  # sentence texts the previous version did not hold


def read_documents(version: Path) -> list[DocumentInfo]:
    """The documents of the version in `version`, in chunk order; [] for a folder without
    DOCUMENTS_FILE (one written by retrieval.build)."""
    path = Path(version) / DOCUMENTS_FILE
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as lines:
        return [_document_info(json.loads(line)) for line in lines if line.strip()]


def build_next_version(
    previous: Path | None,
    changes: DocumentChanges,
    output: Path,
    embedder: Embedder,
    *,
    embedding_model: str,
    chunking: ChunkingParams,
    index_params: IndexParams = AUTO_INDEX,
    auto_tiers: AutoTiers = AUTO_TIERS,
    progress: Callable[[int, int], None] | None = None,
) -> VersionBuild:
    """Write the version after `previous` (None: the first one) with `changes` applied into
    the empty folder `output`; reuse the stored vectors of unchanged chunks (module docstring).

    The previous version must have been built with `embedding_model` at the embedder's
    dimension (ValueError otherwise), and its chunking replaces `chunking`. `progress(done,
    total)` counts upserted documents, from (0, total) to (total, total).
    """
    report = progress or (lambda done, total: None)
    report(0, len(changes.upserts))
    output = Path(output)
    _require_empty(output)
    before = _load_previous(previous, embedding_model, embedder.dimension)
    if before is not None:
        chunking = ChunkingParams(**before.manifest.chunking)
    new_chunks = [_chunk(document, embedder, chunking) for document in changes.upserts]
    stored_rows = _stored_sentence_rows(before.chunks if before else [])
    chunk_vectors, fresh = _embed(new_chunks, embedder, stored_rows, report)

    removed = {document.doc_id for document in changes.upserts} | set(changes.deletes)
    kept_rows, chunks = _next_chunks(before, removed, new_chunks)
    indexed, sentence_texts = index_sentences(chunks)
    stored = before.sentence_embeddings if before else None
    sentences = _sentence_matrix(sentence_texts, stored_rows, stored, fresh, embedder.dimension)

    params = _next_index_params(index_params, len(chunks), auto_tiers)
    faiss_index = next_faiss_index(before, kept_rows, chunk_vectors, params)
    old_documents = _previous_documents(previous, before)
    documents = _next_documents(old_documents, changes, new_chunks, removed)
    manifest = Manifest(
        embedding_model=embedding_model,
        dimension=embedder.dimension,
        num_chunks=len(chunks),
        num_sentences=len(sentence_texts),
        index=asdict(params),
        chunking=asdict(chunking),
        extra=_manifest_extra(before, len(documents)),
    )
    lexical = _lexical_index(chunks, manifest)
    index = FaissIndex(faiss_index, indexed, sentences, manifest)
    index.set_search_params(nprobe=params.nprobe, ef_search=params.ef_search)
    _write_version(output, index, lexical, documents)

    build = _summary(
        manifest, changes, old_documents, len(kept_rows), len(chunk_vectors), len(fresh)
    )
    _log_build(output, build)
    report(len(changes.upserts), len(changes.upserts))
    return build


def _require_empty(output: Path) -> None:
    """Refuse an `output` folder that already holds something."""
    if output.exists() and any(output.iterdir()):
        raise ValueError(f"{output} is not empty: a version is written into an empty folder")


def _next_chunks(
    before: FaissIndex | None, removed: set[str], new_chunks: list[list[Chunk]]
) -> tuple[list[int], list[Chunk]]:
    """The previous version's rows kept (their documents not in `removed`) and the next
    version's chunks: the kept ones in their previous order, then the new ones."""
    old_chunks = before.chunks if before else []
    kept_rows = [row for row, item in enumerate(old_chunks) if item.chunk.doc_id not in removed]
    chunks = [old_chunks[row].chunk for row in kept_rows] + [c for cs in new_chunks for c in cs]
    return kept_rows, chunks


def _next_index_params(
    index_params: IndexParams, num_chunks: int, auto_tiers: AutoTiers
) -> IndexParams:
    """The index settings for `num_chunks` chunks: an empty version is an empty flat index,
    whatever kind was asked for."""
    if not num_chunks:
        return IndexParams(kind="flat")
    return resolve_index_params(index_params, num_chunks, auto_tiers)


def _lexical_index(chunks: list[Chunk], manifest: Manifest) -> LexicalIndex | None:
    """The BM25 index over every chunk text, described in `manifest`; None without chunks."""
    if not chunks:
        return None
    lexical = LexicalIndex.build([chunk.text for chunk in chunks])
    manifest.extra[LEXICAL_MANIFEST_KEY] = lexical.describe()
    return lexical


def _log_build(output: Path, build: VersionBuild) -> None:
    """One log line on what was embedded and what was reused."""
    manifest = build.manifest
    logger.info(
        "%s: %d chunks (%d kept, %d embedded), %d sentences (%d embedded), %s index",
        output, build.num_chunks, build.reused_chunks, build.embedded_chunks,
        manifest.num_sentences, build.embedded_sentences, manifest.index["kind"],
    )  # fmt: skip


def _manifest_extra(before: FaissIndex | None, num_documents: int) -> dict:
    return {
        "num_documents": num_documents,
        "built_at": time.strftime(BUILT_AT_FORMAT, time.gmtime()),
        # Identical content still makes a distinct version.
        "build_id": uuid.uuid4().hex,
        "sequence_parent": manifest_version(before.manifest) if before else None,
    }


def _summary(
    manifest: Manifest,
    changes: DocumentChanges,
    old_documents: list[DocumentInfo],
    reused_chunks: int,
    embedded_chunks: int,
    embedded_sentences: int,
) -> VersionBuild:
    known = {info.doc_id for info in old_documents}
    return VersionBuild(
        manifest=manifest,
        added=sum(document.doc_id not in known for document in changes.upserts),
        replaced=sum(document.doc_id in known for document in changes.upserts),
        deleted=sum(doc_id in known for doc_id in changes.deletes),
        not_found=tuple(doc_id for doc_id in changes.deletes if doc_id not in known),
        num_documents=manifest.extra["num_documents"],
        num_chunks=manifest.num_chunks,
        embedded_chunks=embedded_chunks,
        reused_chunks=reused_chunks,
        embedded_sentences=embedded_sentences,
    )


def _load_previous(
    previous: Path | None, embedding_model: str, dimension: int
) -> FaissIndex | None:
    if previous is None:
        return None
    manifest = read_manifest(previous)
    if manifest.embedding_model != embedding_model:
        raise ValueError(
            f"{previous} was built with {manifest.embedding_model!r}, not {embedding_model!r}: "
            "build a new collection instead of a next version"
        )
    if manifest.dimension != dimension:
        raise ValueError(f"{previous} has {manifest.dimension} dims, the embedder {dimension}")
    return FaissIndex.load(previous)


def _chunk(document: Document, embedder: Embedder, chunking: ChunkingParams) -> list[Chunk]:
    chunks = chunk_document(document, embedder.token_offsets, chunking)
    if not document.text.strip() or not chunks:
        raise ValueError(f"document {document.doc_id!r} has no text to index")
    return chunks


def _stored_sentence_rows(chunks: Sequence[IndexedChunk]) -> dict[str, int]:
    """Each sentence text of the previous version -> its row in the stored matrix."""
    rows: dict[str, int] = {}
    for item in chunks:
        rows.update(zip(item.chunk.sentences, item.sentence_rows, strict=True))
    return rows


def _embed(
    chunks_per_document: list[list[Chunk]],
    embedder: Embedder,
    stored_rows: dict[str, int],
    report: Callable[[int, int], None],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The new chunks' vectors (in order) and the sentence texts embedded -> their vectors:
    those the previous version did not hold, each once."""
    total = len(chunks_per_document)
    blocks = [np.zeros((0, embedder.dimension), dtype=np.float32)]
    fresh: dict[str, np.ndarray] = {}
    block: list[Chunk] = []
    for done, chunks in enumerate(chunks_per_document, start=1):
        block.extend(chunks)
        if len(block) < EMBED_BLOCK_CHUNKS and done < total:
            continue
        blocks.append(embedder.encode([chunk.text for chunk in block]))
        texts = [s for chunk in block for s in chunk.sentences]
        new = list(dict.fromkeys(t for t in texts if t not in stored_rows and t not in fresh))
        if new:
            fresh.update(zip(new, embedder.encode(new), strict=True))
        block = []
        report(done, total)
    return np.concatenate(blocks), fresh


def _sentence_matrix(
    texts: list[str],
    stored_rows: dict[str, int],
    stored: np.ndarray | None,
    fresh: dict[str, np.ndarray],
    dimension: int,
) -> np.ndarray:
    """One row per sentence text: the stored embedding where there is one, else the fresh."""
    matrix = np.empty((len(texts), dimension), dtype=np.float32)
    rows = np.array([stored_rows.get(text, -1) for text in texts], dtype=np.int64)
    reused = rows >= 0
    if stored is not None and reused.any():
        matrix[reused] = stored[rows[reused]]
    for position in np.flatnonzero(~reused):
        matrix[position] = fresh[texts[position]]
    return matrix


def _previous_documents(previous: Path | None, before: FaissIndex | None) -> list[DocumentInfo]:
    """The previous version's documents; for one written by retrieval.build (no documents
    file), drawn from its chunks: `chars` then counts the distinct sentences, joined by
    spaces (the text between sentences is not stored), `updated_at` is the build time."""
    if previous is None or before is None:
        return []
    documents = read_documents(previous)
    if documents:
        return documents
    built_at = before.manifest.extra.get("built_at")
    updated_at = calendar.timegm(time.strptime(built_at, BUILT_AT_FORMAT)) if built_at else 0.0
    sentences: dict[str, dict[str, None]] = {}
    chunks: dict[str, list[Chunk]] = {}
    for item in before.chunks:
        chunks.setdefault(item.chunk.doc_id, []).append(item.chunk)
        sentences.setdefault(item.chunk.doc_id, {}).update(dict.fromkeys(item.chunk.sentences))
    return [
        DocumentInfo(
            doc_id, cs[0].title, len(cs), len(" ".join(sentences[doc_id])), float(updated_at)
        )
        for doc_id, cs in chunks.items()
    ]


def _next_documents(
    old: list[DocumentInfo],
    changes: DocumentChanges,
    new_chunks: list[list[Chunk]],
    removed: set[str],
) -> list[DocumentInfo]:
    now_s = time.time()
    return [info for info in old if info.doc_id not in removed] + [
        DocumentInfo(doc.doc_id, doc.title, len(chunks), len(doc.text), now_s)
        for doc, chunks in zip(changes.upserts, new_chunks, strict=True)
    ]


def _write_version(
    output: Path, index: FaissIndex, lexical: LexicalIndex | None, documents: list[DocumentInfo]
) -> None:
    index.save(output)
    if lexical is not None:
        lexical.save(output)
    with (output / DOCUMENTS_FILE).open("w", encoding="utf-8") as out:
        for info in documents:
            record = {
                "id": info.doc_id,
                "title": info.title,
                "chunks": info.chunks,
                "chars": info.chars,
                "updated_at": info.updated_at,
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _document_info(record: dict) -> DocumentInfo:
    return DocumentInfo(
        doc_id=record["id"],
        title=record["title"],
        chunks=int(record["chunks"]),
        chars=int(record["chars"]),
        updated_at=float(record["updated_at"]),
    )
