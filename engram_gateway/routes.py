"""The versioned HTTP API (``/v1``): request models and one thin route per library call.

Invariants:
- Request bodies are pydantic models with ``extra="forbid"`` and strict scalars: an unknown field or a
  wrong type is a 400 naming it, before anything runs. Responses are the library's own models, so the
  OpenAPI schema is generated from the same contracts the Python API returns.
- Every list and mapping of a request model has a bound and a list stops at its first bad item, so a
  body fails validation after a bounded amount of work, whatever it holds (the body limit bounds strings).
- Routes are ``def`` (not ``async``): the library is synchronous and FastAPI runs them in its thread pool.
- Scopes: ``write`` enqueues, gives feedback and forgets; ``read`` reads; ``operator`` handles dead
  letters and metrics. Each route names its scope in its signature (``who: Reader``...), and
  ``GuardedRoute`` checks key and scope before the body is read. ``/v1/health``, ``/v1/livez`` and
  ``/v1/readyz`` need no key and say only what is up.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, StringConstraints

from engram_api.models import (
    HISTORY_LIMIT,
    META_KEY_CHARS,
    META_KEYS,
    META_VALUE_CHARS,
    ChatMessage,
    DeadLetter,
    FactRecord,
    ForgetResult,
    GraphPage,
    HealthReport,
    RecallResult,
    Receipt,
    SearchResult,
    UserStats,
)
from engram_api.settings import MAX_BATCH_CAP, MAX_TURNS_CAP
from engram_gateway.guard import GuardedRoute, Operator, Reader, Writer
from engram_gateway.problems import DuplicateMessageError, Problem
from engram_gateway.service import Gateway

__all__ = ["router"]

MetaKey = Annotated[StrictStr, StringConstraints(min_length=1, max_length=META_KEY_CHARS)]
MetaValue = Annotated[StrictStr, StringConstraints(max_length=META_VALUE_CHARS)] | StrictBool | StrictInt | StrictFloat
Metadata = Annotated[dict[MetaKey, MetaValue], Field(max_length=META_KEYS)]
Turns = Annotated[list[ChatMessage], Field(max_length=MAX_TURNS_CAP, fail_fast=True)]
MemoryIds = Annotated[
    list[Annotated[StrictStr, StringConstraints(max_length=128)]], Field(max_length=1_000, fail_fast=True)
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueRequest(_Body):
    user_id: StrictStr = Field(description="'<namespace>.<user>' of the key's namespace")
    messages: StrictStr | Turns = Field(description="a string, or chat turns {role, content}")
    message_id: StrictStr | None = Field(None, description="your id: enqueueing it again is a no-op (409)")
    timestamp: datetime | None = Field(None, description="when it was said, ISO 8601 with a zone")
    metadata: Metadata | None = None
    owner_name: Annotated[StrictStr, StringConstraints(max_length=200)] | None = Field(
        None, description="the memory owner's name: a turn with another `name` is another person"
    )
    earlier: Annotated[list[ChatMessage], Field(max_length=20, fail_fast=True)] | None = Field(
        None, description="preceding turns the extractor sees as context only (never extracted from)"
    )
    utc_offset_minutes: StrictInt | None = Field(
        None, description="the sender's UTC offset, so 'yesterday' is read in the sender's day"
    )


class EnqueueManyRequest(_Body):
    items: list[EnqueueRequest] = Field(max_length=MAX_BATCH_CAP, fail_fast=True)


class ReceiptList(BaseModel):
    receipts: list[Receipt]


class MessageStatus(BaseModel):
    user_id: str
    message_id: str
    state: Literal["queued", "extracted", "applied", "dead"]
    task_id: str | None = None


class RecallRequest(_Body):
    query: StrictStr
    k: StrictInt = 10
    as_of: datetime | None = Field(None, description="what was true at this instant (ISO 8601 with a zone)")
    since: datetime | None = Field(None, description="only what happened at or after this instant (event time)")
    until: datetime | None = Field(None, description="only what happened before this instant (event time)")
    graph_expansion: StrictBool = Field(True, description="also follow the graph from the vector hits")


class SearchRequest(_Body):
    query: StrictStr
    k: StrictInt = 10
    detail_level: Literal["auto", "broad", "detailed"] = "auto"


class ContextRequest(_Body):
    query: StrictStr
    max_tokens: StrictInt = 800


class ContextResponse(BaseModel):
    user_id: str
    context: str


class FeedbackRequest(_Body):
    recall_id: StrictStr
    useful_ids: MemoryIds


class FeedbackResponse(BaseModel):
    rows: int


class Dropped(BaseModel):
    dropped: bool


class Health(BaseModel):
    ok: bool
    checks: dict[str, bool]


# Dependencies are ``async`` because they never block: a sync one would cost a thread-pool hop each.
async def gateway(request: Request) -> Gateway:
    return request.app.state.gateway  # type: ignore[no-any-return]


Gw = Annotated[Gateway, Depends(gateway)]
# Every route may answer these (problem bodies; ``engram_gateway.apidoc`` drops 401, 403 and 429 from the
# routes that need no key).
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": Problem} for code in (400, 401, 403, 413, 429, 503)}

router = APIRouter(prefix="/v1", responses=_ERRORS, route_class=GuardedRoute)


# ------------------------------------------------------------------------------------------ write side
@router.post(
    "/messages",
    status_code=202,
    response_model=Receipt,
    responses={409: {"model": Problem}, 429: {"model": Problem}},
    summary="Enqueue one message (returns at once; extraction runs in the workers)",
)
def enqueue(body: EnqueueRequest, gw: Gw, who: Writer) -> Receipt:
    context = body.model_dump(include={"owner_name", "earlier", "utc_offset_minutes"}, exclude_none=True)
    receipt = gw.enqueue(
        who, body.user_id, body.messages, message_id=body.message_id, timestamp=body.timestamp, metadata=body.metadata,
        **context,
    )  # fmt: skip
    if receipt.duplicate:
        raise DuplicateMessageError(receipt)
    return receipt


@router.post(
    "/messages/batch",
    status_code=202,
    response_model=ReceiptList,
    responses={429: {"model": Problem}},
    summary="Enqueue many messages: all validated before any is queued; known ids come back duplicate=true",
)
def enqueue_many(body: EnqueueManyRequest, gw: Gw, who: Writer) -> ReceiptList:
    items = [item.model_dump(exclude_none=True) for item in body.items]
    return ReceiptList(receipts=gw.enqueue_many(who, items))


@router.get("/users/{user_id}/messages/{message_id}", response_model=MessageStatus, responses={404: {"model": Problem}})
def message_status(user_id: str, message_id: str, gw: Gw, who: Reader) -> dict[str, str]:
    return gw.status(who, user_id, message_id)


@router.post("/users/{user_id}/feedback", response_model=FeedbackResponse)
def feedback(user_id: str, body: FeedbackRequest, gw: Gw, who: Writer) -> FeedbackResponse:
    reader, uid = gw.reader_for(who, user_id, "write")
    return FeedbackResponse(rows=reader.feedback(uid, body.recall_id, body.useful_ids))


@router.delete(
    "/users/{user_id}/memories/{memory_id}", response_model=ForgetResult, responses={404: {"model": Problem}}
)
def forget(user_id: str, memory_id: str, gw: Gw, who: Writer) -> ForgetResult:
    reader, uid = gw.reader_for(who, user_id, "write")
    return reader.forget(uid, memory_id)  # type: ignore[no-any-return]


@router.delete("/users/{user_id}", response_model=ForgetResult, summary="Forget everything of one user")
def forget_user(user_id: str, gw: Gw, who: Writer) -> ForgetResult:
    reader, uid = gw.reader_for(who, user_id, "write")
    return reader.forget_user(uid)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------- read side
@router.post("/users/{user_id}/recall", response_model=RecallResult)
def recall(user_id: str, body: RecallRequest, gw: Gw, who: Reader) -> RecallResult:
    reader, uid = gw.reader_for(who, user_id)
    return reader.recall(  # type: ignore[no-any-return]
        uid,
        body.query,
        body.k,
        as_of=body.as_of,
        since=body.since,
        until=body.until,
        graph_expansion=body.graph_expansion,
    )


@router.post("/users/{user_id}/search", response_model=SearchResult)
def search(user_id: str, body: SearchRequest, gw: Gw, who: Reader) -> SearchResult:
    reader, uid = gw.reader_for(who, user_id)
    return reader.search(uid, body.query, body.k, body.detail_level)  # type: ignore[no-any-return]


@router.post("/users/{user_id}/context", response_model=ContextResponse)
def context(user_id: str, body: ContextRequest, gw: Gw, who: Reader) -> ContextResponse:
    reader, uid = gw.reader_for(who, user_id)
    return ContextResponse(user_id=uid, context=reader.get_context(uid, body.query, body.max_tokens))


@router.get("/users/{user_id}/history", response_model=list[FactRecord])
def history(
    user_id: str,
    gw: Gw,
    who: Reader,
    subject: Annotated[str, Query(description='an entity name or alias; "user" is the user themself')] = "user",
    predicate: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query()] = HISTORY_LIMIT,
) -> list[FactRecord]:
    reader, uid = gw.reader_for(who, user_id)
    return reader.history(uid, subject, predicate, limit)  # type: ignore[no-any-return]


@router.get("/users/{user_id}/graph", response_model=GraphPage)
def graph(
    user_id: str, gw: Gw, who: Reader, page: Annotated[int, Query()] = 1, page_size: Annotated[int, Query()] = 50
) -> GraphPage:
    reader, uid = gw.reader_for(who, user_id)
    return reader.get_graph(uid, page, page_size)  # type: ignore[no-any-return]


@router.get("/users/{user_id}/stats", response_model=UserStats)
def stats(user_id: str, gw: Gw, who: Reader) -> UserStats:
    reader, uid = gw.reader_for(who, user_id)
    return reader.stats(uid)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------- operators
@router.get("/dead-letters", response_model=list[DeadLetter], summary="Dead letters of the key's namespace")
def dead_letters(gw: Gw, who: Operator, user_id: Annotated[str | None, Query()] = None) -> list[DeadLetter]:
    return gw.dead_letters(who, user_id)


@router.post(
    "/dead-letters/{user_id}/{message_id}/replay",
    status_code=202,
    response_model=Receipt,
    responses={404: {"model": Problem}},
)
def replay(user_id: str, message_id: str, gw: Gw, who: Operator) -> Receipt:
    return gw.replay(who, user_id, message_id)


@router.delete("/dead-letters/{user_id}/{message_id}", response_model=Dropped, responses={404: {"model": Problem}})
def drop(user_id: str, message_id: str, gw: Gw, who: Operator) -> Dropped:
    return Dropped(dropped=gw.drop(who, user_id, message_id))


@router.get("/metrics", response_class=Response, summary="Prometheus metrics of this gateway (operator)")
def metrics(request: Request, who: Operator) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/health", response_model=Health, responses={503: {"model": Health}}, summary="Every check (no key)")
def health(gw: Gw) -> JSONResponse:
    return _health_response(_checked(gw, gw.client.health))


@router.get("/livez", response_model=Health, summary="Liveness: the process answers (no key, no dependency)")
async def livez() -> Health:
    # Async and dependency-free: answers even while the thread pool is busy or Neo4j is down.
    return Health(ok=True, checks={})


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}}, summary="Readiness (no key)")
def readyz(gw: Gw) -> JSONResponse:
    """Redis and the graph store answer: 503 takes this replica out of the Service, without a restart."""
    from engram_api.health import check_ready

    return _health_response(_checked(gw, lambda: check_ready(gw.client)))


def _checked(gw: Gateway, check: Callable[[], HealthReport]) -> HealthReport:
    """The report; once more when Redis failed and the embedded Redis turned out to have moved."""
    report = check()
    redis_check = report.checks.get("redis")
    if redis_check is not None and not redis_check.ok and gw.follow_redis():
        report = check()
    return report


def _health_response(report: HealthReport) -> JSONResponse:
    body = Health(ok=report.ok, checks={name: check.ok for name, check in report.checks.items()})
    return JSONResponse(body.model_dump(), status_code=200 if report.ok else 503)
