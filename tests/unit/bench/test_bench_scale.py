"""bench.scale's pure parts: the request specs, the replica overrides (written as a real
variant of serve_config.yaml and validated by app.config), a load point's figures, the
prefix-cache hit rate and the plots. No part that starts the service is run."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

from app.config import ConfigError, parse_config
from bench import scale
from bench.loadgen import RequestRecord
from harness.variant import first_application, write_variant

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[3]
PNG = b"\x89PNG\r\n\x1a\n"


def test_rag_specs():
    count = len(scale.QUESTIONS) + 2
    specs = scale.rag_specs(count, offset=3)

    assert len(specs) == count
    assert specs[0].question == f"{scale.QUESTIONS[3]} (#3)"
    wrap = len(scale.QUESTIONS) - 3
    assert specs[wrap].question == f"{scale.QUESTIONS[0]} (#{3 + wrap})"  # they cycle
    assert len({spec.question for spec in specs}) == count
    assert {(spec.endpoint, spec.max_tokens) for spec in specs} == {("rag", scale.MAX_TOKENS)}
    assert scale.rag_specs(0) == []


@pytest.mark.parametrize("count", [1, 2])
def test_replicas_overrides_scale_the_light_stages_only(count):
    overrides = scale.replicas_overrides(count)

    assert overrides == {
        "ingress.deployment.num_replicas": count,
        "retriever.deployment.num_replicas": count,
        "compression.deployment.num_replicas": count,
        "ingress.deployment.num_cpus": 0.05,
        "retriever.deployment.num_cpus": 0.05,
        "compression.deployment.num_cpus": 0.05,
    }
    assert not any(key.startswith("generator.") for key in overrides)


@pytest.mark.parametrize("count", [1, 2])
def test_the_overrides_make_a_valid_variant_of_the_shipped_config(tmp_path, count):
    out = write_variant(
        ROOT / "serve_config.yaml", scale.PACED | scale.replicas_overrides(count),
        tmp_path / f"replicas-{count}.yaml", 8123,
    )  # fmt: skip

    document, application = first_application(out)
    config = parse_config(application["args"])
    assert document["http_options"]["port"] == 8123
    for stage in (config.ingress, config.retriever, config.compression):
        assert stage.deployment.num_replicas == count
        assert stage.deployment.num_cpus == 0.05
    assert config.generator.engine == "paced"
    assert (config.generator.paced.ttft_ms, config.generator.paced.tpot_ms) == (50.0, 5.0)
    assert config.in_flight_limit() == 500
    assert config.ingress.deployment.max_ongoing_requests == 1000
    assert config.generator.deployment.max_ongoing_requests == 256
    assert config.generator.deployment.num_replicas == 1  # the generator is not scaled
    assert config.compression.llmlingua.enabled is False


def test_a_misspelt_stage_would_be_caught_by_the_same_validation(tmp_path):
    # What validating the overrides buys: the readiness name of the stage is not its key.
    with pytest.raises(ConfigError, match="compressor"):
        write_variant(
            ROOT / "serve_config.yaml", {"compressor.deployment.num_replicas": 2},
            tmp_path / "bad.yaml",
        )  # fmt: skip
    assert not (tmp_path / "bad.yaml").exists()


# --- point and hit_rate -------------------------------------------------------------------


def rec(index: int, **fields) -> RequestRecord:
    return RequestRecord(index, "rag", f"q{index}", **fields)


def test_point_figures():
    records = [
        rec(0, ok=True, status=200, send_at_ms=0.0, end_at_ms=900.0, ttft_ms=100.0),
        rec(1, ok=True, status=200, send_at_ms=100.0, end_at_ms=1200.0, ttft_ms=300.0),
        rec(2, ok=True, status=200, send_at_ms=200.0, end_at_ms=1500.0, ttft_ms=None),
        rec(3, status=503, error_kind="http_503", error_code="overloaded", retry_after="1",
            send_at_ms=300.0, end_at_ms=310.0, ttft_ms=None),
        rec(4, status=200, error_kind="timeout", send_at_ms=400.0, end_at_ms=2000.0,
            ttft_ms=50.0),  # failed: its TTFT does not count
        rec(5, error_kind="not_sent"),
    ]  # fmt: skip

    result = scale.point(records)

    assert (result["sent"], result["succeeded"], result["refused"]) == (5, 3, 1)
    assert (result["hung"], result["not_sent"]) == (1, 1)
    assert result["throughput_rps"] == pytest.approx(1.5)  # 3 answers from 0 to 2,000 ms
    assert result["ttft_ms"] == [100.0, 300.0]
    assert result["ttft_ms_p50"] == 200.0
    assert result["ttft_ms_p99"] == pytest.approx(298.0)


def test_point_with_no_answers():
    result = scale.point([rec(0, status=500, error_kind="http_500", send_at_ms=0.0,
                              end_at_ms=0.0)])  # fmt: skip
    assert result["throughput_rps"] is None  # no time elapsed
    assert result["ttft_ms_p50"] is None and result["ttft_ms"] == []
    assert result["failed"] == 1


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (rec(0, ok=True, usage_prompt_tokens=40, usage_cached_prompt_tokens=30), 0.75),
        (rec(0, ok=True, usage_prompt_tokens=40, usage_cached_prompt_tokens=None), 0.0),
        (rec(0, ok=True, usage_prompt_tokens=40, usage_cached_prompt_tokens=40), 1.0),
        (rec(0, ok=True, usage_prompt_tokens=None, usage_cached_prompt_tokens=3), None),
        (rec(0, ok=True, usage_prompt_tokens=0, usage_cached_prompt_tokens=0), None),
        (rec(0, ok=False, usage_prompt_tokens=40, usage_cached_prompt_tokens=30), None),
    ],
)
def test_hit_rate(record, expected):
    assert scale.hit_rate(record) == expected


# --- plot ---------------------------------------------------------------------------------


@pytest.fixture
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def replicas_rows() -> list[dict]:
    return [
        {"replicas": count, "offered_rps": rate, "throughput_rps": rate * 0.9 * count,
         "ttft_ms_p99": 500.0 / count}
        for count in (1, 2)
        for rate in (10.0, 20.0)
    ]  # fmt: skip


AUTOSCALE = {
    "steps": [[5.0, 2.0], [40.0, 2.0], [0.0, 2.0]],  # as read back from scale.json
    "config": {},
    "counts": {},
    "replicas": [
        {"t_s": 0.0, "retriever": 1, "compressor": 1},
        {"t_s": 2.5, "retriever": 2, "compressor": None},  # a failed /readyz poll
        {"t_s": 5.0, "retriever": 3, "compressor": 2},
    ],
}


def test_plot_writes_both_figures(tmp_path, close_figures):
    written = scale.plot({"date": "d", "replicas": replicas_rows(), "autoscale": AUTOSCALE},
                         tmp_path)  # fmt: skip

    assert written == [tmp_path / "replicas.png", tmp_path / "autoscale.png"]
    for path in written:
        assert path.read_bytes().startswith(PNG)
        assert path.stat().st_size > 5000


def test_plot_writes_only_the_figures_of_the_parts_that_ran(tmp_path, close_figures):
    assert scale.plot({"autoscale": AUTOSCALE}, tmp_path) == [tmp_path / "autoscale.png"]
    assert not (tmp_path / "replicas.png").exists()
    assert scale.plot({"date": "d", "routing": {}}, tmp_path / "none") == []


def test_plot_tolerates_points_without_figures(tmp_path, close_figures):
    rows = replicas_rows()
    rows[0] |= {"throughput_rps": None, "ttft_ms_p99": None}  # nothing answered there
    assert scale.plot({"replicas": rows}, tmp_path) == [tmp_path / "replicas.png"]
    assert (tmp_path / "replicas.png").read_bytes().startswith(PNG)
