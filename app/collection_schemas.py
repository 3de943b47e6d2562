"""Request and response bodies of the collections, documents and jobs routes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.messages import COLLECTION_NAME_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateCollectionRequest(_Strict):
    name: str = Field(
        ...,
        pattern=COLLECTION_NAME_PATTERN,
        description="Lower-case letters, digits, '-' and '_', at most 63 characters.",
    )


class Collection(BaseModel):
    name: str
    object: Literal["collection"] = "collection"
    read_only: bool = Field(False, description="The shipped corpus: queried, never changed.")
    documents: int = Field(0, description="Documents in the served version.")
    chunks: int = Field(0, description="Chunks in the served version.")
    version: str | None = Field(None, description="The served version; none before the first.")
    updated_at: float | None = Field(None, description="When it was published (Unix seconds).")


class CollectionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Collection]


class CollectionDeleted(BaseModel):
    name: str
    object: Literal["collection"] = "collection"
    deleted: bool = True


class DocumentIn(_Strict):
    id: str | int = Field(..., description="Stable id; a later add with the same id replaces it.")
    title: str | None = Field(None, description="Defaults to the id.")
    text: str = Field(..., description="The document's text.")


class AddDocumentsRequest(_Strict):
    documents: list[DocumentIn] = Field(..., min_length=1)


class DocumentInfo(BaseModel):
    id: str
    title: str
    chunks: int
    chars: int | None = None
    updated_at: float | None = None


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentInfo]
    total: int = Field(..., description="Documents in the collection, over all pages.")
    offset: int


class JobError(BaseModel):
    document: str = Field(..., description="The record, file or id concerned; '' for the job.")
    message: str


class Job(BaseModel):
    id: str
    object: Literal["job"] = "job"
    collection: str
    action: Literal["add", "delete"]
    status: Literal["queued", "running", "succeeded", "failed"] = Field(
        ...,
        description="'succeeded' once the new version is published: every query that starts "
        "afterwards, on any replica, is answered from it.",
    )
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    progress: float = Field(..., ge=0, le=1)
    counts: dict[str, int] = Field(
        default_factory=dict,
        description="received, unreadable, added, replaced, deleted, not_found; documents and "
        "chunks in the published version; embedded_chunks (only new text is embedded).",
    )
    errors: list[JobError] = Field(default_factory=list)
    version: str | None = Field(None, description="The version the job published.")
