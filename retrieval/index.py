"""A FAISS vector index saved beside its chunk metadata and sentence embeddings.

Vectors are unit-normalised, so inner product is cosine similarity. `flat` is exact search
(right for small collections); `hnsw` and `ivf` are approximate, for large ones; `auto` picks
one of them from the number of chunks (`AUTO_TIERS`, measured by bench.retrieval_scale,
docs/retired.md). On a machine where faiss sees a GPU, `flat` and `ivf` indexes are moved
to it when asked.

An approximate index's search breadth (`nprobe`, `ef_search`) is stored in the manifest when
the build sets it, and applied on load; the retriever's config overrides it when set.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from pipeline.messages import RetrievedChunk
from retrieval.chunking import Chunk

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "hnsw", "ivf"]
RequestedKind = Literal["auto", "flat", "hnsw", "ivf"]
INDEX_FILE = "index.faiss"
CHUNKS_FILE = "chunks.jsonl"
SENTENCES_FILE = "sentence_embeddings.npy"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class IndexParams:
    """How to build the FAISS index; `auto` is resolved to a kind by `resolve_index_params`.

    `hnsw_ef_construction` 40 is faiss's own default. `nprobe` / `ef_search` (None: faiss's
    defaults, 1 and 16) are written to the manifest and set again on every load."""

    kind: RequestedKind = "flat"
    hnsw_m: int = 32
    ivf_nlist: int = 1024
    hnsw_ef_construction: int = 40
    nprobe: int | None = None
    ef_search: int | None = None


# What `auto` builds, by collection size: the first tier whose bound (chunks, inclusive) holds
# the collection; None is no bound. Measured by bench.retrieval_scale (docs/retired.md) on one core
# (docs/retired.md, "Retrieval at scale"): exact search while it meets the 5 ms p50 goal
# (2.6 ms at 50k chunks, 7.4 ms at 100k); above, HNSW. At 1M, efConstruction 100 (not faiss's
# 40) lifts recall@10 at efSearch 256 from 0.96 to 0.99 for 1.7x the build time, and
# efSearch 256 spends under half the budget (p50 1.4 ms) on margin over the cheapest setting
# that passes (128). Unmeasured beyond 1M chunks: raise retriever.ef_search there.
AutoTiers = Sequence[tuple[int | None, IndexParams]]
AUTO_TIERS: AutoTiers = (
    (50_000, IndexParams(kind="flat")),
    (None, IndexParams(kind="hnsw", hnsw_m=32, hnsw_ef_construction=100, ef_search=256)),
)


def resolve_index_params(
    params: IndexParams, num_chunks: int, tiers: AutoTiers = AUTO_TIERS
) -> IndexParams:
    """`params` itself for an explicit kind; for `auto`, the first of `tiers` whose bound
    holds `num_chunks` (a tier may not itself be `auto`)."""
    if params.kind != "auto":
        return params
    for max_chunks, tier in tiers:
        if max_chunks is None or num_chunks <= max_chunks:
            if tier.kind == "auto":
                raise ValueError("an auto tier must name a kind")
            return tier
    raise ValueError(f"no auto tier holds {num_chunks} chunks: end the tiers with a None bound")


@dataclass(frozen=True)
class IndexedChunk:
    """A chunk as stored in the index: its sentences' rows in the sentence-embedding matrix."""

    chunk: Chunk
    sentence_rows: tuple[int, ...]


@dataclass
class Manifest:
    embedding_model: str
    dimension: int
    num_chunks: int
    num_sentences: int
    index: dict
    chunking: dict
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SearchHit:
    position: int
    score: float


class FaissIndex:
    """Chunk vectors in FAISS plus what is needed to build a prompt from a hit."""

    def __init__(
        self,
        faiss_index,
        chunks: Sequence[IndexedChunk],
        sentence_embeddings: np.ndarray,
        manifest: Manifest,
    ) -> None:
        self._index = faiss_index
        self.chunks = list(chunks)
        self.sentence_embeddings = sentence_embeddings
        self.manifest = manifest

    @classmethod
    def build(
        cls,
        chunk_embeddings: np.ndarray,
        chunks: Sequence[IndexedChunk],
        sentence_embeddings: np.ndarray,
        manifest: Manifest,
        params: IndexParams,
        auto_tiers: AutoTiers = AUTO_TIERS,
    ) -> FaissIndex:
        """Create and fill the FAISS index for `chunk_embeddings` (one row per chunk); an
        `auto` kind is resolved from the number of chunks by `auto_tiers`, and the manifest
        records the resolved parameters."""
        if len(chunk_embeddings) != len(chunks):
            raise ValueError("one embedding row per chunk is required")
        params = resolve_index_params(params, len(chunks), auto_tiers)
        faiss_index = new_faiss_index(chunk_embeddings, params)
        faiss_index.add(chunk_embeddings)
        manifest.index = asdict(params)
        index = cls(faiss_index, chunks, sentence_embeddings, manifest)
        index.set_search_params(nprobe=params.nprobe, ef_search=params.ef_search)
        return index

    def save(self, directory: Path) -> None:
        """Write the index, chunks, sentence embeddings and manifest into `directory`."""
        import faiss

        directory.mkdir(parents=True, exist_ok=True)
        faiss.write_index(_to_cpu(self._index), str(directory / INDEX_FILE))
        with (directory / CHUNKS_FILE).open("w", encoding="utf-8") as out:
            for item in self.chunks:
                record = asdict(item.chunk) | {"sentence_rows": list(item.sentence_rows)}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        np.save(directory / SENTENCES_FILE, self.sentence_embeddings)
        (directory / MANIFEST_FILE).write_text(json.dumps(asdict(self.manifest), indent=2))

    @classmethod
    def load(
        cls, directory: Path, use_gpu: bool = False, with_sentence_embeddings: bool = True
    ) -> FaissIndex:
        """Read an index written by `save`; move it to the GPUs when asked and available.

        A searcher that never compresses can skip the sentence embeddings (the largest file).
        """
        import faiss

        directory = Path(directory)
        manifest = read_manifest(directory)
        faiss_index = faiss.read_index(str(directory / INDEX_FILE))
        if use_gpu:
            faiss_index = _maybe_to_gpu(faiss_index, manifest.index.get("kind", "flat"))
        chunks = read_chunks(directory)
        sentence_embeddings = (
            np.load(directory / SENTENCES_FILE)
            if with_sentence_embeddings
            else np.zeros((0, manifest.dimension), dtype=np.float32)
        )
        if len(chunks) != faiss_index.ntotal:
            raise ValueError(f"{directory}: {len(chunks)} chunks but {faiss_index.ntotal} vectors")
        index = cls(faiss_index, chunks, sentence_embeddings, manifest)
        # Manifests written before these fields existed have neither: faiss's defaults stay.
        index.set_search_params(
            nprobe=manifest.index.get("nprobe"), ef_search=manifest.index.get("ef_search")
        )
        return index

    @property
    def faiss_index(self):
        """The faiss index itself (corpus.incremental copies it and reads its vectors)."""
        return self._index

    @property
    def version(self) -> str:
        """Identifies this build of the index (see `manifest_version`)."""
        return manifest_version(self.manifest)

    def retrieved_chunk(self, hit: SearchHit) -> RetrievedChunk:
        """A search hit as the retriever returns it: the chunk's identity, text and score."""
        chunk = self.chunks[hit.position].chunk
        return RetrievedChunk(
            chunk_id=chunk.chunk_id,
            doc_id=chunk.doc_id,
            title=chunk.title,
            text=chunk.text,
            score=hit.score,
            row=hit.position,
        )

    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Tune recall against speed for the approximate kinds (ignored by `flat`); None
        leaves a setting as it is."""
        if nprobe is not None and hasattr(self._index, "nprobe"):
            self._index.nprobe = nprobe
        if ef_search is not None and hasattr(self._index, "hnsw"):
            self._index.hnsw.efSearch = ef_search

    @property
    def search_params(self) -> dict[str, int]:
        """The search breadth in force: {"nprobe": n} for IVF, {"ef_search": n} for HNSW,
        {} for flat."""
        if hasattr(self._index, "nprobe"):
            return {"nprobe": int(self._index.nprobe)}
        if hasattr(self._index, "hnsw"):
            return {"ef_search": int(self._index.hnsw.efSearch)}
        return {}

    def search(self, queries: np.ndarray, top_k: int) -> list[list[SearchHit]]:
        """Top-k chunks per query row, best first; fewer when the index holds fewer chunks."""
        top_k = min(top_k, len(self.chunks))
        if top_k < 1:
            return [[] for _ in range(len(queries))]
        scores, positions = self._index.search(np.ascontiguousarray(queries), top_k)
        return [
            [SearchHit(int(p), float(s)) for p, s in zip(row_p, row_s, strict=True) if p >= 0]
            for row_p, row_s in zip(positions, scores, strict=True)
        ]


def new_faiss_index(embeddings: np.ndarray, params: IndexParams):
    """An empty FAISS index of `params.kind` (not `auto`), trained on `embeddings` for IVF;
    the caller adds the vectors. bench.retrieval_scale measures exactly these indexes."""
    import faiss

    dimension = embeddings.shape[1]
    if params.kind == "auto":
        raise ValueError("resolve an auto kind first (resolve_index_params)")
    if params.kind == "flat":
        return faiss.IndexFlatIP(dimension)
    if params.kind == "hnsw":
        hnsw = faiss.IndexHNSWFlat(dimension, params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = params.hnsw_ef_construction
        return hnsw
    nlist = ivf_lists(params, len(embeddings))
    quantizer = faiss.IndexFlatIP(dimension)
    index = faiss.IndexIVFFlat(quantizer, dimension, nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(embeddings)
    return index


def ivf_lists(params: IndexParams, num_vectors: int) -> int:
    """The number of IVF lists `new_faiss_index` trains for `num_vectors`: IVF needs training
    data, so `params.ivf_nlist` is capped at what the collection supports."""
    return max(1, min(params.ivf_nlist, num_vectors // 39))


def _maybe_to_gpu(faiss_index, kind: str):
    import faiss

    if not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0:
        logger.info("faiss sees no GPU; the index stays on the CPU")
        return faiss_index
    if kind == "hnsw":
        logger.info("faiss has no GPU HNSW; the index stays on the CPU")
        return faiss_index
    return faiss.index_cpu_to_all_gpus(faiss_index)


def _to_cpu(faiss_index):
    import faiss

    if hasattr(faiss, "index_gpu_to_cpu") and "Gpu" in type(faiss_index).__name__:
        return faiss.index_gpu_to_cpu(faiss_index)
    return faiss_index


def read_manifest(directory: Path) -> Manifest:
    """The manifest of the index in `directory`; a clear error when there is none."""
    path = Path(directory) / MANIFEST_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no index at {directory}: build one with `python -m retrieval.build`"
        )
    manifest = Manifest(**json.loads(path.read_text()))
    if manifest.format_version != FORMAT_VERSION:
        raise ValueError(f"index format {manifest.format_version} is not {FORMAT_VERSION}")
    return manifest


def manifest_version(manifest: Manifest) -> str:
    """A short digest of the manifest: two loads of the same build agree, two builds differ
    (the manifest records a random build id)."""
    canonical = json.dumps(asdict(manifest), sort_keys=True).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def read_chunks(directory: Path) -> list[IndexedChunk]:
    """Every chunk of the index in `directory`, in row order."""
    with (Path(directory) / CHUNKS_FILE).open(encoding="utf-8") as lines:
        return [_read_chunk(line) for line in lines]


def _read_chunk(line: str) -> IndexedChunk:
    record = json.loads(line)
    rows = tuple(record.pop("sentence_rows"))
    record["sentence_spans"] = tuple(tuple(span) for span in record["sentence_spans"])
    return IndexedChunk(chunk=Chunk(**record), sentence_rows=rows)
