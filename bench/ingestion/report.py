"""The lab's JSON document and its markdown report."""

from __future__ import annotations

import subprocess
from dataclasses import asdict
from typing import Any

from bench.ingestion.summary import (
    INGESTING,
    PHASE_STAGES,
    QUIET,
    AddRun,
    add_summary,
    load_summary,
    ratio_reading,
)
from bench.stats import format_ms
from harness.service import ROOT


def git_state() -> dict[str, Any]:
    def git(*argv: str) -> str:
        result = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return result.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "changed_files": git("status", "--porcelain").splitlines(),
    }


def build_document(
    measured: dict[str, Any], config: dict[str, Any], seed: int, duration_s: float
) -> dict[str, Any]:
    adds: list[AddRun] = measured["adds"]
    deletion = measured["deletion"]
    summary = {
        "rate_per_s": measured["rate_per_s"],
        "rate_source": measured["rate_source"],
        "calibration": measured["calibration"],
        "setup_job": measured["setup_job"],
        "adds": add_summary(adds, seed),
        "delete": None if deletion is None else deletion["summary"],
        "load": load_summary(measured["load_records"], measured["phases"], seed),
        "timings_s": measured["timings_s"],
        "duration_s": duration_s,
    }
    return {
        "config": config,
        "summary": summary,
        "records": {
            "calibration": [asdict(r) for r in measured["calibration_records"]],
            "adds": [
                {
                    **{k: v for k, v in asdict(run).items() if k != "queries"},
                    "queries": [asdict(q) for q in run.queries],
                    "misses_after_publish": run.misses_after_publish,
                    "published_s": run.published_s,
                    "first_cited_sent_s": run.first_cited_sent_s,
                }
                for run in adds
            ],
            "delete": [] if deletion is None else [asdict(r) for r in deletion["records"]],
            "load": [asdict(r) for r in measured["load_records"]],
            "phases": [asdict(p) for p in measured["phases"]],
        },
    }


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(interval: dict[str, Any] | None, digits: int = 2) -> str:
    if not interval:
        return "-"
    return (
        f"{interval['estimate']:.{digits}f} [{interval['low']:.{digits}f}, "
        f"{interval['high']:.{digits}f}]"
    )


def markdown(document: dict[str, Any]) -> str:
    """The report: set-up, then each goal's table and verdict."""
    config, summary = document["config"], document["summary"]
    calibration, adds, load = summary["calibration"], summary["adds"], summary["load"]
    deletion = summary["delete"]
    single = calibration["single_e2e_ms"]
    lines = [
        "# Collections under change: add, delete, and queries during ingestion",
        "",
        f"{config['date']}, {config['cpu_count']} CPUs (shared), `{config['base']}` as shipped "
        f"(generator `{config['model']}` in vLLM, one replica per stage) with only the HTTP "
        f"port and `collections.root` changed. Collection `{config['collection']}` starts "
        f"with the {config['corpus_documents']} documents of `{config['corpus']}`. Answers are "
        f"capped at {config['max_tokens']} tokens and the service's default top_k is used: "
        "the figures are about retrieval and the pipeline under ingestion, not about "
        "generating answers. Times are client-side (E2E of a non-streaming "
        "`POST /v1/rag/query`). Seed "
        f"{config['seed']}. The run took {summary['duration_s'] / 60:.1f} min.",
        "",
        f"Calibration: one query at a time, E2E median {format_ms(single['median'])} ms "
        f"(n = {single['n']}); closed loop at concurrency {calibration['capacity_concurrency']}: "
        f"{calibration['capacity_per_s']:.2f} queries/s. Load rate: "
        f"**{summary['rate_per_s']:g} queries/s** ({summary['rate_source']}).",
        "",
        "## 1. Add a document, query it within one publish cycle",
        "",
        f"{adds['adds']} documents, each one invented fact, added one at a time; t0 = the add's "
        "202. Queries about the fact run one after another until an answer cites the document.",
        "",
        "| seconds | n | median [95% CI] | p95 | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, key in (
        ("t0 -> first answer citing it", "first_cited_s"),
        ("t0 -> send of the first query whose answer cited it", "first_cited_sent_s"),
        ("job duration (finished - created)", "job_duration_s"),
        ("t0 -> job finished (published)", "published_s"),
        ("first citing answer - published", "lag_after_publish_s"),
    ):
        row = adds[key]
        middle = _ci(row.get("median_ci")) if row.get("median_ci") else _s(row["median"])
        lines.append(f"| {name} | {row['n']} | {middle} | {_s(row['p95'])} | {_s(row['max'])} |")
    lines += [
        "",
        f"{adds['queries']} queries ({adds['queries_not_200']} not 200); queries sent after "
        f"the job had finished that did not cite the document: {adds['misses_after_publish']}. "
        f"**Goal 1 {adds['verdict']['text']}.**",
        "",
        "## 2. Delete it: 0 of 1,000 later queries retrieve it",
        "",
    ]
    if deletion is None:
        lines += ["Not measured: no added document was retrieved.", ""]
    else:
        job = deletion["job"]
        e2e = deletion["e2e_ms"]
        lines += [
            f"`{deletion['doc_id']}` was retrieved before the delete by "
            f"{deletion['precheck_retrieved']}/{deletion['precheck_n']} of the paraphrased "
            f"questions (the check can see it). Delete job: {job['status']}, "
            f"{_s(job['duration_s'])} s. Then {deletion['n']} paraphrases (seeded) at "
            f"concurrency {config['delete_concurrency']}:",
            "",
            "| queries | 200 | retrieved the deleted document | versions answered from | "
            "E2E p50 ms | p99 ms |",
            "|---:|---:|---:|---|---:|---:|",
            f"| {deletion['n']} | {deletion['ok']} | {deletion['retrieved']} | "
            f"{', '.join(f'`{v}`' for v in deletion['versions'])} | "
            f"{format_ms(e2e['median'])} | {format_ms(e2e['p99'])} |",
            "",
            f"**Goal 2 {deletion['verdict']['text']}.**",
            "",
        ]
    quiet, ingesting = load["conditions"][QUIET], load["conditions"][INGESTING]
    lines += [
        "## 3. Steady query load during continuous ingestion",
        "",
        f"Open-loop Poisson arrivals at {summary['rate_per_s']:g}/s over {config['phases']} "
        f"phases of {config['phase_s']:g} s in ABBA order (quiet, ingesting, ingesting, "
        f"quiet, ...); in ingesting phases, add jobs of {config['docs_per_job']} new "
        f"documents ran back to back ({config['passages']}). Before them, "
        f"{config['warm_up_s']:g} s of the same load as warm-up, not counted (it refills "
        "vLLM's prefix cache after part 2's other questions). A query with no answer within "
        f"{config['hung_s']:g} s is hung. E2E over "
        "the queries answered 200.",
        "",
        "| condition | phases | s | queries | 200 | non-200 | hung | E2E p50 ms | p99 ms | "
        "max ms | jobs | documents | documents/s | versions seen |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in (quiet, ingesting):
        lines.append(
            f"| {row['condition']} | {row['phases']} | {row['duration_s']:.0f} | {row['n']} | "
            f"{row['ok']} | {row['not_200']} | {row['hung']} | {format_ms(row['e2e_ms_p50'])} "
            f"| {format_ms(row['e2e_ms_p99'])} | {format_ms(row['e2e_ms_max'])} | "
            f"{row['jobs']} | {row['documents_added']} | {row['documents_per_s']:.2f} | "
            f"{row['versions']} |"
        )
    job_s = ingesting["job_duration_s"]
    lines += [
        "",
        f"Add jobs: median {_s(job_s['median'])} s, max {_s(job_s['max'])} s (n = "
        f"{job_s['n']}, {ingesting['jobs_failed']} failed).",
        "",
        "| ingesting / quiet | estimate [95% CI] | n (smaller side) | reading |",
        "|---|---:|---:|---|",
    ]
    for name, key in (("p99 E2E", "p99_ratio"), ("p50 E2E", "p50_ratio")):
        interval = load.get(key)
        if interval:
            lines.append(
                f"| {name} | {_ci(interval)} | {interval['n']} | {ratio_reading(interval)} |"
            )
    lines += [
        "",
        f"**Goal 3 {load['verdict']['text']}.** A p99 from a few hundred queries rests on "
        "its few slowest ones; its interval says how far that carries.",
        "",
        "Per phase:",
        "",
        "| phase | condition | s | queries | E2E p50 ms | p99 ms | retrieve p50 ms | "
        "compress p50 ms | queue p50 ms | TTFT p50 ms | prompt tokens p50 | jobs | documents |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {p['index']} | {p['condition']} | {p['duration_s']:.0f} | {p['n']} | "
            f"{format_ms(p['e2e_ms_p50'])} | {format_ms(p['e2e_ms_p99'])} | "
            + " | ".join(format_ms(p.get(f"{stage}_ms_p50")) for stage in PHASE_STAGES)
            + f" | {format_ms(p.get('prompt_tokens_p50'))} | {p['jobs']} | "
            f"{p['documents_added']} |"
            for p in load["phases"]
        ),
        "",
        "Stage columns are medians of the service's own `timings_ms` (TTFT from the "
        "request's arrival at the ingress; `queue` the time calls waited before a stage "
        "began them); a slowdown shows in the stage it comes from.",
        "",
        f"Command: `{config['command']}`",
        "",
    ]
    return "\n".join(lines)
