"""Follow-up pairs from SQuAD: a first question and a follow-up that needs it.

A pair is two questions of the same paragraph, Q1 then Q2, where Q2 names an entity that Q1
names too: the article title (underscores as spaces, "Super Bowl 50"; also without its
parenthesis, "Sky", or before its comma, "Fresno") matched in any case, or else a
capitalised phrase of two words or more found in both ("Denver Broncos"). The follow-up Q2'
is Q2 with every mention of it (with its article: "the Normans") replaced by a pronoun:
"they"/"them" for a phrase that looks plural (ends in s), "it" otherwise, "its"/"their" for a
possessive, "this"/"these" for "the X" followed by another word ("Who was the Super Bowl 50
MVP?" -> "Who was this MVP?"). A mention that no pronoun fits ("How many Super Bowl 50
tickets") rules that replacement out. A pair is kept only if Q2' holds no word of the article
title any more (plurals counted as the same word), so Q2' alone does not name the article.

The conversation sent before Q2' is Q1 and, as the assistant's turn, Q1's first gold answer:
the labs measure retrieval of the follow-up, not the quality of a first answer.

Drawing: paragraphs in a seeded random order, one pair drawn at random from each paragraph
that has any, until `n`; so pairs are not the first N and no two share a paragraph.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from bench.labs import LabError
from bench.squad import SquadQuestion, SquadSet

HISTORY_NOTE = (
    "The history before each follow-up is the first question and its first SQuAD gold "
    "answer as the assistant turn: the lab measures retrieval of the follow-up, not the "
    "quality of a first answer."
)
EntitySource = Literal["title", "shared_phrase"]


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Auxiliaries whose next noun phrase is a subject ("did Tesla die" -> "did it die").
_AUXILIARIES = _word_set("do does did will would can could should may might must has have had")
_COPULAS = _word_set("is was are were be been being")
_WH_WORDS = _word_set("what which who whom whose when where why how")
_LINKS = _word_set(
    "in of on at to for from with by and or as than that about into over under between "
    "against among through during after before since while because if but so"
)
# Words after a mention that show it is a whole noun phrase, not a modifier of the next word.
_PHRASE_ENDERS = _LINKS | _WH_WORDS | _AUXILIARIES | _COPULAS
# A mention after one of these is part of a larger noun phrase ("some teachers").
_DETERMINERS = _word_set(
    "some many few several most each every any no these those this other another such all "
    "both his her their its our your my what which whose"
)
_NOUN_SUFFIXES = ("tion", "sion", "ics", "ment", "ness", "ity", "ism", "ance", "ence", "ship")
# First words of a question that are capitalised only because they come first.
_STARTERS = _WH_WORDS | _AUXILIARIES | _COPULAS | _LINKS | _word_set("the a an according")
_SINGULAR_VERBS = _word_set("is was does has")
_PLURAL_VERBS = _word_set("are were do have")
_MONTHS = _word_set(
    "january february march april may june july august september october november december"
)
# Names that end in s but take "it".
_SINGULAR_NAMES = frozenset({"united states", "united nations", "netherlands", "philippines"})
_TITLE_STOPWORDS = _word_set("the of and in on upon for a an de la to")
_CAPITALISED_RUN = re.compile(
    r"(?<![\w'])[A-Z][\w-]*(?:\s+(?:(?:of|upon)\s+)?(?:[A-Z][\w-]*|\d+))+(?![\w-])"
)
_WORD = re.compile(r"[A-Za-z0-9]+")
_WORD_OR_POSSESSIVE = re.compile(r"[\w'’]+")
_WORD_AFTER = re.compile(r"\s+([A-Za-z][\w']*)")


@dataclass(frozen=True)
class FollowUpPair:
    """One test item; `paragraph_id` is the gold paragraph (the corpus doc id)."""

    pair_id: str
    paragraph_id: str
    title: str
    first_question_id: str
    first_question: str
    first_answer: str
    question_id: str
    question: str
    follow_up: str
    replaced: str
    pronoun: str
    entity_source: EntitySource
    gold_answers: tuple[str, ...]

    def history(self) -> list[dict[str, str]]:
        """The earlier turns sent with the follow-up: Q1, then its gold answer."""
        return [
            {"role": "user", "content": self.first_question},
            {"role": "assistant", "content": self.first_answer},
        ]


@dataclass(frozen=True)
class PairSet:
    """A built set: its pairs, how it was drawn, and the SQuAD article titles (to tell a
    SQuAD paragraph id from another index's ids)."""

    pairs: tuple[FollowUpPair, ...]
    seed: int
    requested: int
    candidate_paragraphs: int
    articles: tuple[str, ...]
    squad_path: str | None = None


# --- one pair --------------------------------------------------------------------------------


def title_surfaces(title: str) -> list[str]:
    """How a question may name the article: "Sky_(United_Kingdom)" -> ["Sky (United
    Kingdom)", "Sky"]; "Fresno,_California" -> ["Fresno, California", "Fresno"]."""
    full = " ".join(title.replace("_", " ").split())
    forms = [full, re.sub(r"\s*\([^)]*\)", "", full).strip(), full.split(",")[0].strip()]
    return sorted({form for form in forms if form}, key=len, reverse=True)


def title_words(title: str) -> set[str]:
    """The article title's words, lower case and singular, without function words."""
    return {
        _singular(word)
        for word in _WORD.findall(title.replace("_", " ").lower())
        if word not in _TITLE_STOPWORDS
    }


def shared_phrases(first: str, second: str) -> list[str]:
    """Capitalised phrases of two words or more in `second` that `first` holds too,
    longest first; a leading question word ("Which", "The") is not part of one."""
    phrases: set[str] = set()
    for match in _CAPITALISED_RUN.finditer(second):
        words = match.group().split()
        while words and words[0].lower() in _STARTERS:
            words = words[1:]
        if len(words) >= 2 and words[0].lower() not in _MONTHS:
            phrase = " ".join(words)
            if re.search(rf"(?<![\w-]){re.escape(phrase)}(?![\w-])", first):
                phrases.add(phrase)
    return sorted(phrases, key=lambda p: (-len(p), p))


def _mentions(text: str, phrase: str) -> bool:
    """Whether `text` names `phrase` as whole words, in any case, maybe plural."""
    pattern = rf"(?<![\w-]){re.escape(phrase)}(?:s|es)?(?![\w-])"
    return re.search(pattern, text, re.IGNORECASE) is not None


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def _looks_plural(phrase: str) -> bool:
    words = phrase.lower().split()
    if " ".join(words[-2:]) in _SINGULAR_NAMES or words[-1] in _SINGULAR_NAMES:
        return False
    return words[-1].endswith("s") and not words[-1].endswith(("ss", "us", "is", "ics"))


def pronoun_for(
    mention: str,
    has_article: bool,
    before: Sequence[str],
    after: str | None,
    possessive: bool,
) -> str | None:
    """The pronoun that replaces one mention (with its article, if `has_article`); None
    when none fits. `before`: the words before it as written, nearest last; `after`: the
    next word, None at the end or before punctuation."""
    previous = before[-1].lower() if before else None
    if previous is not None and (previous.endswith(("'s", "’s")) or previous in _DETERMINERS):
        return None  # inside a larger noun phrase: "ABC's Wide World", "some teachers"
    if (
        not has_article
        and len(before) >= 2
        and before[-2].lower() in {"the", "a", "an"}
        and previous not in _PHRASE_ENDERS
    ):
        return None  # "the innate immune system"
    if _inside_a_name(before, after):
        return None
    plural = _looks_plural(mention)
    if possessive:
        return "their" if plural else "its"
    following = None if after is None else after.lower()
    if following == "of":
        return None  # "the Mission Council of the ... jurisdiction"
    if following is not None and following not in _PHRASE_ENDERS:
        # Another word follows. "the X" + word reads as "this" + word ("Who was the Super
        # Bowl 50 MVP" -> "this MVP", "When was the Apollo program started" -> "this
        # started"). A bare name after an auxiliary is the subject ("did Tesla die", "was
        # Warsaw annexed") unless the next word is a noun it modifies ("did Huguenot
        # immigration have"); any other bare modifier ("many ... tickets") has no pronoun.
        if has_article and plural and previous in _AUXILIARIES:
            return "they"  # "did the Normans conquer": a plural name rarely modifies
        if has_article:
            return _demonstrative(plural, previous, following)
        if previous in _AUXILIARIES | _COPULAS and not following.endswith(_NOUN_SUFFIXES):
            return "they" if plural else "it"
        return None
    if not plural:
        return "it"
    subject = previous is None or previous in _AUXILIARIES | _COPULAS | _WH_WORDS | {"and", "or"}
    return "they" if subject else "them"


def _demonstrative(plural: bool, previous: str | None, following: str) -> str:
    """`this` or `these` before `following`: the verb before decides ("When was these
    presented" is wrong whatever the name's ending), else the plural of the name or of the
    noun after it ("these series")."""
    if previous in _SINGULAR_VERBS:
        return "this"
    if previous in _PLURAL_VERBS or plural or _looks_plural(following):
        return "these"
    return "this"


def _inside_a_name(before: Sequence[str], after: str | None) -> bool:
    """Whether a mention is part of a longer capitalised name ("Warsaw Uprising",
    "Harvard President Joseph Willard", "Principles of Geology"); an acronym after it
    ("MVP") and the question's capitalised first word do not count."""
    if after is not None and after[0].isupper() and not after.isupper():
        return True
    if len(before) >= 2 and before[-1][0].isupper():
        return True
    return len(before) >= 3 and before[-1].lower() in {"of", "and"} and before[-2][0].isupper()


def replace_mentions(
    question: str, phrase: str, ignore_case: bool, allow_plural: bool
) -> tuple[str, str, str] | None:
    """`question` with every mention of `phrase` (and its article) replaced by a pronoun:
    (new question, first mention as written, its pronoun); None when it has no mention or
    one has no pronoun or stands inside quotes (a quoted title is not a reference)."""
    suffix = "(?:s|es)?" if allow_plural else ""
    pattern = re.compile(
        rf"(?P<article>(?<![\w-])(?i:the|a|an)\s+)?"
        rf"(?P<mention>(?<![\w-]){re.escape(phrase)}{suffix})(?![\w-])(?P<possessive>'s|'|’s)?",
        re.IGNORECASE if ignore_case else 0,
    )
    pieces: list[str] = []
    first: tuple[str, str] | None = None
    position = 0
    for match in pattern.finditer(question):
        head = question[: match.start()]
        if head.count('"') % 2 or head.count("“") > head.count("”"):
            return None
        after_match = _WORD_AFTER.match(question[match.end() :])
        pronoun = pronoun_for(
            match.group("mention"),
            has_article=bool(match.group("article")),
            before=_WORD_OR_POSSESSIVE.findall(head),
            after=after_match.group(1) if after_match else None,
            possessive=bool(match.group("possessive")),
        )
        if pronoun is None:
            return None
        if not head.strip():
            pronoun = pronoun.capitalize()
        pieces += [question[position : match.start()], pronoun]
        position = match.end()
        first = first or (match.group(), pronoun.lower())
    if first is None:
        return None
    pieces.append(question[position:])
    return " ".join("".join(pieces).split()), first[0], first[1]


def make_pair(first: SquadQuestion, second: SquadQuestion, title: str) -> FollowUpPair | None:
    """The follow-up pair (`first`, `second`) of one paragraph of article `title`, or None
    when `second` has no replaceable mention of an entity `first` names too, or its
    follow-up still names the article."""
    if first.question_id == second.question_id:
        return None
    candidates: list[tuple[str, EntitySource, bool]] = []
    surfaces = title_surfaces(title)
    if any(_mentions(first.question, surface) for surface in surfaces):
        candidates += [(surface, "title", True) for surface in surfaces]
    candidates += [
        (phrase, "shared_phrase", False)
        for phrase in shared_phrases(first.question, second.question)
    ]
    banned = title_words(title)
    for phrase, source, is_title in candidates:
        replaced = replace_mentions(
            second.question, phrase, ignore_case=is_title, allow_plural=is_title
        )
        if replaced is None:
            continue
        follow_up, mention, pronoun = replaced
        if any(_singular(word) in banned for word in _WORD.findall(follow_up.lower())):
            continue
        return FollowUpPair(
            pair_id=f"{first.question_id}>{second.question_id}",
            paragraph_id=second.paragraph_id,
            title=title.replace("_", " "),
            first_question_id=first.question_id,
            first_question=first.question,
            first_answer=first.gold_answers[0],
            question_id=second.question_id,
            question=second.question,
            follow_up=follow_up,
            replaced=mention,
            pronoun=pronoun,
            entity_source=source,
            gold_answers=second.gold_answers,
        )
    return None


# --- the set ---------------------------------------------------------------------------------


def candidate_pairs(squad: SquadSet) -> dict[str, list[FollowUpPair]]:
    """Every follow-up pair of every paragraph, keyed by paragraph id, in file order."""
    titles = {paragraph.paragraph_id: paragraph.title for paragraph in squad.paragraphs}
    by_paragraph: dict[str, list[SquadQuestion]] = defaultdict(list)
    for question in squad.questions:
        by_paragraph[question.paragraph_id].append(question)
    pairs: dict[str, list[FollowUpPair]] = {}
    for paragraph_id, questions in by_paragraph.items():
        found = [
            pair
            for second in questions
            for first in questions
            if (pair := make_pair(first, second, titles[paragraph_id])) is not None
        ]
        if found:
            pairs[paragraph_id] = found
    return pairs


def build_pairs(squad: SquadSet, n: int, seed: int) -> PairSet:
    """Up to `n` pairs, at most one per paragraph, drawn with `seed`: the same set, `n` and
    seed give the same pairs in the same order."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    candidates = candidate_pairs(squad)
    rng = random.Random(seed)
    paragraph_ids = sorted(candidates)
    rng.shuffle(paragraph_ids)
    chosen = tuple(rng.choice(candidates[pid]) for pid in paragraph_ids[:n])
    return PairSet(
        pairs=chosen,
        seed=seed,
        requested=n,
        candidate_paragraphs=len(candidates),
        articles=tuple(sorted({p.title for p in squad.paragraphs})),
    )


def write_pairs(pair_set: PairSet, path: Path) -> Path:
    """Write the set as JSON (its pairs with every id, how it was drawn); return `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "description": "SQuAD follow-up pairs for bench.conversation",
        "history_note": HISTORY_NOTE,
        **{key: value for key, value in asdict(pair_set).items() if key != "pairs"},
        "n": len(pair_set.pairs),
        "pairs": [asdict(pair) for pair in pair_set.pairs],
    }
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def load_pairs(path: Path) -> PairSet:
    """Read a file `write_pairs` wrote; LabError naming what is wrong."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        pairs = tuple(_pair(item) for item in document["pairs"])
        pair_set = PairSet(
            pairs=pairs,
            seed=int(document["seed"]),
            requested=int(document["requested"]),
            candidate_paragraphs=int(document["candidate_paragraphs"]),
            articles=tuple(document["articles"]),
            squad_path=document.get("squad_path"),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(f"{path}: not a pair file of bench.conversation build ({exc!r})") from exc
    if not pairs:
        raise LabError(f"{path}: holds no pairs")
    return pair_set


def _pair(item: dict[str, Any]) -> FollowUpPair:
    return FollowUpPair(**{**item, "gold_answers": tuple(item["gold_answers"])})


def article_of(doc_id: str) -> str:
    """The article title of a SQuAD paragraph id (`Super_Bowl_50-3` -> `Super_Bowl_50`)."""
    return doc_id.rsplit("-", 1)[0]


def from_squad_index(doc_ids: Iterable[str], articles: Sequence[str]) -> bool:
    """Whether any retrieved doc id is a paragraph of one of the set's articles."""
    known = set(articles)
    return any(article_of(doc_id) in known for doc_id in doc_ids)
