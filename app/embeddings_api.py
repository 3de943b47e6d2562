"""`POST /v1/embeddings`: the retriever's own embedding model, the vectors its index holds.

The texts go to the retriever stage, which embeds them in its request batches (unit
vectors, so a dot product is the cosine the index ranks by). `encoding_format` is `float`
or `base64` (little-endian float32, as OpenAI sends it); token arrays as input are refused,
since the model reads text.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, Literal, Protocol

import numpy as np
from fastapi import FastAPI, Request
from fastapi.params import Depends
from pydantic import BaseModel, ConfigDict, Field

from app.errors import ERROR_RESPONSES, ApiError, bad_request, not_ready
from pipeline.messages import EmbeddedTexts, StageError

# Texts one request may embed: each is a row of the retriever's batches.
MAX_EMBEDDING_INPUTS = 256


class EmbeddingsBackend(Protocol):
    """The retriever's embedder, however it is reached (deployments.handles)."""

    async def embed(self, texts: list[str]) -> EmbeddedTexts | StageError: ...


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description=f"A text or up to {MAX_EMBEDDING_INPUTS} texts (not token arrays)."
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(
        None, ge=1, description="Only the model's own dimension is served."
    )
    user: str | None = Field(None, description="Accepted and ignored.")


def texts_of(body: EmbeddingRequest, max_chars: int) -> list[str]:
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise bad_request("input must hold at least one text", param="input")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise bad_request(f"input: at most {MAX_EMBEDDING_INPUTS} texts", param="input")
    for index, text in enumerate(texts):
        where = "input" if isinstance(body.input, str) else f"input.{index}"
        if not isinstance(text, str):
            raise bad_request(
                f"{where}: token arrays are not accepted; send text",
                param=where,
                code="unsupported_parameter",
            )
        if not text.strip():
            raise bad_request(f"{where} must not be empty", param=where)
        if len(text) > max_chars:
            raise bad_request(f"{where} is longer than {max_chars} characters", param=where)
    return [str(text) for text in texts]


def embeddings_body(
    embedded: EmbeddedTexts, model: str, encoding: Literal["float", "base64"]
) -> dict[str, Any]:
    vectors = np.asarray(embedded.vectors, dtype="<f4")
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": (
                base64.b64encode(vector.tobytes()).decode()
                if encoding == "base64"
                else vector.tolist()
            ),
        }
        for index, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def install_embedding_route(
    api: FastAPI,
    declares_key: list[Depends],
    state_of: Callable[[Request], Any],
    admitted: Callable[[Any], Any],
) -> None:
    """`state_of` gives the request's ApiState; `admitted(state)` is the in-flight gate's
    context (the embeddings share the service's capacity with the queries)."""

    async def create_embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
        state = state_of(request)
        model = state.embedding_model_id
        if body.model != model:
            raise ApiError(
                404,
                f"model {body.model!r} does not embed here; the embedding model is {model!r}",
                "not_found_error",
                param="model",
                code="model_not_found",
            )
        if state.embeddings is None:
            raise not_ready("embeddings are not served by this replica", 5)
        texts = texts_of(body, state.config.ingress.max_question_chars)
        async with admitted(state):
            embedded = await state.embeddings.embed(texts)
        if isinstance(embedded, StageError):
            raise ApiError.from_stage(embedded)
        width = embedded.vectors.shape[1]
        if body.dimensions is not None and body.dimensions != width:
            raise bad_request(
                f"dimensions: this model's vectors have {width} dimensions", param="dimensions"
            )
        return embeddings_body(embedded, model, body.encoding_format)

    api.add_api_route(
        "/v1/embeddings", create_embeddings, methods=["POST"], responses=ERROR_RESPONSES,
        dependencies=declares_key,
    )  # fmt: skip
