"""bench.direct, the CLI of the pipeline-against-vLLM ablation: reading the serve config,
refusing bad arguments before anything starts, and a whole run with its phases replaced by
hand-made records (no model loads, no server starts). Its parts have their own tests:
test_bench_final_prompts, test_bench_vllm_server, test_bench_direct_comparison,
test_bench_direct_report and, for the servers' processes, test_bench_service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from direct_records import rec

from app.config import ConfigError
from bench import direct
from bench.direct import read_serve_config
from bench.final_prompts import FinalPrompt

ROOT = Path(__file__).resolve().parents[3]


# --- the config ---------------------------------------------------------------------------


def test_shipped_serve_config_reads_with_its_replica_environment():
    serve_config = read_serve_config(ROOT / "serve_config.yaml")
    assert serve_config.env_vars["HF_HUB_OFFLINE"] == "1"
    assert serve_config.app.generator.env_vars  # VLLM_CPU_KVCACHE_SPACE and the like


def test_serve_config_errors_name_the_problem(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": []}))
    with pytest.raises(ValueError, match="no 'applications'"):
        read_serve_config(path)
    path.write_text(yaml.safe_dump({"applications": [{"runtime_env": {"env_vars": [1]}}]}))
    with pytest.raises(ValueError, match="env_vars is not a mapping"):
        read_serve_config(path)
    path.write_text(yaml.safe_dump({"applications": [{"args": {"generator": {"bogus": 1}}}]}))
    with pytest.raises(ConfigError, match=r"generator\.bogus"):
        read_serve_config(path)
    path.write_text(yaml.safe_dump({"applications": [{"args": {}}]}))
    assert read_serve_config(path).env_vars == {}


# --- CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-requests", "0"], "--num-requests must be at least 1"),
        (["--max-tokens", "100000"], "--max-tokens must be in 1.."),
        (["--ready-timeout-s", "0"], "--ready-timeout-s must be a positive number"),
    ],
)
def test_cli_refuses_bad_arguments_before_starting_anything(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        direct.main(["--out", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_refuses_llmlingua_when_the_config_does_not_load_it(tmp_path, capsys):
    document = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = document["applications"][0]["args"]
    args["compression"]["llmlingua"]["enabled"] = False
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps(document))  # JSON is YAML
    with pytest.raises(SystemExit):
        direct.main(["--out", str(tmp_path / "out"), "--base-config", str(config),
                     "--compression", "llmlingua"])  # fmt: skip
    assert "needs compression.llmlingua.enabled" in capsys.readouterr().err


def final_prompt(job) -> FinalPrompt:
    messages = ({"role": "system", "content": "s"}, {"role": "user", "content": job.question})
    return FinalPrompt(job.question, messages, 900, job.plan.method, 800, 400, False)


@pytest.mark.parametrize(("direct_prompt_tokens", "code"), [(900, 0), (901, 1)])
def test_cli_runs_both_phases_on_the_same_prompts_and_writes_the_comparison(
    tmp_path, monkeypatch, capsys, direct_prompt_tokens, code
):
    calls: dict[str, tuple] = {}

    def build(config, jobs):
        calls["build"] = (config, jobs)
        return [final_prompt(job) for job in jobs]

    def pipeline_phase(base_config, questions, method, settings):
        calls["pipeline"] = (base_config, questions, method, settings)
        timings = {"retrieve": 20.0, "compress": 5.0, "ttft": 260.0, "total": 900.0}
        return [rec(i, ttft=300, e2e=1300, timings=timings) for i in range(len(questions))]

    def direct_phase(generator, app_env_vars, warm_prompt, prompts, settings):
        calls["direct"] = (generator, app_env_vars, warm_prompt, prompts, settings)
        records = [
            rec(i, ttft=200, e2e=1000, prompt=direct_prompt_tokens, endpoint="chat")
            for i in range(len(prompts))
        ]
        return ["vllm", "serve"], records

    monkeypatch.setattr(direct, "build_final_prompts", build)
    monkeypatch.setattr(direct, "pipeline_phase", pipeline_phase)
    monkeypatch.setattr(direct, "direct_phase", direct_phase)
    out = tmp_path / "out"
    base = ROOT / "serve_config.yaml"
    serve_config = read_serve_config(base)

    assert direct.main(["--out", str(out), "--num-requests", "2", "--max-tokens", "16",
                        "--compression", "none", "--request-timeout-s", "7"]) == code  # fmt: skip

    config, jobs = calls["build"]
    assert config == serve_config.app
    warm, *asked = jobs
    assert (warm.question, warm.max_tokens) == (direct.WARM_UP_QUESTION, direct.WARM_UP_MAX_TOKENS)
    assert warm.plan.method == serve_config.app.compression.default_method
    assert [job.plan.method for job in asked] == ["none", "none"]
    assert [job.max_tokens for job in asked] == [16, 16]
    base_config, questions, method, settings = calls["pipeline"]
    assert (base_config, method) == (base, "none")
    assert questions == list(direct.latency.DEFAULT_QUESTIONS[:2])
    assert settings == direct.PhaseSettings(16, out, 420.0, 7.0)
    generator, env_vars, warm_prompt, prompts, direct_settings = calls["direct"]
    assert (generator, env_vars) == (serve_config.app.generator, serve_config.env_vars)
    assert warm_prompt.question == direct.WARM_UP_QUESTION
    assert [prompt.question for prompt in prompts] == questions
    assert direct_settings == settings

    result = json.loads((out / "direct.json").read_text())
    assert result["config"]["vllm_argv"] == ["vllm", "serve"]
    assert result["config"]["temperature"] == 0.0
    assert result["prompts_match"] is (code == 0)
    assert [row["metric"] for row in result["comparison"]] == ["TTFT", "TPOT", "E2E"]
    assert result["comparison"][0]["diff_ms"] == 100.0
    assert len(result["pipeline"]["records"]) == len(result["direct"]["records"]) == 2
    report = (out / "direct.md").read_text()
    assert "| TTFT | 300.0 | 200.0 | +100.0 | 1.50x |" in report
    captured = capsys.readouterr()
    assert report in captured.out
    assert ("PROMPT MISMATCH on 2 of 2 questions" in captured.err) is (code == 1)
