"""How large can the index grow? Flat, IVF and HNSW at 10k, 100k and 1M chunks, on one core.

    python -m bench.retrieval_scale --sizes 10000 100000 1000000 --queries 1000 \\
        --out bench-results/retrieval-scale

Goal (issue 11): 1M chunks, search p50 <= 5 ms on one core, recall@10 >= 0.95 of exact.

The vectors are SYNTHETIC, not embeddings of text: 384-dim unit vectors (all-MiniLM-L6-v2's
shape) from a fixed-seed two-level Gaussian mixture (2,000 topics; a document per 10 chunks
near a topic; chunks near their document; a shared mean direction; a spectrum decaying as
i^-0.4), tuned to the real sentence embeddings of indexes/default (the geometry table compares
them; chunks of one document have cosine about 0.58, 0.61 in the real index). Queries are
fresh draws near random documents, noisier (real questions sit farther from chunks than chunks
from each other), never copies of indexed vectors. Uniform vectors would be the worst case for
IVF and HNSW and unlike embeddings; a few thousand blobs alone are too easy at 1M (IVF lists
line up with them). Real collections may still differ.

Per size and kind: build time (wall and CPU), index bytes (serialized), RSS growth over the
build; per search setting (IVF nprobe, HNSW efSearch), single-query latency (a batch of 1, as
the retriever searches) p50/p99 over --queries queries, and recall@10 against exact search with
a 95% bootstrap interval. faiss runs one thread, the process pinned to one core; other services
may share the machine (the load average is recorded). Per size, the chosen setting is the
fastest whose recall interval lies wholly at or above --min-recall. Writes
OUT/retrieval-scale.json and .md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from bench.bootstrap import mean, paired_ci
from bench.outputs import positive_int, write_json_and_markdown
from bench.stats import format_ms, percentile
from retrieval.index import SENTENCES_FILE, IndexParams, new_faiss_index, resolve_index_params

logger = logging.getLogger(__name__)

DIMENSION = 384
TOP_K = 10
BLOCK_ROWS = 65_536
KINDS = ("flat", "ivf", "hnsw")


@dataclass(frozen=True)
class SyntheticSpec:
    """Chunk = unit(mean_weight * shared direction + its document's centre + noise_weight *
    noise); document centre = unit(a topic + document_weight * noise); a query is drawn like a
    chunk of a random document, with the query weights. Noise follows the spectrum."""

    topics: int = 2_000
    chunks_per_document: int = 10
    decay: float = 0.4
    mean_weight: float = 0.6
    document_weight: float = 0.8
    noise_weight: float = 1.0
    query_mean_weight: float = 0.5
    query_noise_weight: float = 1.1
    seed: int = 0


@dataclass(frozen=True)
class Measurement:
    """One search setting of one index at one size; build figures repeat across settings."""

    size: int
    kind: str
    setting: str
    build_s: float
    build_cpu_s: float
    index_bytes: int
    rss_growth_bytes: int
    queries: int
    p50_ms: float
    p99_ms: float
    cpu_p50_ms: float
    recall: float
    recall_low: float
    recall_high: float


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def synthetic_collection(
    size: int, queries: int, spec: SyntheticSpec
) -> tuple[np.ndarray, np.ndarray]:
    """(`size` chunk vectors, `queries` query vectors), float32 unit rows drawn from `spec`."""
    model = np.random.default_rng(spec.seed)
    basis = np.linalg.qr(model.standard_normal((DIMENSION, DIMENSION)))[0].astype(np.float32)
    spectrum = np.arange(1, DIMENSION + 1, dtype=np.float32) ** -spec.decay
    spectrum /= np.linalg.norm(spectrum)
    shared = _unit(model.standard_normal(DIMENSION).astype(np.float32))
    rng = np.random.default_rng([spec.seed, size])

    def noise(source: np.random.Generator, rows: int) -> np.ndarray:
        return (source.standard_normal((rows, DIMENSION), dtype=np.float32) * spectrum) @ basis

    topics = _unit(noise(model, spec.topics))
    documents = max(1, size // spec.chunks_per_document)
    picked = topics[rng.integers(0, spec.topics, documents)]
    centres = _unit(picked + spec.document_weight * noise(rng, documents))

    def near_documents(rows: int, mean_weight: float, noise_weight: float) -> np.ndarray:
        picked = centres[rng.integers(0, documents, rows)]
        return _unit(mean_weight * shared + picked + noise_weight * noise(rng, rows))

    chunks = np.empty((size, DIMENSION), dtype=np.float32)
    for start in range(0, size, BLOCK_ROWS):  # blocks keep the temporaries small at 1M
        rows = min(BLOCK_ROWS, size - start)
        chunks[start : start + rows] = near_documents(rows, spec.mean_weight, spec.noise_weight)
    asked = near_documents(queries, spec.query_mean_weight, spec.query_noise_weight)
    return chunks, asked


def geometry(vectors: np.ndarray, sample: int = 2_000) -> dict[str, float]:
    """Mean pairwise cosine, norm of the mean vector and participation ratio (effective
    dimensions, (sum of PCA variances)^2 / sum of their squares) of up to `sample` rows."""
    rows = vectors[:sample].astype(np.float64)
    cosines = rows @ rows.T
    pairs = cosines[~np.eye(len(rows), dtype=bool)]
    variances = np.linalg.svd(rows - rows.mean(0), compute_uv=False) ** 2
    return {
        "rows": len(rows),
        "pair_cosine_mean": float(pairs.mean()),
        "mean_vector_norm": float(np.linalg.norm(rows.mean(0))),
        "participation_ratio": float(variances.sum() ** 2 / (variances**2).sum()),
    }


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Per query, the share of its exact top-k ids among the found ones (-1 never counts)."""
    return np.array([np.isin(e, f).mean() for f, e in zip(found, exact, strict=True)])


def time_single_queries(
    index: Any, queries: np.ndarray, warmup: int = 20
) -> tuple[list[float], list[float], np.ndarray]:
    """(wall ms, this thread's CPU ms, found ids) of searching `queries` one at a time for the
    top 10. CPU time leaves out waits for a core that other processes hold."""
    for row in queries[:warmup]:
        index.search(row[None, :], TOP_K)
    latencies, cpu, found = [], [], []
    for row in queries:
        started, cpu_started = time.perf_counter(), time.thread_time()
        _, ids = index.search(row[None, :], TOP_K)
        latencies.append((time.perf_counter() - started) * 1000)
        cpu.append((time.thread_time() - cpu_started) * 1000)
        found.append(ids[0])
    return latencies, cpu, np.array(found)


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def index_bytes(index: Any) -> int:
    """The serialized size, through a temporary file: no second in-memory copy at 1M."""
    import faiss

    with tempfile.NamedTemporaryFile(suffix=".faiss") as file:
        faiss.write_index(index, file.name)
        return os.path.getsize(file.name)


def build_params(kind: str, size: int, hnsw_m: int, ef_construction: int) -> IndexParams:
    """The index of each kind at `size`: IVF with about 4 * sqrt(size) lists."""
    if kind == "ivf":
        return IndexParams(kind="ivf", ivf_nlist=round(4 * size**0.5))
    return IndexParams(kind=cast(Any, kind), hnsw_m=hnsw_m, hnsw_ef_construction=ef_construction)


def measure_kind(
    kind: str, vectors: np.ndarray, queries: np.ndarray, exact: np.ndarray, args: Any
) -> list[Measurement]:
    """Build one index of `kind` over `vectors` and time each of its search settings."""
    params = build_params(kind, len(vectors), args.hnsw_m, args.hnsw_ef_construction)
    rss_before, started, cpu_started = rss_bytes(), time.perf_counter(), time.process_time()
    index = new_faiss_index(vectors, params)
    index.add(vectors)
    build_s, build_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    rss_growth = rss_bytes() - rss_before
    size_bytes = index_bytes(index)
    settings: list[tuple[str, int | None]] = [("exact", None)]
    if kind == "ivf":
        settings = [(f"nprobe={p} of {index.nlist}", p) for p in args.nprobes if p <= index.nlist]
    elif kind == "hnsw":
        settings = [(f"efSearch={e}", e) for e in args.ef_searches]
    rows = []
    for setting, value in settings:
        if kind == "ivf":
            index.nprobe = value
        elif kind == "hnsw":
            index.hnsw.efSearch = value
        latencies, cpu, found = time_single_queries(index, queries)
        # Paired against zeros, the interval is that of the mean recall itself.
        recall = paired_ci(recall_at_k(found, exact).tolist(), [0.0] * len(found), stat=mean)
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        build = (len(vectors), kind, setting, build_s, build_cpu_s, size_bytes, rss_growth)
        timing = (len(queries), p50, p99, percentile(cpu, 50))
        rows.append(Measurement(*build, *timing, recall.estimate, recall.low, recall.high))
        logger.info("%s", rows[-1])
    return rows


def choose(rows: Sequence[Measurement], min_recall: float) -> Measurement | None:
    """The fastest (lowest p50) setting whose recall interval lies at or above `min_recall`."""
    passing = [row for row in rows if row.recall_low >= min_recall]
    return min(passing, key=lambda row: row.p50_ms) if passing else None


def auto_choice(size: int) -> str:
    """What `retrieval.build --index-kind auto` builds for `size` chunks."""
    p = resolve_index_params(IndexParams(kind="auto"), size)
    return {"flat": "flat", "ivf": f"ivf nprobe={p.nprobe}"}.get(
        p.kind, f"hnsw M={p.hnsw_m} efC={p.hnsw_ef_construction} efSearch={p.ef_search}"
    )


def markdown(document: dict[str, Any]) -> str:
    """The run as Markdown: how it was measured, the data's geometry, every setting, and the
    chosen setting per size against the goal."""
    c = document["config"]
    lines = [
        f"Measured with `{c['command']}` on {document['date']} ({document['machine']}); "
        f"faiss {document['faiss']}, 1 thread, pinned to core {c['core']}; load average "
        f"{document['load_before']} before, {document['load_after']} after (other services "
        f"share the machine). n = {c['queries']} single-query searches per setting, top "
        f"{TOP_K}; recall@10 against exact search with a 95% bootstrap interval. HNSW M "
        f"{c['hnsw_m']}, efConstruction {c['hnsw_ef_construction']}; IVF about 4 sqrt(N) lists.",
        "",
        "Synthetic vectors (a two-level Gaussian mixture of topics and documents, not "
        "embeddings of text): " + ", ".join(f"{k} {v}" for k, v in document["synthetic"].items()),
        "",
        "| geometry | rows | pairwise cosine | mean-vector norm | effective dims |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {g['rows']} | {g['pair_cosine_mean']:.3f} | "
        f"{g['mean_vector_norm']:.2f} | {g['participation_ratio']:.0f} |"
        for name, g in document["geometry"].items()
    ]
    lines += [
        "",
        "| chunks | kind | setting | build s (CPU s) | index MB | RSS +MB | p50 ms | p99 ms "
        "| CPU p50 ms | recall@10 [95% CI] |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['size']:,} | {r['kind']} | {r['setting']} | {r['build_s']:,.1f} "
        f"({r['build_cpu_s']:,.1f}) | {r['index_bytes'] / 1e6:,.0f} | "
        f"{r['rss_growth_bytes'] / 1e6:,.0f} | {r['p50_ms']:,.2f} | {r['p99_ms']:,.2f} | "
        f"{r['cpu_p50_ms']:,.2f} | {r['recall']:.3f} "
        f"[{r['recall_low']:.3f}, {r['recall_high']:.3f}] |"
        for r in document["rows"]
    ]
    goal = f"p50 <= {format_ms(c['max_p50_ms'])} ms, recall@10 >= {c['min_recall']}"
    lines += ["", f"| chunks | fastest setting meeting recall | p50 ms | {goal} | auto builds |"]
    lines.append("|---:|---|---:|---|---|")
    for size, best in document["chosen"].items():
        met = "yes" if best and best["p50_ms"] <= c["max_p50_ms"] else "no"
        setting = f"{best['kind']} {best['setting']}" if best else "none"
        p50 = f"{best['p50_ms']:,.2f}" if best else "-"  # two decimals: most are under 1 ms
        lines.append(f"| {int(size):,} | {setting} | {p50} | {met} | {auto_choice(int(size))} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [
        ("--sizes", [10_000, 100_000, 1_000_000]),
        ("--nprobes", [4, 8, 16, 32, 64, 128, 256]),
        ("--ef-searches", [16, 32, 64, 128, 256, 512]),
    ]:
        parser.add_argument(name, type=positive_int, nargs="+", default=default)
    parser.add_argument("--queries", type=positive_int, default=1000)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--topics", type=positive_int, default=SyntheticSpec.topics)
    parser.add_argument("--hnsw-m", type=positive_int, default=32)
    parser.add_argument("--hnsw-ef-construction", type=positive_int, default=40)
    parser.add_argument("--min-recall", type=float, default=0.95)
    parser.add_argument("--max-p50-ms", type=float, default=5.0)
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--real-index", type=Path, default=Path("indexes/default"))
    parser.add_argument("--out", type=Path, default=Path("bench-results/retrieval-scale"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    import faiss

    os.sched_setaffinity(0, {args.core})
    faiss.omp_set_num_threads(1)
    spec = SyntheticSpec(topics=args.topics)
    sample, asked = synthetic_collection(20_000, args.queries, spec)
    geometries = {"synthetic chunks": geometry(sample), "synthetic queries": geometry(asked)}
    if (args.real_index / SENTENCES_FILE).exists():
        real = np.load(args.real_index / SENTENCES_FILE)
        geometries[f"real sentences ({args.real_index})"] = geometry(real)
    load_before, started = os.getloadavg(), time.perf_counter()
    rows: list[Measurement] = []
    chosen: dict[str, dict | None] = {}
    for size in args.sizes:
        vectors, queries = synthetic_collection(size, args.queries, spec)
        exact = faiss.knn(queries, vectors, TOP_K, faiss.METRIC_INNER_PRODUCT)[1]
        size_rows = [
            row for kind in args.kinds for row in measure_kind(kind, vectors, queries, exact, args)
        ]
        rows += size_rows
        best = choose(size_rows, args.min_recall)
        chosen[str(size)] = asdict(best) if best else None
        del vectors
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    document = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {memory_gib:.0f} GiB",
        "faiss": faiss.__version__,
        "load_before": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - started, 1),
        "config": config | {"command": "python -m bench.retrieval_scale " + " ".join(argv)},
        "synthetic": asdict(spec),
        "geometry": geometries,
        "rows": [asdict(row) for row in rows],
        "chosen": chosen,
    }
    for path in write_json_and_markdown(args.out, "retrieval-scale", document, markdown(document)):
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
