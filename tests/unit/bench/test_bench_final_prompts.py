"""bench.final_prompts' pure part: the compression plan, the ingress's own. Building the
prompts loads the embedder, the index and the tokenizer: the integration runs cover that."""

from __future__ import annotations

import pytest

from app.api import _plan
from app.config import parse_config
from app.schemas import CompressionOptions, RagOptions
from bench.final_prompts import compression_plan
from pipeline.messages import COMPRESSION_METHODS


@pytest.mark.parametrize("method", [None, *COMPRESSION_METHODS])
def test_compression_plan_is_the_one_the_ingress_makes(method):
    config = parse_config({"compression": {"rate": 0.3, "target_tokens": 200}})
    options = RagOptions(compression=CompressionOptions(method=method) if method else None)
    assert compression_plan(config, method) == _plan(config, options)
