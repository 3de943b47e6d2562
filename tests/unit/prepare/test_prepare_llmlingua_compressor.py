"""prepare.llmlingua_compressor: how one chunk is handed to LLMLingua's PromptCompressor.

The PromptCompressor is a recording fake: these tests are about the arguments the adapter
passes; LLMLingua itself runs in the integration tests.
"""

from __future__ import annotations

from prepare.llmlingua_compressor import LLMLinguaCompressor, LLMLinguaOptions


class RecordingPromptCompressor:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict]] = []

    def get_token_length(self, text: str) -> int:
        return len(text.split())

    def compress_prompt(self, context: list[str], **kwargs) -> dict:
        self.calls.append((context, kwargs))
        return {"compressed_prompt": "short", "origin_tokens": 10}


def test_longllmlingua_is_question_aware_and_keeps_the_question_out_of_the_output():
    backend = RecordingPromptCompressor()
    compressor = LLMLinguaCompressor(backend, LLMLinguaOptions(rank_method="longllmlingua"))

    assert compressor.compress_chunk("What is KV?", "Long text here.", 0.4) == "short"

    [(context, kwargs)] = backend.calls
    assert context == ["Long text here."]
    assert kwargs["question"] == "What is KV?"
    assert kwargs["rate"] == 0.4
    assert kwargs["rank_method"] == "longllmlingua"
    assert kwargs["concate_question"] is False
    assert kwargs["condition_compare"] is False
    # One segment sized to the chunk (3 words + LLMLingua's 2), so the rate holds.
    assert kwargs["iterative_size"] == 5


def test_llmlingua2_is_question_agnostic_and_keeps_punctuation():
    backend = RecordingPromptCompressor()
    compressor = LLMLinguaCompressor(backend, LLMLinguaOptions(use_llmlingua2=True))

    compressor.compress_chunk("What is KV?", "Long text here.", 0.5)

    [(context, kwargs)] = backend.calls
    assert context == ["Long text here."]
    assert "question" not in kwargs
    assert kwargs["rate"] == 0.5
    assert {".", "?", "\n"} <= set(kwargs["force_tokens"])
