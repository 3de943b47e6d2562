"""PromptLayout: which parts of a prompt the engine's cached tokens came from."""

from __future__ import annotations

import pytest

from pipeline.messages import PromptLayout

LAYOUT = PromptLayout(system=250, history=40, passages=300)


@pytest.mark.parametrize(
    ("cached", "split"),
    [
        (0, (0, 0, 0, 0)),
        (128, (128, 0, 0, 0)),
        (256, (250, 6, 0, 0)),
        (480, (250, 40, 190, 0)),
        (600, (250, 40, 300, 10)),
    ],
)
def test_cached_tokens_fill_the_parts_in_the_prompts_order(cached, split):
    by_segment = LAYOUT.cached_by_segment(cached)

    assert tuple(by_segment.values()) == split
    assert list(by_segment) == ["system", "history", "passages", "question"]
    assert sum(by_segment.values()) == cached


def test_without_history_cached_tokens_go_from_the_system_prompt_to_the_passages():
    assert PromptLayout(250, 0, 300).cached_by_segment(384) == {
        "system": 250,
        "history": 0,
        "passages": 134,
        "question": 0,
    }
