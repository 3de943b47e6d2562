"""The HTTP API: routes, admission, and the one place failures become responses.

`create_api(state)` builds the FastAPI app around one ingress replica's `ApiState`; the
routes read it from `app.state.rag`. Order of checks on a /v1 request: API key (401)
and per-key rate (429) from the headers alone; body size (413, from Content-Length before
the body is read, or as a chunked body passes the limit); then the route validates the
body (400); then admission: readiness from memory (503 not_ready) and the in-flight gate
(503 overloaded), both with Retry-After and without calling any stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from app import openai_format, rag_format, responses_format, sampling
from app.admission import BodySizeLimit, CapacityHeader, InFlightGate, KeyRateLimiter
from app.collections_api import CollectionsBackend, install_collection_routes
from app.config import RagAppConfig
from app.embeddings_api import EmbeddingsBackend, install_embedding_route
from app.error_metrics import ErrorCounter, ErrorSink
from app.errors import (
    DEADLINE_PASSED,
    ERROR_RESPONSES,
    ApiError,
    at_capacity,
    bad_request,
    error_body,
    error_response,
    internal,
    not_ready,
    payload_too_large,
    stage_unavailable,
    timed_out,
    upload_budget_exceeded,
)
from app.guard import RequestGuard, grant_of, request_id_of
from app.keys import check_read
from app.playground import install_playground
from app.proxy_admission import CAPACITY_HEADER, capacity_value
from app.readiness import ReadinessMonitor
from app.schemas import (
    ChatCompletionRequest,
    ModelCard,
    ModelList,
    RagOptions,
    RagQueryRequest,
    RagQueryResponse,
    ResponsesRequest,
)
from app.settings import Settings
from app.upload_budget import UploadBudget, UploadBudgetGate
from pipeline.config_base import most_replicas
from pipeline.log import get_logger
from pipeline.messages import (
    DEFAULT_COLLECTION,
    DEFAULT_SAMPLING,
    CompressionPlan,
    Sampling,
    SearchOptions,
    Turn,
)
from pipeline.rag import (
    DoneEvent,
    FailedEvent,
    PipelineEvent,
    RagPipeline,
    RagQuery,
    RagResult,
    RequestRefused,
    SourcesEvent,
)
from pipeline.stages import StageUnavailable

logger = get_logger(__name__)

# Document uploads (POST) may be larger than other bodies: collections.max_upload_bytes.
UPLOAD_PATH = re.compile(r"/v1/collections/[^/]+/documents")


def is_upload(scope: Scope) -> bool:
    """Whether the request adds documents to a collection (a body up to max_upload_bytes)."""
    return scope["method"] == "POST" and UPLOAD_PATH.fullmatch(scope["path"]) is not None


@dataclass
class ApiState:
    pipeline: RagPipeline
    config: RagAppConfig
    settings: Settings
    readiness: ReadinessMonitor
    started_at: int
    gate: InFlightGate
    rate_limiter: KeyRateLimiter | None = None
    # Serve's id for the current request (it honours an incoming x-request-id), if any.
    serve_request_id: Callable[[], str | None] = field(default=lambda: None)
    # Told of every error response (status, OpenAI error code): the ingress's metrics.
    count_error: ErrorSink = field(default=lambda status, code: None)
    # The collections API's backend (the collection writer); None: collections are off.
    collections: CollectionsBackend | None = None
    # The retriever's embedder for /v1/embeddings, and the name clients give its model.
    embeddings: EmbeddingsBackend | None = None
    embedding_model_id: str = "embeddings"

    def retune(self, config: RagAppConfig) -> None:
        """Serve the ingress-only settings of `config` (app.tuning) from the next request
        on: limits, timeouts, the rate limit (its buckets kept when it is unchanged)."""
        if config.ingress.rate_limit != self.config.ingress.rate_limit:
            limit = config.ingress.rate_limit
            self.rate_limiter = KeyRateLimiter(limit.requests_per_s, limit.burst) if limit else None
        self.gate.limit = config.in_flight_limit()
        self.pipeline.set_timeouts(config.compression.timeout_s, config.citations.timeout_s)
        self.config = config

    def capacity_value(self) -> bytes:
        """What the whole service admits at once (this replica's gate times the ingress
        replicas) and its Retry-After, for Serve's proxy (app.proxy_admission)."""
        replicas = most_replicas(self.config.ingress.deployment)
        return capacity_value(self.gate.limit * replicas, self.config.ingress.retry_after_s)


def create_api(state: ApiState | None = None) -> FastAPI:
    """The FastAPI app; without `state` every /v1 route answers 503 (not ready)."""
    api = FastAPI(
        title="RAG serve",
        description="Question answering over a document collection: FAISS retrieval, "
        "context compression, vLLM generation.",
        version="0.2.0",
        lifespan=_lifespan(state),
        # The default /docs loads Swagger UI from a CDN; the playground module serves it locally.
        docs_url=None,
        redoc_url=None,
    )
    api.state.rag = state
    _install_error_handlers(api)
    _install_middleware(api, state)
    _install_routes(api, state)
    return api


def _lifespan(
    state: ApiState | None,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: the readiness monitor runs while the app serves."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if state is not None:
            # Know the stages before serving: Serve routes to this replica once startup
            # ends, and an empty report would refuse its first requests as not ready.
            await state.readiness.refresh()
            state.readiness.start()
        yield
        if state is not None:
            await state.readiness.stop()

    return lifespan


def _install_middleware(api: FastAPI, state: ApiState | None) -> None:
    """Admission before any route: body size, upload budget, key and rate, error counting
    and the capacity header (the last two only with `state`)."""
    limit = state.config.ingress.max_body_bytes if state else 1 << 20
    upload_limit = state.config.collections.max_upload_bytes if state else limit

    def limit_of(scope: Scope) -> int:
        return upload_limit if is_upload(scope) else limit

    # Middleware added last runs first: the request guard (key, rate), then the body-size
    # check. No body byte is read for a caller without a valid key: a chunked body is only
    # buffered (up to its limit) once the guard has let the request through.
    api.add_middleware(
        BodySizeLimit,
        max_bytes=limit,
        render_error=lambda scope: error_body(payload_too_large(limit_of(scope))),
        max_bytes_for=limit_of,
    )
    if state is not None:
        collections = state.config.collections
        api.state.upload_budget = UploadBudget(
            collections.upload_bytes_in_flight_per_caller, collections.upload_bytes_in_flight
        )
        api.add_middleware(
            UploadBudgetGate,
            budget=api.state.upload_budget,
            is_upload=is_upload,
            largest_upload_bytes=upload_limit,
            refusal=upload_budget_exceeded(state.config.ingress.retry_after_s),
        )
    api.add_middleware(RequestGuard)
    if state is not None:
        # Outermost: it sees the errors of the two above as well as the handlers'.
        api.add_middleware(ErrorCounter, sink=state.count_error)
        api.add_middleware(CapacityHeader, name=CAPACITY_HEADER, value=state.capacity_value)


def _install_routes(api: FastAPI, state: ApiState | None) -> None:
    """Health and readiness, the /v1 routes (collections only with a collections backend),
    and the playground."""
    api.add_api_route("/healthz", _healthz, methods=["GET"])
    api.add_api_route("/readyz", _readyz, methods=["GET"], responses={503: ERROR_RESPONSES[503]})
    # The key is checked by RequestGuard before the body is read; this only declares it in
    # the OpenAPI document, so /docs has an Authorize button.
    declares_key = [Depends(HTTPBearer(auto_error=False, description="RAG_API_KEYS"))]
    api.add_api_route(
        "/v1/models", _models, methods=["GET"], response_model=ModelList,
        responses={401: ERROR_RESPONSES[401]}, dependencies=declares_key,
    )  # fmt: skip
    api.add_api_route(
        "/v1/rag/query", _rag_query, methods=["POST"],
        responses={200: {"model": RagQueryResponse}, **ERROR_RESPONSES},
        dependencies=declares_key,
    )  # fmt: skip
    api.add_api_route(
        "/v1/chat/completions", _chat_completions, methods=["POST"], responses=ERROR_RESPONSES,
        dependencies=declares_key,
    )  # fmt: skip
    install_embedding_route(api, declares_key, _state, _admitted)
    api.add_api_route(
        "/v1/responses", _responses, methods=["POST"], responses=ERROR_RESPONSES,
        dependencies=declares_key,
    )  # fmt: skip
    if state is not None and state.collections is not None:
        install_collection_routes(api, declares_key)
    install_playground(api)


def _state(request: Request) -> ApiState:
    state = getattr(request.app.state, "rag", None)
    if state is None:
        raise not_ready("the service is starting", retry_after_s=5)
    return state


async def _healthz() -> dict:
    return {"status": "ok"}


async def _readyz(request: Request) -> JSONResponse:
    state: ApiState | None = getattr(request.app.state, "rag", None)
    if state is None:
        return JSONResponse({"ready": False, "stages": {}}, status_code=503)
    report = state.readiness.report
    return JSONResponse(report.body(), status_code=200 if report.ready else 503)


async def _models(request: Request) -> ModelList:
    state = _state(request)
    models = [state.config.generator.model_id, state.embedding_model_id]
    return ModelList(data=[ModelCard(id=model, created=state.started_at) for model in models])


async def _rag_query(body: RagQueryRequest, request: Request):
    state = _state(request)
    history = tuple(Turn(turn.role, turn.content) for turn in body.history)
    asked = Asked(body.question, body, body.max_tokens, body.temperature, history)
    query = _query(state, request, asked)
    if body.stream:
        return await _stream(state, query, rag_format.sse_events(query))
    result = await _collect(state, query)
    return JSONResponse(rag_format.response_body(result))


def _check_model(state: ApiState, model: str) -> None:
    if model != state.config.generator.model_id:
        raise ApiError(
            404,
            f"model {model!r} does not exist; this service serves "
            f"{state.config.generator.model_id!r}",
            param="model",
            code="model_not_found",
        )


async def _chat_completions(body: ChatCompletionRequest, request: Request):
    state = _state(request)
    _check_model(state, body.model)
    sampling.check_refused(body)
    chat = openai_format.conversation_of(body)
    max_tokens = body.max_completion_tokens or body.max_tokens
    options = body.rag or RagOptions()
    asked = Asked(
        chat.question, options, max_tokens, body.temperature, chat.history, "messages",
        chat.positions, openai_format.sampling_of(body), body.n,
    )  # fmt: skip
    query = _query(state, request, asked)
    created = int(time.time())
    ignored = chat.ignored_system_messages
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        renderer = openai_format.sse_chunks(query, body.model, created, include_usage, ignored)
        return await _stream(state, query, renderer)
    result = await _collect(state, query)
    return JSONResponse(
        openai_format.completion_body(result, body.model, created, ignored, body.logprobs)
    )


async def _responses(body: ResponsesRequest, request: Request):
    state = _state(request)
    _check_model(state, body.model)
    responses_format.check_refused(body)
    chat = responses_format.conversation_of(body)
    asked = Asked(
        chat.question, body.rag or RagOptions(), body.max_output_tokens, body.temperature,
        chat.history, "input", chat.positions, responses_format.sampling_of(body),
    )  # fmt: skip
    query = _query(state, request, asked)
    builder = responses_format.ResponseBuilder(query, body, int(time.time()))
    if body.stream:
        return await _stream(state, query, responses_format.sse_events(builder))
    result = await _collect(state, query)
    return JSONResponse(responses_format.response_body(result, builder))


@dataclass(frozen=True)
class Asked:
    """What a query route was asked, in the terms both routes share."""

    question: str
    options: RagOptions
    max_tokens: int | None
    temperature: float | None
    history: tuple[Turn, ...] = ()
    # The request field the earlier turns came from, named in a 400 about them.
    history_param: Literal["history", "messages", "input"] = "history"
    # The turns' indexes in that field, where they differ from their order.
    positions: tuple[int, ...] | None = None
    sampling: Sampling = DEFAULT_SAMPLING
    n: int = 1


def _query(state: ApiState, request: Request, asked: Asked) -> RagQuery:
    """Validate what the schema cannot know (limits from config, the key's scopes)."""
    config, options = state.config, asked.options
    check_read(grant_of(request), options.collection or DEFAULT_COLLECTION)
    _check_history(config, asked.history, asked.history_param, asked.positions)
    question = asked.question.strip()
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
    max_tokens = asked.max_tokens or config.generator.default_max_tokens
    if max_tokens > config.generator.max_tokens_limit:
        raise bad_request(
            f"max_tokens must be at most {config.generator.max_tokens_limit}", param="max_tokens"
        )
    return RagQuery(
        question=question,
        top_k=top_k,
        plan=_plan(config, options),
        max_tokens=max_tokens,
        temperature=(
            config.generator.default_temperature if asked.temperature is None else asked.temperature
        ),
        request_id=request_id_of(request),
        include_context=options.include_context,
        history=asked.history,
        retrieval_query=options.retrieval_query or config.conversation.retrieval_query,
        answer_style=options.answer_style or config.prompt.answer_style,
        citations=config.citations.enabled if options.citations is None else options.citations,
        search=_search(options),
        sampling=asked.sampling,
        n=asked.n,
    )


def _search(options: RagOptions) -> SearchOptions:
    asked = options.retrieval
    if asked is None:
        return SearchOptions(collection=options.collection)
    return SearchOptions(
        asked.mode, asked.dense_weight, asked.lexical_weight, collection=options.collection
    )


def _check_history(
    config: RagAppConfig,
    history: tuple[Turn, ...],
    param: str,
    positions: tuple[int, ...] | None = None,
) -> None:
    """Earlier turns within the configured limits, else a 400 naming the field;
    `positions` are the turns' indexes in the request's list, where they differ."""
    limits = config.conversation
    if len(history) > limits.max_turns:
        raise bad_request(
            f"{param} holds {len(history)} earlier turns; at most {limits.max_turns} are accepted",
            param=param,
        )
    for index, turn in enumerate(history):
        if len(turn.content) > limits.max_turn_chars:
            field_name = f"{param}.{positions[index] if positions else index}.content"
            raise bad_request(
                f"{field_name} is longer than {limits.max_turn_chars} characters",
                param=field_name,
            )


def _plan(config: RagAppConfig, options: RagOptions) -> CompressionPlan:
    requested = options.compression
    defaults = config.compression
    method = (requested.method if requested else None) or defaults.default_method
    policy = (requested.policy if requested else None) or defaults.policy
    reuse = defaults.reuse.enabled
    if requested and requested.reuse is not None:
        reuse = requested.reuse
    if requested and (requested.rate is not None or requested.target_tokens is not None):
        return CompressionPlan(
            method, requested.rate or defaults.rate, requested.target_tokens, policy, reuse
        )
    return CompressionPlan(method, defaults.rate, None, policy, reuse)


def _admit(state: ApiState) -> None:
    """Refuse at once, from memory, what the service cannot take now; else hold a slot
    (the caller releases it with `state.gate.leave()`)."""
    retry_after_s = state.config.ingress.retry_after_s
    report = state.readiness.report
    if not report.ready:
        down = ", ".join(name for name, status in report.stages.items() if status != "ready")
        raise not_ready(f"not ready: {down or 'starting'}", retry_after_s)
    if not state.gate.try_enter():
        raise at_capacity(state.gate.limit, retry_after_s)


@contextlib.asynccontextmanager
async def _admitted(state: ApiState) -> AsyncIterator[None]:
    """An in-flight slot for the block, refused at once as `_admit` refuses."""
    _admit(state)
    try:
        yield
    finally:
        state.gate.leave()


async def _collect(state: ApiState, query: RagQuery) -> RagResult:
    async with _admitted(state), asyncio.timeout(state.config.ingress.request_timeout_s):
        async for event in state.pipeline.run(query):
            if isinstance(event, FailedEvent):
                raise ApiError.from_stage(event.error, state.config.ingress.retry_after_s)
            if isinstance(event, DoneEvent):
                return event.result
    raise internal()


async def _stream(
    state: ApiState,
    query: RagQuery,
    renderer: Callable[[AsyncIterator[PipelineEvent]], AsyncIterator[ServerSentEvent]],
) -> EventSourceResponse:
    """Run the pipeline up to its first token before committing to a 200 stream."""
    _admit(state)
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
        state.gate.leave()
        raise
    body = _guarded(renderer(_chain(head, events, deadline)), state, query)
    return EventSourceResponse(body, sep="\n", headers={"Cache-Control": "no-cache"})


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
        yield FailedEvent(DEADLINE_PASSED)
    finally:
        await rest.aclose()


async def _guarded(
    events: AsyncIterator[ServerSentEvent], state: ApiState, query: RagQuery
) -> AsyncIterator[ServerSentEvent]:
    """Once the stream is committed, failures become a final error event, never a traceback.
    The in-flight slot is held until the stream ends, however it ends."""
    try:
        async for event in events:
            yield event
    except Exception:  # the pipeline's own failures arrive as FailedEvents, not here
        logger.exception("stream failed (request %s)", query.request_id)
        yield rag_format.error_event(internal(), query.request_id)
        yield rag_format.DONE
    finally:
        state.gate.leave()


def _install_error_handlers(api: FastAPI) -> None:
    def retry_after(request: Request) -> float:
        state: ApiState | None = getattr(request.app.state, "rag", None)
        return state.config.ingress.retry_after_s if state else 5.0

    @api.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error, request_id_of(request))

    @api.exception_handler(RequestRefused)
    async def _refused(request: Request, exc: RequestRefused) -> JSONResponse:
        error = ApiError.from_stage(exc.error, retry_after(request))
        return error_response(error, request_id_of(request))

    @api.exception_handler(StageUnavailable)
    async def _unavailable(request: Request, exc: StageUnavailable) -> JSONResponse:
        return error_response(stage_unavailable(exc, retry_after(request)), request_id_of(request))

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(error), request_id_of(request))

    @api.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return error_response(ApiError(error.status_code, str(error.detail), kind), None)

    @api.exception_handler(TimeoutError)
    async def _timeout(request: Request, error: TimeoutError) -> JSONResponse:
        return error_response(timed_out(), request_id_of(request))

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        request_id = request_id_of(request)
        logger.exception("unhandled error (request %s)", request_id)
        response = error_response(internal(), request_id)
        # Answered outside the middleware stack; Serve's proxy adds the id itself.
        state: ApiState | None = getattr(request.app.state, "rag", None)
        if state is None or state.serve_request_id() is None:
            response.headers["x-request-id"] = request_id
        return response


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
