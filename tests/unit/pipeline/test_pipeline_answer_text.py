"""pipeline.answer_text: cleaning model-written tags and citation markers, whole and streamed.

The stream cleaner is checked against `clean_answer` on random splits of example answers and
of random texts made of the pieces markers are made of (hypothesis).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.answer_text import (
    MAX_MARKER_CHARS,
    AnswerStreamCleaner,
    cited_ids,
    clean_answer,
)

IDS = ("kv-cache#0", "batch#1", "guides/kv#2", "my doc#3")


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        # Valid markers stay as written.
        ("Blocks hold KV entries [kv-cache#0].", "Blocks hold KV entries [kv-cache#0]."),
        ("A [kv-cache#0, batch#1] b.", "A [kv-cache#0, batch#1] b."),
        ("Paths too [guides/kv#2].", "Paths too [guides/kv#2]."),
        ("Odd ids too [my doc#3].", "Odd ids too [my doc#3]."),
        ("Twice [kv-cache#0][batch#1].", "Twice [kv-cache#0][batch#1]."),
        # Invalid ids leave a marker; a marker without a valid id goes, with its space.
        ("A [kv-cache#0, bad#2; batch#1] b.", "A [kv-cache#0, batch#1] b."),
        ("A [kv-cache#0, kv-cache#0] b.", "A [kv-cache#0] b."),
        ("It uses blocks [bad#9].", "It uses blocks."),
        ("It uses blocks [bad#9], mostly.", "It uses blocks, mostly."),
        ("[bad#1] Answer here.", "Answer here."),
        ("Answer here [bad#1]", "Answer here"),
        ("foo  [bad#1]  bar", "foo bar"),
        ("foo [x#1] [y#2] bar", "foo bar"),
        ("foo[x#1]bar", "foobar"),
        ("foo [x#1]\nbar", "foo\nbar"),
        # Ordinary brackets are text.
        ("See [1] and [note] and [a, b].", "See [1] and [note] and [a, b]."),
        ("Arrays like x[0] stay.", "Arrays like x[0] stay."),
        # Bare ids of the sources' documents go, whatever the ordinal.
        ("Denver Broncos kv-cache#0.", "Denver Broncos."),
        ("Denver Broncos kv-cache#12, they won.", "Denver Broncos, they won."),
        ("Paths guides/kv#2 and guides/kv#5 too.", "Paths and too."),
        ("Other documents other-doc#12 stay.", "Other documents other-doc#12 stay."),
        (
            "Longer words kv-cache#0x and xkv-cache#0 stay.",
            "Longer words kv-cache#0x and xkv-cache#0 stay.",
        ),
        ("The doc my doc#3 says so.", "The doc says so."),
        ("(see kv-cache#0) ok", "(see) ok"),
        ("(kv-cache#0 first) ok", "(first) ok"),
        (
            "An anchor https://example.com/page#1 stays.",
            "An anchor https://example.com/page#1 stays.",
        ),
        ("Issue #12 and C# stay.", "Issue #12 and C# stay."),
        # Source tags go, whatever their case and attributes.
        ('<source id="kv-cache#0">\nText\n</source>\nAnswer.', "\nText\n\nAnswer."),
        ('Answer <SOURCE id="batch#1" title="B"> here </Source>.', "Answer here."),
        ("Answer.</source>", "Answer."),
        ('Answer. <source id="kv-cache#0"', "Answer."),
        ("Answer. </sour", "Answer."),
        ("a <b> and x < y stay", "a <b> and x < y stay"),
        ("<sources> is not a tag", "<sources> is not a tag"),
        # Too long to be a tag.
        ('<source title="' + "t" * 100 + '">', '<source title="' + "t" * 100 + '">'),
        ("", ""),
    ],
)
def test_clean_answer(text, cleaned):
    assert clean_answer(text, IDS) == cleaned


def test_without_source_ids_every_marker_goes_and_bare_ids_stay():
    assert clean_answer("A [kv-cache#0] b kv-cache#0.", []) == "A b kv-cache#0."


def test_cited_ids_are_the_valid_ids_of_markers_with_the_marker_span():
    text = "A [kv-cache#0, bad#2; batch#1] b [batch#1]. Bare kv-cache#0 is no citation."

    assert cited_ids(text, IDS) == [
        (2, 30, "kv-cache#0"),
        (2, 30, "batch#1"),
        (33, 42, "batch#1"),
    ]
    assert text[33:42] == "[batch#1]"
    assert cited_ids("None [bad#1] here [1].", IDS) == []


# --- streaming -------------------------------------------------------------------------------

EXAMPLES = [
    "Paged attention stores the KV cache in blocks [kv-cache#0]. Batching helps [batch#1].",
    "It uses blocks [bad#9]. Denver Broncos kv-cache#0.",
    '<source id="kv-cache#0" title="KV">\nPaged attention.\n</source>\nThe answer [1] is here.',
    "foo  [bad#1]  bar [kv-cache#0, nope#3;batch#1] baz [note] qux",
    'Answer. <source id="x',
    "Answer [my doc#3] and my doc#3 and my doc",
    "Ends with a partial [kv-cache",
    "Ends with an id kv-cache#",
    "Ordinals kv-cache#7, kv-cache#1234567 and guides/kv#22; kv-cache#0x.",
    "[" + "x" * 200 + " and more text after an open bracket",
    "<" + "source " + "y" * 200 + " and more",
    "Spaces     \t   [bad#1]   \n  next line (kv-cache#0) end.",
    "https://example.com/path#1 and guides/kv#2, then [guides/kv#2].",
    "Unicode: café [kv-cache#0] naïve kv-cache#0 ünïcode#7.",
    "[bad#1][bad#2] [kv-cache#0]",
    "x" * 150 + "#1 long word",
]
TOKENS = [
    "[", "]", "<", ">", "/", "#", "0", "12", ",", ";", ".", "!", " ", "  ", "\t", "\n", "(", ")",
    "kv-cache#0", "kv-cache#9", "batch#1", "bad#7", "batch", "guides/kv#2", "my doc#3", "my",
    " doc", "kv", "-cache",
    "source", "</source>", '<source id="', '">', "SOURCE", "word", "x", "é",
]  # fmt: skip


def stream(pieces: list[str], ids=IDS) -> tuple[list[str], str]:
    cleaner = AnswerStreamCleaner(ids)
    return [cleaner.feed(piece) for piece in pieces], cleaner.finish()


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.sampled_from(EXAMPLES),
        st.lists(st.sampled_from(TOKENS), max_size=40).map("".join),
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=30),
)
def test_streamed_pieces_clean_to_what_the_whole_answer_cleans_to(text, cuts):
    pieces = split(text, cuts)

    fed, rest = stream(pieces)

    assert "".join(fed) + rest == clean_answer(text, IDS)


@pytest.mark.parametrize("text", EXAMPLES)
def test_character_by_character_streaming_matches_too(text):
    fed, rest = stream(list(text))

    assert "".join(fed) + rest == clean_answer(text, IDS)


def test_plain_text_goes_out_at_once():
    cleaner = AnswerStreamCleaner(IDS)

    assert cleaner.feed("Paged attention") == "Paged attention"
    assert cleaner.feed(" stores") == " stores"
    assert cleaner.feed(" blocks.\n") == " blocks.\n"
    assert cleaner.finish() == ""


def test_spaces_and_a_word_that_may_become_a_bare_id_are_held():
    cleaner = AnswerStreamCleaner(IDS)

    assert cleaner.feed("Blocks ") == "Blocks"
    assert cleaner.feed("kv") == ""  # may become kv-cache#0
    assert cleaner.feed("-cache") == ""
    assert cleaner.feed("#0") == ""
    assert cleaner.feed(". Keys ") == ". Keys"
    assert cleaner.feed("kvm") == " kvm"
    assert cleaner.finish() == ""


def test_a_possible_marker_is_held_until_it_resolves():
    cleaner = AnswerStreamCleaner(IDS)

    assert cleaner.feed("Blocks [kv-") == "Blocks"
    assert cleaner.feed("cache#0") == ""
    assert cleaner.feed("]. Then [bad") == " [kv-cache#0]. Then"
    assert cleaner.feed("#1] done.") == " done."
    assert cleaner.finish() == ""


def test_a_stray_bracket_or_angle_is_released_once_it_cannot_be_a_marker():
    cleaner = AnswerStreamCleaner(IDS)

    assert cleaner.feed("See [") == "See"
    assert cleaner.feed("note ") == ""
    assert cleaner.feed("that") == " [note that"
    assert cleaner.feed(" x < y") == " x < y"
    assert cleaner.feed(" <so") == ""
    assert cleaner.feed("da") == " <soda"
    assert cleaner.finish() == ""


@pytest.mark.parametrize("opening", ["[", "[kv-cache#0, ", "<source ", "<"])
def test_what_is_held_back_is_bounded(opening):
    cleaner = AnswerStreamCleaner(IDS)
    emitted, fed = "", ""

    for char in opening + "a" * 300:
        fed += char
        emitted += cleaner.feed(char)
        assert len(fed) - len(emitted) <= MAX_MARKER_CHARS + 20

    assert emitted + cleaner.finish() == clean_answer(fed, IDS)


def test_an_unclosed_tag_at_the_end_is_dropped_by_finish():
    fed, rest = stream(["The answer. <source id", '="kv-cache#0" title="KV'])

    assert "".join(fed) == "The answer."
    assert rest == ""
