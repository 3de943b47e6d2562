"""retrieval.sentences: regex sentence spans, no model."""

from __future__ import annotations

import pytest

from retrieval.sentences import split_sentences


def _sentences(text: str) -> list[str]:
    return [text[start:end] for start, end in split_sentences(text)]


def test_spans_are_character_offsets_of_trimmed_sentences():
    text = "  Hello world.  This is it! Is it? Yes.\n"

    spans = split_sentences(text)

    assert spans == [(2, 14), (16, 27), (28, 34), (35, 39)]
    assert [text[a:b] for a, b in spans] == ["Hello world.", "This is it!", "Is it?", "Yes."]


def test_blank_lines_and_whitespace_only_lines_produce_no_sentences():
    assert _sentences("a\n\n\nb\n   \n c") == ["a", "b", "c"]
    assert split_sentences("") == []
    assert split_sentences(" \n\t ") == []


def test_list_items_are_sentences_of_their_own_and_a_heading_travels_with_the_next():
    assert _sentences("# Title\n- item one\n- item two") == ["# Title\n- item one", "- item two"]


def test_headings_never_stand_alone():
    text = "# Chunked Prefill\n\n## Why\nPrefill is split. Decode goes on.\n### Trailing"
    # Both headings travel with the first sentence after them; the last has none: left out.
    assert _sentences(text) == ["# Chunked Prefill\n\n## Why\nPrefill is split.", "Decode goes on."]
    # A hash without a space after it is text, not a heading.
    assert _sentences("#hashtag stays.\nNext.") == ["#hashtag stays.", "Next."]
    assert _sentences("# Only a heading") == []


def test_closing_quote_or_bracket_stays_with_its_sentence():
    assert _sentences('He said "Stop." Then left.') == ['He said "Stop."', "Then left."]
    assert _sentences("Ends (like this.) Next one.") == ["Ends (like this.)", "Next one."]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # No break before a lower-case word or inside a number.
        ("version 2.0 is out. then more", ["version 2.0 is out. then more"]),
        ("He met e.g. people.", ["He met e.g. people."]),
        # Abbreviations before a capital do split: the splitter has no abbreviation list.
        ("Dr. Smith arrived.", ["Dr.", "Smith arrived."]),
        ("U.S. Army. The end.", ["U.S.", "Army.", "The end."]),
        # Digits and Markdown openers start sentences too.
        ("Step one. 2 more steps.", ["Step one.", "2 more steps."]),
        ("Done. *Bold* start.", ["Done.", "*Bold* start."]),
    ],
)
def test_boundaries_as_the_regex_draws_them(text, expected):
    assert _sentences(text) == expected
