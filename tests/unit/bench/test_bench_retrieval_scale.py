"""bench.retrieval_scale's parts on tiny data: the synthetic vectors, their geometry, recall,
the choice of setting, the Markdown, and one real run of the command on a few hundred vectors
(real faiss; the process is not pinned here)."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import asdict, replace

import numpy as np
import pytest

from bench import retrieval_scale as scale
from bench.retrieval_scale import Measurement, SyntheticSpec
from retrieval.index import AUTO_TIERS

SMALL = SyntheticSpec(topics=20)


def row(kind: str = "hnsw", setting: str = "efSearch=32", p50: float = 1.0, **kw) -> Measurement:
    figures = {"recall": 0.96, "recall_low": 0.95, "recall_high": 0.97} | kw
    figures |= {"p50_ms": p50, "p99_ms": 2 * p50, "cpu_p50_ms": 0.9 * p50}
    return Measurement(1000, kind, setting, 1.5, 1.2, 2_000_000, 1_000_000, 50, **figures)


def test_synthetic_collections_are_deterministic_float32_unit_rows():
    chunks, queries = scale.synthetic_collection(300, 40, SMALL)

    assert chunks.shape == (300, scale.DIMENSION) and queries.shape == (40, scale.DIMENSION)
    assert chunks.dtype == queries.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(chunks, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
    again = scale.synthetic_collection(300, 40, SMALL)
    np.testing.assert_array_equal(chunks, again[0])
    np.testing.assert_array_equal(queries, again[1])
    other_seed = scale.synthetic_collection(300, 40, replace(SMALL, seed=1))[0]
    assert not np.array_equal(chunks, other_seed)


def test_blocks_keep_the_shape_and_queries_are_not_copies_of_chunks(monkeypatch):
    monkeypatch.setattr(scale, "BLOCK_ROWS", 64)
    chunks, queries = scale.synthetic_collection(200, 50, SMALL)

    assert chunks.shape == (200, scale.DIMENSION)
    assert (queries @ chunks.T).max() < 0.99  # fresh draws, no indexed vector repeated


def nearest_cosine(x: np.ndarray) -> float:
    cosines = x @ x.T
    np.fill_diagonal(cosines, -1)
    return float(np.median(cosines.max(axis=1)))


def test_the_vectors_are_clustered_not_uniform():
    # 400 chunks of 40 documents: each chunk's nearest neighbour is of its own document.
    chunks, queries = scale.synthetic_collection(400, 50, SMALL)
    uniform = np.random.default_rng(0).standard_normal((400, scale.DIMENSION))
    uniform /= np.linalg.norm(uniform, axis=1, keepdims=True)

    assert nearest_cosine(chunks) > 0.45 > 0.3 > nearest_cosine(uniform)
    # Each query is near some document of the collection: its best chunk stands out.
    assert np.median((queries @ chunks.T).max(axis=1)) > 0.35


def test_geometry_of_an_orthonormal_basis():
    # Four basis vectors: orthogonal pairs, mean (1/4, ...) of norm 1/2, and once centred
    # they span 3 dimensions equally.
    figures = scale.geometry(np.eye(4, dtype=np.float32))

    assert figures == pytest.approx(
        {"rows": 4, "pair_cosine_mean": 0.0, "mean_vector_norm": 0.5, "participation_ratio": 3.0}
    )
    assert scale.geometry(np.eye(4), sample=2)["rows"] == 2


def test_recall_is_the_share_of_exact_ids_found_per_query():
    exact = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    found = np.array([[4, 3, 2, 1], [5, 6, 0, -1], [-1, -1, -1, -1]])

    np.testing.assert_allclose(scale.recall_at_k(found, exact), [1.0, 0.5, 0.0])


def test_choose_takes_the_fastest_setting_whose_interval_clears_the_bar():
    slow = row("flat", "exact", p50=9.0, recall=1.0, recall_low=1.0, recall_high=1.0)
    fast_but_unsure = row(p50=0.1, recall=0.951, recall_low=0.94)
    fast = row(p50=0.5, recall=0.97, recall_low=0.96)

    assert scale.choose([slow, fast_but_unsure, fast], 0.95) == fast
    assert scale.choose([slow, fast_but_unsure, fast], 0.999) == slow
    assert scale.choose([fast_but_unsure], 0.95) is None


def test_build_params_size_ivf_by_the_square_root_of_the_collection():
    assert scale.build_params("ivf", 1_000_000, 32, 40).ivf_nlist == 4000
    hnsw = scale.build_params("hnsw", 1_000_000, 16, 80)
    assert (hnsw.kind, hnsw.hnsw_m, hnsw.hnsw_ef_construction) == ("hnsw", 16, 80)


def test_measure_kind_with_real_faiss_on_tiny_data():
    vectors, queries = scale.synthetic_collection(600, 20, SMALL)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, : scale.TOP_K]
    args = Namespace(hnsw_m=8, hnsw_ef_construction=40, nprobes=[1, 15, 64], ef_searches=[600])

    flat = scale.measure_kind("flat", vectors, queries, exact, args)
    ivf = scale.measure_kind("ivf", vectors, queries, exact, args)
    hnsw = scale.measure_kind("hnsw", vectors, queries, exact, args)

    assert [(r.setting, r.recall) for r in flat] == [("exact", 1.0)]
    # 600 vectors train 600 // 39 = 15 lists; nprobe 64 is more than there are.
    assert [r.setting for r in ivf] == ["nprobe=1 of 15", "nprobe=15 of 15"]
    assert ivf[1].recall == 1.0 and ivf[0].recall < 1.0
    assert hnsw[0].recall == 1.0  # efSearch above the collection size: exhaustive
    for r in flat + ivf + hnsw:
        assert r.size == 600 and r.queries == 20
        assert r.index_bytes > 600 * scale.DIMENSION * 4
        assert 0 < r.p50_ms <= r.p99_ms
        assert r.cpu_p50_ms >= 0
        assert r.build_s > 0
        assert r.build_cpu_s >= 0
        assert r.recall_low <= r.recall <= r.recall_high


def document(chosen: dict) -> dict:
    return {
        "date": "2026-01-01",
        "machine": "2 cores, 24 GiB",
        "faiss": "1.0",
        "load_before": [1.0, 1.0, 1.0],
        "load_after": [2.0, 1.0, 1.0],
        "config": {"command": "python -m bench.retrieval_scale --sizes 1000", "core": 1}
        | {"queries": 50, "max_p50_ms": 5.0, "min_recall": 0.95}
        | {"hnsw_m": 32, "hnsw_ef_construction": 40},
        "synthetic": asdict(SMALL),
        "geometry": {"synthetic chunks": scale.geometry(np.eye(4))},
        "rows": [asdict(row())],
        "chosen": chosen,
    }


def test_markdown_states_the_command_n_the_data_and_the_verdict():
    text = scale.markdown(document({"1000": asdict(row(p50=0.25)), "2000000": None}))

    assert "`python -m bench.retrieval_scale --sizes 1000`" in text
    assert "n = 50 single-query searches" in text
    assert "pinned to core 1" in text
    assert "HNSW M 32, efConstruction 40" in text
    assert "Synthetic vectors" in text and "topics 20" in text
    assert "| synthetic chunks | 4 | 0.000 | 0.50 | 3 |" in text
    assert (
        "| 1,000 | hnsw | efSearch=32 | 1.5 (1.2) | 2 | 1 | 1.00 | 2.00 | 0.90 "
        "| 0.960 [0.950, 0.970] |" in text
    )
    auto_small = scale.auto_choice(1000)
    assert f"| 1,000 | hnsw efSearch=32 | 0.25 | yes | {auto_small} |" in text
    assert f"| 2,000,000 | none | - | no | {scale.auto_choice(2_000_000)} |" in text


def test_auto_choice_names_what_the_builder_picks():
    assert scale.auto_choice(10) == "flat"
    largest = AUTO_TIERS[-1][1]
    expected = f"hnsw M={largest.hnsw_m} efC={largest.hnsw_ef_construction} efSearch="
    assert scale.auto_choice(10_000_000) == f"{expected}{largest.ef_search}"


@pytest.fixture
def faiss_threads():
    import faiss

    threads = faiss.omp_get_max_threads()
    yield
    faiss.omp_set_num_threads(threads)


def test_the_command_writes_json_and_markdown(tmp_path, monkeypatch, faiss_threads):
    pinned: list[set[int]] = []
    monkeypatch.setattr(scale.os, "sched_setaffinity", lambda pid, cores: pinned.append(cores))
    argv = ["--sizes", "400", "--queries", "10", "--nprobes", "2", "--ef-searches", "16"]
    argv += ["--topics", "20"]
    argv += ["--core", "0", "--real-index", str(tmp_path / "none"), "--out", str(tmp_path)]

    assert scale.main(argv) == 0

    result = json.loads((tmp_path / "retrieval-scale.json").read_text())
    assert pinned == [{0}]
    assert [(r["kind"], r["setting"]) for r in result["rows"]] == [
        ("flat", "exact"),
        ("ivf", "nprobe=2 of 10"),
        ("hnsw", "efSearch=16"),
    ]
    assert result["config"]["command"] == "python -m bench.retrieval_scale " + " ".join(argv)
    assert set(result["geometry"]) == {"synthetic chunks", "synthetic queries"}
    assert result["chosen"]["400"] is not None
    assert result["synthetic"] == asdict(SMALL)
    assert (
        "python -m bench.retrieval_scale --sizes 400"
        in (tmp_path / "retrieval-scale.md").read_text()
    )
