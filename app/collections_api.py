"""The collections, documents and jobs routes: a thin layer over the collection writer.

Adding or deleting documents is a job: the route answers 202 with the job at once, and
`GET /v1/jobs/{id}` follows it until it is `succeeded` (the new version is published and
served) or `failed`. The same key, rate limit, request ids and error shape as every /v1 route
apply (app.guard, app.errors); the writer's refusals arrive as StageErrors.
"""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import FastAPI, Query, Request
from fastapi.params import Depends
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from app.collection_schemas import (
    AddDocumentsRequest,
    Collection,
    CollectionDeleted,
    CollectionList,
    CreateCollectionRequest,
    DocumentList,
    Job,
)
from app.errors import ERROR_RESPONSES, ApiError, bad_request, not_ready
from app.guard import grant_of
from app.keys import check_read, check_write
from pipeline.messages import StageError


class FileReader(Protocol):
    """An uploaded file's bytes, read in pieces (Starlette's UploadFile, spooled to disk)."""

    async def read(self, size: int = -1) -> bytes: ...


# (file name, its bytes, content type) of one uploaded file.
UploadedFile = tuple[str, FileReader, str | None]
DOCUMENTS_PATH = "/v1/collections/{name}/documents"


class CollectionsBackend(Protocol):
    """The collection writer, however it is reached (deployments.collection_handles)."""

    async def create_collection(self, name: str) -> dict[str, Any] | StageError: ...

    async def delete_collection(self, name: str) -> dict[str, Any] | StageError: ...

    async def list_collections(self) -> dict[str, Any] | StageError: ...

    async def list_documents(
        self, name: str, offset: int, limit: int
    ) -> dict[str, Any] | StageError: ...

    async def submit(
        self,
        name: str,
        action: str,
        records: list[dict[str, Any]],
        files: list[UploadedFile],
        deletes: list[str],
    ) -> dict[str, Any] | StageError: ...

    async def job(self, job_id: str) -> dict[str, Any] | StageError: ...


def install_collection_routes(api: FastAPI, dependencies: list[Depends]) -> None:
    """Add the routes to `api`; they reach the backend as `app.state.rag.collections`."""

    def route(path: str, endpoint, method: str, model, status: int = 200) -> None:
        api.add_api_route(
            path,
            endpoint,
            methods=[method],
            status_code=status,
            response_model=model,
            responses=ERROR_RESPONSES,
            dependencies=dependencies,
            tags=["collections"],
        )

    route("/v1/collections", _create_collection, "POST", Collection, 201)
    route("/v1/collections", _list_collections, "GET", CollectionList)
    route("/v1/collections/{name}", _delete_collection, "DELETE", CollectionDeleted)
    api.add_api_route(
        DOCUMENTS_PATH, _add_documents, methods=["POST"], status_code=202, response_model=Job,
        responses=ERROR_RESPONSES, dependencies=dependencies, tags=["collections"],
        openapi_extra={"requestBody": _ADD_DOCUMENTS_BODY},
    )  # fmt: skip
    route(DOCUMENTS_PATH, _list_documents, "GET", DocumentList)
    route(f"{DOCUMENTS_PATH}/{{doc_id:path}}", _delete_document, "DELETE", Job, 202)
    route("/v1/jobs/{job_id}", _job, "GET", Job)


async def _create_collection(body: CreateCollectionRequest, request: Request) -> Any:
    check_write(grant_of(request), body.name)
    return _answer(request, await _backend(request).create_collection(body.name))


async def _list_collections(request: Request) -> Any:
    listing = _answer(request, await _backend(request).list_collections())
    grant = grant_of(request)
    readable = [c for c in listing["data"] if grant.can_read(c["name"])]
    return {**listing, "data": readable}


async def _delete_collection(name: str, request: Request) -> Any:
    return _answer(request, await _backend(request).delete_collection(name))


async def _add_documents(name: str, request: Request) -> Any:
    """JSON `{documents: [{id, title, text}]}`, or multipart files (.txt, .md, .html, .pdf,
    .json, .jsonl), in any form field."""
    backend = _backend(request)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        submitted = await backend.submit(name, "add", await _json_records(request), [], [])
        return _answer(request, submitted)
    form = await request.form()  # each file spooled to a temporary file past 1 MiB
    try:
        submitted = await backend.submit(name, "add", [], _uploaded_files(form), [])
    finally:
        await form.close()
    return _answer(request, submitted)


async def _list_documents(
    name: str,
    request: Request,
    offset: int = Query(0, ge=0, description="Documents to skip."),
    limit: int = Query(100, ge=1, le=1000, description="Documents per page."),
) -> Any:
    return _answer(request, await _backend(request).list_documents(name, offset, limit))


async def _delete_document(name: str, doc_id: str, request: Request) -> Any:
    return _answer(request, await _backend(request).submit(name, "delete", [], [], [doc_id]))


async def _job(job_id: str, request: Request) -> Any:
    job = _answer(request, await _backend(request).job(job_id))
    check_read(grant_of(request), job["collection"])
    return job


def _backend(request: Request) -> CollectionsBackend:
    state = getattr(request.app.state, "rag", None)
    if state is None:
        raise not_ready("the service is starting", retry_after_s=5)
    return state.collections


def _answer(request: Request, result: dict[str, Any] | StageError) -> Any:
    if isinstance(result, StageError):
        retry_after_s = request.app.state.rag.config.ingress.retry_after_s
        raise ApiError.from_stage(result, retry_after_s)
    return result


async def _json_records(request: Request) -> list[dict[str, Any]]:
    try:
        body = AddDocumentsRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        raise _invalid(exc) from None
    return [document.model_dump() for document in body.documents]


def _uploaded_files(form: FormData) -> list[UploadedFile]:
    files: list[UploadedFile] = []
    for field, value in form.multi_items():
        if not isinstance(value, UploadFile):
            raise bad_request(
                f"form field {field!r} is not a file: send documents as files, or as "
                "JSON {documents: [...]}",
                param=field,
            )
        files.append((value.filename or field, value, value.content_type))
    if not files:
        raise bad_request("the form holds no files", param="files")
    return files


def _invalid(exc: ValidationError) -> ApiError:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return bad_request("the request body is not valid JSON", code="invalid_json")
    param = ".".join(str(part) for part in first.get("loc", ())) or None
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return bad_request(f"{param}: {message}" if param else message, param=param)


def _inlined(schema: Any, definitions: dict[str, Any] | None = None) -> Any:
    """`schema` with its local `$defs` references replaced by what they name (a request
    body declared by hand has no components of its own to point at)."""
    if definitions is None:
        definitions = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inlined(definitions[schema["$ref"].rsplit("/", 1)[-1]], definitions)
        return {k: _inlined(v, definitions) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inlined(item, definitions) for item in schema]
    return schema


_ADD_DOCUMENTS_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": _inlined(AddDocumentsRequest.model_json_schema())},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "files": {"type": "array", "items": {"type": "string", "format": "binary"}}
                },
            }
        },
    },
}
