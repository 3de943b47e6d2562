"""What the lab sends: invented facts (each one document with its questions), real paragraphs
for continuous ingestion, and the steady load's questions. All seeded."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.ingestion.client import QueryRecord
from bench.questions import DEFAULT_QUESTIONS
from bench.squad import load_squad
from retrieval.sentences import split_sentences

# Shorter paragraphs (headings, list stubs) are not documents of their own.
MIN_PARAGRAPH_CHARS = 200


PLACES = (
    "lighthouse",
    "library",
    "granary",
    "observatory",
    "monastery",
    "harbour",
    "archive",
    "orchard",
    "foundry",
    "mill",
)


THINGS = (
    "brass lanterns",
    "silver keys",
    "glass jars",
    "copper bells",
    "clay tablets",
    "wool banners",
    "oak barrels",
    "iron anchors",
)


DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


REGIONS = ("northern valley", "eastern coast", "southern hills", "western marshes")


_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gl",
    "kr",
    "pl",
    "st",
    "th",
    "tr",
    "qu",
)


_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou", "y")


_CODAS = ("", "", "n", "r", "l", "s", "th", "x")


def pseudo_word(rng: random.Random, syllables: int = 3) -> str:
    """A pronounceable invented word, capitalised (e.g. 'Quaelorvin')."""
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


@dataclass(frozen=True)
class Fact:
    """One invented fact: `count` `things` are kept in the `place` of `name`, counted every
    `day` by `keeper`. Its names occur in no other document."""

    doc_id: str
    name: str
    place: str
    count: int
    things: str
    keeper: str
    day: str
    region: str
    land: str

    @property
    def title(self) -> str:
        return f"The {self.place} of {self.name}"

    @property
    def text(self) -> str:
        return (
            f"{self.name} is a small {self.place} in the {self.region} of {self.land}. "
            f"The {self.place} of {self.name} keeps exactly {self.count} {self.things}. "
            f"Every {self.day} its keeper, {self.keeper}, counts the {self.things} and "
            f"writes the number in a ledger."
        )

    @property
    def question(self) -> str:
        return f"How many {self.things} does the {self.place} of {self.name} keep?"

    @property
    def paraphrases(self) -> tuple[str, ...]:
        """Questions aimed at this document, worded in different ways."""
        return (
            self.question,
            f"Who is the keeper of the {self.place} of {self.name}?",
            f"What does {self.keeper} count every {self.day}?",
            f"Where is {self.name}?",
            f"{self.name} {self.place}",
            f"Tell me about {self.keeper}.",
            f"Which {self.place} keeps {self.count} {self.things}?",
            f"What is kept in the {self.place} of {self.name}?",
            f"How many {self.things} are there in {self.name}?",
            f"Who writes the number of {self.things} in the ledger of {self.name}?",
        )

    def record(self) -> dict[str, str]:
        return {"id": self.doc_id, "title": self.title, "text": self.text}


def invent_facts(n: int, seed: int) -> list[Fact]:
    """`n` facts from `random.Random(seed)`; every invented word is used once."""
    rng = random.Random(seed)
    used: set[str] = set()

    def fresh() -> str:
        while True:
            word = pseudo_word(rng)
            if word not in used:
                used.add(word)
                return word

    return [
        Fact(
            doc_id=f"fact-{i:03d}",
            name=fresh(),
            place=rng.choice(PLACES),
            count=rng.randint(12, 9_999),
            things=rng.choice(THINGS),
            keeper=f"{fresh()} {fresh()}",
            day=rng.choice(DAYS),
            region=rng.choice(REGIONS),
            land=fresh(),
        )
        for i in range(n)
    ]


def paragraphs_from_text(text: str, min_chars: int = MIN_PARAGRAPH_CHARS) -> list[str]:
    """The blank-line separated paragraphs of `text` of at least `min_chars` characters,
    Markdown headings left out, each on one line."""
    paragraphs = []
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("#")]
        paragraph = " ".join(lines)
        if len(paragraph) >= min_chars:
            paragraphs.append(paragraph)
    return paragraphs


@dataclass(frozen=True)
class Passage:
    """A paragraph of real text to ingest: where it came from, a title and the text."""

    source: str
    title: str
    text: str


def load_passages(corpus: Path, squad_file: Path) -> tuple[str, list[Passage]]:
    """(what they are, the passages): SQuAD dev's paragraphs when its cache file exists
    (never downloaded here), else the corpus documents split into paragraphs."""
    if squad_file.is_file():
        squad = load_squad(squad_file)
        return f"SQuAD dev paragraphs ({squad_file})", [
            Passage(p.paragraph_id, p.title.replace("_", " "), p.context) for p in squad.paragraphs
        ]
    from retrieval.documents import load_documents

    passages = [
        Passage(f"{document.doc_id}#{n}", document.title, text)
        for document in load_documents(corpus)
        for n, text in enumerate(paragraphs_from_text(document.text))
    ]
    return f"paragraphs of {corpus}", passages


def load_questions(kind: str, corpus: Sequence[dict[str, str]], seed: int) -> Iterator[str]:
    """The steady load's questions, endlessly. `repeated`: drawn at random from
    bench.questions' few questions, so the same prompts recur and vLLM's prefix cache holds
    whole prompts while the collection stands still. `distinct`: one per sentence of the
    corpus documents, shuffled (then again, reshuffled), so no two queries of a run share
    more than the system prompt unless they retrieve the same chunks."""
    rng = random.Random(seed + 1)
    if kind == "repeated":
        while True:
            yield rng.choice(DEFAULT_QUESTIONS)
    sentences = [
        document["text"][start:end].strip()
        for document in corpus
        for start, end in split_sentences(document["text"])
    ]
    pool = [f"What do the documents say about this: {s}" for s in sentences if len(s) > 20]
    while True:
        rng.shuffle(pool)
        yield from pool


def document_stream(passages: Sequence[Passage], seed: int) -> Iterator[dict[str, str]]:
    """Endless JSON records of new documents: the passages in a seeded order, then again
    in another; every record has an id never used before (`ingest-000000`, ...)."""
    if not passages:
        raise ValueError("no passages to ingest")
    rng = random.Random(seed)
    counter = itertools.count()
    while True:
        order = list(passages)
        rng.shuffle(order)
        for passage in order:
            yield {
                "id": f"ingest-{next(counter):06d}",
                "title": passage.title,
                "text": passage.text,
            }


def take(stream: Iterator[dict[str, str]], k: int) -> list[dict[str, str]]:
    return list(itertools.islice(stream, k))


def paraphrase_records(
    fact: Fact, n: int, seed: int, part: str, first_index: int = 0
) -> list[QueryRecord]:
    """`n` questions aimed at `fact`, drawn with replacement from its paraphrases by
    `random.Random(seed)`."""
    rng = random.Random(seed)
    return [
        QueryRecord(part, first_index + i, rng.choice(fact.paraphrases), target=fact.doc_id)
        for i in range(n)
    ]
