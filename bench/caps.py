"""Answers the generation cap cut, asked again with a larger cap: does the cap move the scores?

    python -m bench.caps --plan eval-qwen05 --max-tokens 256 \\
        --results docs/results/eval-qwen05/squad-reader-200q-qwen2.5-coder-0.5b-instruct.json \\
        --out docs/results/eval-qwen05/caps

Reads a finished bench.quality run, picks every (point, question) whose answer used all of
its max_tokens, starts the plan's service again (bench.suite) and asks exactly those again
with --max-tokens, greedy as before. Per point it reports how many answers were cut, how
many of them end under the larger cap and at how many tokens, and the point's mean F1 and
contains-gold with the new answers in place of the cut ones: the difference to the stored
scores, paired over all the point's questions, with a 95% bootstrap interval. Two checks
come with it: how many answers still at the larger cap are loops (a six-word run said
three times or more, list numbers and punctuation aside), and how many re-asked answers
do not begin with the stored one (greedy decoding with the same prompt should repeat it;
one that does not says the run is not bit-exact, and its score change is not the cap's).

Writes OUT/caps.json (every re-asked answer) and OUT/caps.md; `--rescore` recomputes both
from a saved OUT/caps.json without asking again.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench.bootstrap import Interval
from bench.intervals import fmt_difference, interval_dict, paired_difference
from bench.quality import DEFAULT_TIMEOUT_S, SweepPoint, iter_sweep
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, load_squad
from bench.stats import mean
from bench.suite import QUALITY_PLANS, quality_service
from harness.service import ROOT

logger = logging.getLogger(__name__)
SCORES = ("f1", "contains_gold")
LOOP_WORDS, LOOP_TIMES = 6, 3


def cut_answers(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The answered results whose completion used the run's whole max_tokens."""
    cap = doc["config"]["max_tokens"]
    return [
        r for r in doc["results"] if r.get("error") is None and r.get("completion_tokens") == cap
    ]


def is_loop(answer: str) -> bool:
    """Whether some run of LOOP_WORDS words occurs LOOP_TIMES times or more in the answer
    (words lower-cased, punctuation and list numbers dropped: "1. X 2. X 3. X" loops)."""
    words = re.sub(r"[\W\d_]+", " ", answer.lower()).split()
    runs = Counter(tuple(words[i : i + LOOP_WORDS]) for i in range(len(words) - LOOP_WORDS + 1))
    return bool(runs) and max(runs.values()) >= LOOP_TIMES


def extends(stored: str, new: str) -> bool:
    """Whether the re-asked answer begins with the stored one (a cut answer's last token may
    end inside a character, which decodes as U+FFFD)."""
    return new.strip().startswith(stored.strip().rstrip("\ufffd"))


def with_new_answers(
    stored: Sequence[Mapping[str, Any]], new: Mapping[tuple[str, str], Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The stored results with each re-asked (point, question) replaced by its new result."""
    return [new.get((r["point"], r["question_id"]), r) for r in stored]


def point_summary(
    point: str,
    stored: Sequence[Mapping[str, Any]],
    new: Mapping[tuple[str, str], Mapping[str, Any]],
    old_cap: int,
    new_cap: int,
) -> dict[str, Any]:
    """One point: cut answers, how the re-asked ones ended, and the scores' paired change."""
    mine = [r for r in stored if r["point"] == point and r.get("error") is None]
    redone = [new[(point, r["question_id"])] for r in mine if (point, r["question_id"]) in new]
    ended = sorted(r["completion_tokens"] for r in redone if r["completion_tokens"] < new_cap)
    still_cut = [r for r in redone if r["completion_tokens"] == new_cap]
    by_id = {r["question_id"]: r for r in mine}
    after = with_new_answers(mine, new)
    summary: dict[str, Any] = {
        "point": point,
        "answered": len(mine),
        "cut": sum(r.get("completion_tokens") == old_cap for r in mine),
        "reasked": len(redone),
        "ended_under_new_cap": len(ended),
        "ended_at_tokens": ended,
        "still_cut_loops": sum(is_loop(r.get("answer") or "") for r in still_cut),
        "diverged": sum(
            not extends(by_id[r["question_id"]].get("answer") or "", r.get("answer") or "")
            for r in redone
        ),
    }
    for key in SCORES:
        pairs = [
            (None if a.get(key) is None else float(a[key]),
             None if b.get(key) is None else float(b[key]))
            for a, b in zip(after, mine, strict=True)
        ]  # fmt: skip
        summary[key] = {
            "before": mean(b for _, b in pairs),
            "after": mean(a for a, _ in pairs),
            "difference": interval_dict(paired_difference(pairs)),
        }
    return summary


def render_markdown(summaries: Sequence[Mapping[str, Any]], old_cap: int, new_cap: int) -> str:
    lines = [
        f"Answers cut at max_tokens {old_cap}, asked again at {new_cap} (the point's other "
        "answers as stored; differences paired over all its questions, 95% bootstrap):",
        "",
        f"| point | n | cut at {old_cap} | ended under {new_cap} (tokens) | still at {new_cap}: "
        "loops | not the stored answer's continuation | F1 stored → re-asked | difference | "
        "contains gold stored → re-asked | difference |",
        "|---|---:|---:|---|---|---:|---|---|---|---|",
    ]
    for s in summaries:
        f1, gold = s["f1"], s["contains_gold"]
        lines.append(
            f"| {s['point']} | {s['answered']} | {s['cut']} | {s['ended_under_new_cap']}/"
            f"{s['reasked']} ({', '.join(map(str, s['ended_at_tokens'])) or '–'}) | "
            f"{s['still_cut_loops']}/{s['reasked'] - s['ended_under_new_cap']} | "
            f"{s['diverged']} | "
            f"{_mean(f1['before'])} → {_mean(f1['after'])} | "
            f"{_diff(f1['difference'])} | "
            f"{_mean(gold['before'])} → {_mean(gold['after'])} | "
            f"{_diff(gold['difference'])} |"
        )
    return "\n".join(lines) + "\n"


def _diff(interval: Mapping[str, Any] | None) -> str:
    return fmt_difference(None if interval is None else Interval(**interval))


def _mean(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", choices=sorted(QUALITY_PLANS), required=True)
    parser.add_argument("--results", type=Path, required=True, help="a bench.quality run's JSON")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--base-config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--rescore", action="store_true", help="recompute OUT/caps.md from OUT/caps.json"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    doc = json.loads(args.results.read_text())
    old_cap = doc["config"]["max_tokens"]
    points = {
        p["name"]: SweepPoint(p["method"], p["rate"], p["top_k"]) for p in doc["config"]["points"]
    }
    if args.rescore:  # the saved run's own config stays: it names what was asked
        saved = json.loads((args.out / "caps.json").read_text())
        config = saved["config"]
        new = {(r["point"], r["question_id"]): r for r in saved["results"]}
    else:
        config = vars(args) | {"old_cap": old_cap}
        new = reask(args, cut_answers(doc), points, doc["config"].get("answer_style", "explained"))
    summaries = [
        point_summary(name, doc["results"], new, old_cap, args.max_tokens) for name in points
    ]
    (args.out / "caps.json").write_text(
        json.dumps(
            {"config": config, "summaries": summaries,
             "results": list(new.values())},
            indent=2, default=str,
        ) + "\n"
    )  # fmt: skip
    table = render_markdown(summaries, old_cap, args.max_tokens)
    (args.out / "caps.md").write_text(table)
    print(table)
    return 0


def reask(
    args: argparse.Namespace,
    cut: Sequence[Mapping[str, Any]],
    points: Mapping[str, SweepPoint],
    answer_style: str,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Ask the cut (point, question) pairs again on the plan's service at --max-tokens."""
    squad = load_squad(DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME)
    by_id = {q.question_id: q for q in squad.questions}
    requests = [(points[r["point"]], by_id[r["question_id"]]) for r in cut]
    logger.info("%d answers cut: asking them again at %d", len(cut), args.max_tokens)
    with (
        quality_service(QUALITY_PLANS[args.plan], args.out, args.base_config, "caps") as url,
        httpx.Client(base_url=url, timeout=DEFAULT_TIMEOUT_S, trust_env=False) as client,
    ):
        results = list(
            iter_sweep(
                client,
                requests,
                args.max_tokens,
                DEFAULT_TIMEOUT_S,
                {p.paragraph_id for p in squad.paragraphs},
                None,
                answer_style,
            )
        )
    return {(r.point, r.question_id): asdict(r) for r in results}


if __name__ == "__main__":
    raise SystemExit(main())
