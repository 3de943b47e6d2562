"""The HTTP API: routes, auth, request ids and the one place errors become responses.

`create_api(state)` builds the FastAPI app around one ingress replica's `ApiState`
(pipeline, config, settings, readiness); the routes read it from `app.state.rag`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import openai_format, rag_format
from app.config import RagAppConfig
from app.errors import (
    ERROR_RESPONSES,
    ApiError,
    bad_request,
    error_body,
    error_response,
    internal,
    not_ready,
)
from app.log import get_logger
from app.pipeline import DoneEvent, ErrorEvent, PipelineEvent, RagPipeline, RagQuery, SourcesEvent
from app.readiness import Readiness
from app.schemas import (
    ChatCompletionRequest,
    ModelCard,
    ModelList,
    RagOptions,
    RagQueryRequest,
    RagQueryResponse,
)
from app.settings import Settings
from retrieval.compression import CompressionPlan

logger = get_logger(__name__)


@dataclass
class ApiState:
    pipeline: RagPipeline
    config: RagAppConfig
    settings: Settings
    readiness: Readiness
    started_at: int


def create_api(state: ApiState | None = None) -> FastAPI:
    """The FastAPI app; without `state` every /v1 route answers 503 (not ready)."""
    api = FastAPI(
        title="RAG serve",
        description="Question answering over a document collection: FAISS retrieval, "
        "context compression, vLLM generation.",
        version="0.1.0",
    )
    api.state.rag = state
    _install_error_handlers(api)
    # Auth runs before routing and body parsing: an unauthenticated caller learns nothing
    # about the request format.
    api.middleware("http")(_authorize)
    api.middleware("http")(_add_request_id_header)
    api.add_api_route("/healthz", _healthz, methods=["GET"])
    api.add_api_route("/readyz", _readyz, methods=["GET"], responses={503: ERROR_RESPONSES[503]})
    api.add_api_route("/v1/models", _models, methods=["GET"], response_model=ModelList)
    api.add_api_route(
        "/v1/rag/query", _rag_query, methods=["POST"],
        responses={200: {"model": RagQueryResponse}, **ERROR_RESPONSES},
    )  # fmt: skip
    api.add_api_route(
        "/v1/chat/completions", _chat_completions, methods=["POST"], responses=ERROR_RESPONSES
    )
    return api


def request_id_of(request: Request) -> str:
    """Serve's id for this request (it honours an incoming x-request-id), else a new one."""
    if not hasattr(request.state, "request_id"):
        request.state.request_id = _serve_request_id() or (
            request.headers.get("x-request-id") or uuid.uuid4().hex
        )
    return request.state.request_id


def _serve_request_id() -> str | None:
    try:
        from ray.serve.context import _get_serve_request_context

        return _get_serve_request_context().request_id or None
    except Exception:  # outside a Serve replica (unit tests) there is no context
        return None


def _state(request: Request) -> ApiState:
    state = getattr(request.app.state, "rag", None)
    if state is None:
        raise not_ready("the service is starting")
    return state


async def _authorize(request: Request, call_next) -> Response:
    """On /v1 routes: 503 until the replica is wired, then a valid bearer key if keys are set."""
    if not request.url.path.startswith("/v1/"):
        return await call_next(request)
    state: ApiState | None = getattr(request.app.state, "rag", None)
    if state is None:
        return error_response(not_ready("the service is starting"), request_id_of(request))
    if not state.settings.auth_required:
        return await call_next(request)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and any(
        hmac.compare_digest(token.encode(), key.encode()) for key in state.settings.api_keys
    ):
        return await call_next(request)
    error = ApiError(
        401,
        "missing or invalid API key: send Authorization: Bearer <key>",
        "authentication_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
    return error_response(error, request_id_of(request))


async def _add_request_id_header(request: Request, call_next) -> Response:
    return _with_request_id(await call_next(request), request)


def _with_request_id(response: Response, request: Request) -> Response:
    # Serve's proxy sets x-request-id on every response; outside Serve, set it here.
    if _serve_request_id() is None and "x-request-id" not in response.headers:
        response.headers["x-request-id"] = request_id_of(request)
    return response


async def _healthz() -> dict:
    return {"status": "ok"}


async def _readyz(request: Request) -> JSONResponse:
    state = getattr(request.app.state, "rag", None)
    if state is None:
        return JSONResponse({"ready": False, "stages": {}}, status_code=503)
    report = await state.readiness.check(fresh=True)
    return JSONResponse(
        {"ready": report.ready, "stages": report.stages}, status_code=200 if report.ready else 503
    )


async def _models(request: Request) -> ModelList:
    state = _state(request)
    return ModelList(data=[ModelCard(id=state.config.generator.model_id, created=state.started_at)])


async def _rag_query(body: RagQueryRequest, request: Request):
    state = _state(request)
    query = await _admit(state, request, body.question, body, body.max_tokens, body.temperature)
    if body.stream:
        return await _stream(state, query, rag_format.sse_events(query))
    result = await _collect(state, query)
    return JSONResponse(rag_format.response_body(result))


async def _chat_completions(body: ChatCompletionRequest, request: Request):
    state = _state(request)
    if body.model != state.config.generator.model_id:
        raise ApiError(
            404,
            f"model {body.model!r} does not exist; this service serves "
            f"{state.config.generator.model_id!r}",
            param="model",
            code="model_not_found",
        )
    question = openai_format.question_of(body)
    max_tokens = body.max_completion_tokens or body.max_tokens
    options = body.rag or RagOptions()
    query = await _admit(state, request, question, options, max_tokens, body.temperature)
    created = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        renderer = openai_format.sse_chunks(query, body.model, created, include_usage)
        return await _stream(state, query, renderer)
    result = await _collect(state, query)
    return JSONResponse(openai_format.completion_body(result, body.model, created))


async def _admit(
    state: ApiState,
    request: Request,
    question: str,
    options: RagOptions,
    max_tokens: int | None,
    temperature: float | None,
) -> RagQuery:
    """Validate what the schema cannot know (limits from config) and check readiness."""
    config = state.config
    question = question.strip()
    if not question:
        raise bad_request("question must not be empty", param="question")
    if len(question) > config.ingress.max_question_chars:
        raise bad_request(
            f"question is longer than {config.ingress.max_question_chars} characters",
            param="question",
        )
    top_k = options.top_k or config.retriever.default_top_k
    if top_k > config.retriever.max_top_k:
        raise bad_request(f"top_k must be at most {config.retriever.max_top_k}", param="top_k")
    max_tokens = max_tokens or config.generator.default_max_tokens
    if max_tokens > config.generator.max_tokens_limit:
        raise bad_request(
            f"max_tokens must be at most {config.generator.max_tokens_limit}", param="max_tokens"
        )
    report = await state.readiness.check()
    if not report.ready:
        raise not_ready(f"not ready yet: {report.stages}")
    return RagQuery(
        question=question,
        top_k=top_k,
        plan=_plan(config, options),
        max_tokens=max_tokens,
        temperature=(config.generator.default_temperature if temperature is None else temperature),
        request_id=request_id_of(request),
        include_context=options.include_context,
    )


def _plan(config: RagAppConfig, options: RagOptions) -> CompressionPlan:
    requested = options.compression
    defaults = config.compression
    method = (requested.method if requested else None) or defaults.default_method
    policy = (requested.policy if requested else None) or defaults.policy
    if requested and (requested.rate is not None or requested.target_tokens is not None):
        return CompressionPlan(
            method, requested.rate or defaults.rate, requested.target_tokens, policy
        )
    return CompressionPlan(method, defaults.rate, defaults.target_tokens, policy)


async def _collect(state: ApiState, query: RagQuery):
    async with asyncio.timeout(state.config.ingress.request_timeout_s):
        async for event in state.pipeline.run(query):
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, DoneEvent):
                return event.result
    raise internal()


async def _stream(state: ApiState, query: RagQuery, renderer) -> StreamingResponse:
    """Run the pipeline up to its first token before committing to a 200 stream."""
    deadline = asyncio.get_running_loop().time() + state.config.ingress.request_timeout_s
    events = state.pipeline.run(query)
    head: list[PipelineEvent] = []
    try:
        async with asyncio.timeout_at(deadline):
            async for event in events:
                head.append(event)
                if not isinstance(event, SourcesEvent):
                    break
    except BaseException:
        await events.aclose()
        raise
    return StreamingResponse(
        _guarded(renderer(_chain(head, events, deadline)), query),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


async def _chain(
    head: list[PipelineEvent], rest: AsyncGenerator[PipelineEvent, None], deadline: float
) -> AsyncIterator[PipelineEvent]:
    for event in head:
        yield event
    try:
        async with asyncio.timeout_at(deadline):
            async for event in rest:
                yield event
    except TimeoutError:
        yield ErrorEvent(
            ApiError(504, "the request ran past its deadline", "timeout", code="timeout")
        )
    finally:
        await rest.aclose()


async def _guarded(chunks: AsyncIterator[str], query: RagQuery) -> AsyncIterator[str]:
    """Once the stream is committed, failures become a final error event, never a traceback."""
    try:
        async for chunk in chunks:
            yield chunk
    except ApiError as error:
        yield _sse_error(error, query.request_id)
    except Exception:
        logger.exception("stream failed (request %s)", query.request_id)
        yield _sse_error(internal(), query.request_id)


def _sse_error(error: ApiError, request_id: str) -> str:
    return f"event: error\ndata: {json.dumps(error_body(error, request_id))}\n\ndata: [DONE]\n\n"


def _install_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error, request_id_of(request))

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(error), request_id_of(request))

    @api.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return error_response(ApiError(error.status_code, str(error.detail), kind), None)

    @api.exception_handler(TimeoutError)
    async def _timeout(request: Request, error: TimeoutError) -> JSONResponse:
        timeout = ApiError(504, "the request ran past its deadline", "timeout", code="timeout")
        return error_response(timeout, request_id_of(request))

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        request_id = request_id_of(request)
        logger.exception("unhandled error (request %s)", request_id)
        # Unhandled errors are answered outside the middleware stack: add the id here.
        return _with_request_id(error_response(internal(), request_id), request)


def _validation_error(error: RequestValidationError) -> ApiError:
    first = error.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if first.get("type") == "json_invalid":
        return bad_request("the request body is not valid JSON", code="invalid_json")
    if first.get("type") == "extra_forbidden":
        return bad_request(f"unknown field '{param}'", param=param, code="unknown_field")
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return bad_request(f"{param}: {message}" if param else message, param=param)
