"""Build a FAISS index from a document folder.

python -m retrieval.build --input data/corpus --output indexes/default

The default `--index-kind auto` picks exact `flat` search for small collections and HNSW
for large ones (retrieval.index.AUTO_TIERS); the manifest records what it chose.
The same build writes a BM25 index of the same chunks into `lexical/` (retrieval.lexical),
recorded in the manifest under `extra.lexical`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from retrieval.chunking import Chunk, ChunkingParams, chunk_document
from retrieval.documents import load_documents
from retrieval.embedding import Embedder
from retrieval.index import AUTO_TIERS, AutoTiers, FaissIndex, IndexedChunk, IndexParams, Manifest
from retrieval.lexical import MANIFEST_KEY as LEXICAL_MANIFEST_KEY
from retrieval.lexical import LexicalIndex
from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference

logger = logging.getLogger(__name__)


def build_index(
    input_dir: Path,
    output_dir: Path,
    embedder: Embedder,
    embedding_model: str,
    chunking: ChunkingParams,
    index_params: IndexParams,
    show_progress: bool = True,
    auto_tiers: AutoTiers = AUTO_TIERS,
) -> FaissIndex:
    """Chunk, embed and index every document under `input_dir`; write it to `output_dir`.
    An `auto` index kind is chosen from the number of chunks by `auto_tiers`.

    The new index is written beside the old one and swapped in with a rename, so a reader
    never sees a half-written index.
    """
    documents = load_documents(input_dir)
    if not documents:
        raise ValueError(f"no .txt, .md or .jsonl documents under {input_dir}")
    chunks = [
        chunk
        for document in tqdm(documents, desc="chunking", unit="doc", disable=not show_progress)
        for chunk in chunk_document(document, embedder.token_offsets, chunking)
    ]
    logger.info("%d documents -> %d chunks", len(documents), len(chunks))
    chunk_vectors = embedder.encode([c.text for c in chunks], show_progress=show_progress)
    indexed_chunks, sentence_texts = index_sentences(chunks)
    sentence_vectors = embedder.encode(sentence_texts, show_progress=show_progress)
    manifest = Manifest(
        embedding_model=embedding_model,
        dimension=int(chunk_vectors.shape[1]),
        num_chunks=len(chunks),
        num_sentences=len(sentence_texts),
        index={},
        chunking=asdict(chunking),
        extra={
            "num_documents": len(documents),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            # Two builds of the same counts in the same second still get distinct versions.
            "build_id": uuid.uuid4().hex,
        },
    )
    # BM25 over the same chunk texts, rows aligned with FAISS; in the manifest, so the version
    # covers it.
    lexical = LexicalIndex.build([c.text for c in chunks])
    manifest.extra[LEXICAL_MANIFEST_KEY] = lexical.describe()
    index = FaissIndex.build(
        chunk_vectors, indexed_chunks, sentence_vectors, manifest, index_params, auto_tiers
    )
    _save_atomically(index, Path(output_dir), lexical)
    return index


def index_sentences(chunks: Sequence[Chunk]) -> tuple[list[IndexedChunk], list[str]]:
    """Give each distinct sentence one row (overlapping chunks share rows)."""
    rows: dict[str, int] = {}
    indexed = []
    for chunk in chunks:
        chunk_rows = tuple(rows.setdefault(sentence, len(rows)) for sentence in chunk.sentences)
        indexed.append(IndexedChunk(chunk=chunk, sentence_rows=chunk_rows))
    return indexed, list(rows)


def _save_atomically(
    index: FaissIndex, output_dir: Path, lexical: LexicalIndex | None = None
) -> None:
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    # mkdtemp makes the folder owner-only; the published index should follow the umask.
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    try:
        index.save(staging)
        if lexical is not None:
            lexical.save(staging)
        if output_dir.exists():
            retired = output_dir.with_name(f".{output_dir.name}.old")
            shutil.rmtree(retired, ignore_errors=True)
            output_dir.rename(retired)
            staging.rename(output_dir)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, type=Path, help="folder of .txt/.md/.jsonl")
    parser.add_argument("--output", required=True, type=Path, help="index folder to write")
    parser.add_argument("--embedding-model", default=DEFAULT_EMBEDDING_MODEL)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--chunk-tokens", type=int, default=ChunkingParams.chunk_tokens)
    parser.add_argument("--overlap-tokens", type=int, default=ChunkingParams.overlap_tokens)
    parser.add_argument(
        "--index-kind",
        choices=["auto", "flat", "hnsw", "ivf"],
        default="auto",
        help="auto: chosen by the number of chunks, with its own parameters (the options "
        "below apply to the explicit kinds)",
    )
    parser.add_argument("--hnsw-m", type=int, default=IndexParams.hnsw_m)
    parser.add_argument(
        "--hnsw-ef-construction", type=int, default=IndexParams.hnsw_ef_construction
    )
    parser.add_argument("--ivf-nlist", type=int, default=IndexParams.ivf_nlist)
    parser.add_argument("--nprobe", type=int, help="IVF lists searched, kept in the manifest")
    parser.add_argument("--ef-search", type=int, help="HNSW search breadth, kept in the manifest")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    started = time.perf_counter()
    embedder = Embedder.load(
        resolve_model_reference(args.embedding_model), args.device, args.batch_size
    )
    index = build_index(
        args.input,
        args.output,
        embedder,
        args.embedding_model,
        ChunkingParams(args.chunk_tokens, args.overlap_tokens),
        IndexParams(
            kind=args.index_kind,
            hnsw_m=args.hnsw_m,
            ivf_nlist=args.ivf_nlist,
            hnsw_ef_construction=args.hnsw_ef_construction,
            nprobe=args.nprobe,
            ef_search=args.ef_search,
        ),
        show_progress=not args.quiet,
    )
    logger.info(
        "wrote %s: %d chunks, %d sentences, %s index %s in %.1f s",
        args.output,
        index.manifest.num_chunks,
        index.manifest.num_sentences,
        index.manifest.index["kind"],
        index.search_params,
        time.perf_counter() - started,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
