"""The versioned HTTP API (``/v1``): request models and one thin route per library call.

Invariants:
- Request bodies are pydantic models with ``extra="forbid"`` and strict scalars: an unknown field or a
  wrong type is a 400 naming it, before anything runs. Responses are the library's own models, so the
  OpenAPI schema is generated from the same contracts the Python API returns.
- Routes are ``def`` (not ``async``): the library is synchronous and FastAPI runs them in its thread pool.
- Scopes: ``write`` enqueues, gives feedback and forgets; ``read`` reads; ``operator`` handles dead
  letters and metrics. ``/v1/health``, ``/v1/livez`` and ``/v1/readyz`` need no key and say only what is up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from engram_api.models import (
    HISTORY_LIMIT,
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
from engram_gateway.auth import Principal
from engram_gateway.problems import DuplicateMessageError, Problem
from engram_gateway.service import Gateway

__all__ = ["router"]

MetaValue = StrictStr | StrictBool | StrictInt | StrictFloat


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueRequest(_Body):
    user_id: StrictStr = Field(description="'<namespace>.<user>' of the key's namespace")
    messages: StrictStr | list[ChatMessage] = Field(description="a string, or chat turns {role, content}")
    message_id: StrictStr | None = Field(None, description="your id: enqueueing it again is a no-op (409)")
    timestamp: datetime | None = Field(None, description="when it was said, ISO 8601 with a zone")
    metadata: dict[StrictStr, MetaValue] | None = None


class EnqueueManyRequest(_Body):
    items: list[EnqueueRequest]


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
    useful_ids: list[StrictStr]


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


async def principal(
    request: Request,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    return (await gateway(request)).ring.from_headers(authorization, x_api_key)


Gw = Annotated[Gateway, Depends(gateway)]
Who = Annotated[Principal, Depends(principal)]
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "content": {"application/problem+json": {}}} for code in (400, 401, 403, 413, 503)
}

router = APIRouter(prefix="/v1", responses=_ERRORS)


# ------------------------------------------------------------------------------------------ write side
@router.post(
    "/messages",
    status_code=202,
    response_model=Receipt,
    responses={409: {"model": Problem}, 429: {"model": Problem}},
    summary="Enqueue one message (returns at once; extraction runs in the workers)",
)
def enqueue(body: EnqueueRequest, gw: Gw, who: Who) -> Receipt:
    receipt = gw.enqueue(
        who, body.user_id, body.messages, message_id=body.message_id, timestamp=body.timestamp, metadata=body.metadata
    )
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
def enqueue_many(body: EnqueueManyRequest, gw: Gw, who: Who) -> ReceiptList:
    items = [item.model_dump(exclude_none=True) for item in body.items]
    return ReceiptList(receipts=gw.enqueue_many(who, items))


@router.get("/users/{user_id}/messages/{message_id}", response_model=MessageStatus, responses={404: {"model": Problem}})
def message_status(user_id: str, message_id: str, gw: Gw, who: Who) -> dict[str, str]:
    return gw.status(who, user_id, message_id)


@router.post("/users/{user_id}/feedback", response_model=FeedbackResponse)
def feedback(user_id: str, body: FeedbackRequest, gw: Gw, who: Who) -> FeedbackResponse:
    reader, uid = gw.reader_for(who, user_id, "write")
    return FeedbackResponse(rows=reader.feedback(uid, body.recall_id, body.useful_ids))


@router.delete("/users/{user_id}/memories/{memory_id}", response_model=ForgetResult)
def forget(user_id: str, memory_id: str, gw: Gw, who: Who) -> ForgetResult:
    reader, uid = gw.reader_for(who, user_id, "write")
    return reader.forget(uid, memory_id)  # type: ignore[no-any-return]


@router.delete("/users/{user_id}", response_model=ForgetResult, summary="Forget everything of one user")
def forget_user(user_id: str, gw: Gw, who: Who) -> ForgetResult:
    reader, uid = gw.reader_for(who, user_id, "write")
    return reader.forget_user(uid)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------- read side
@router.post("/users/{user_id}/recall", response_model=RecallResult)
def recall(user_id: str, body: RecallRequest, gw: Gw, who: Who) -> RecallResult:
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
def search(user_id: str, body: SearchRequest, gw: Gw, who: Who) -> SearchResult:
    reader, uid = gw.reader_for(who, user_id)
    return reader.search(uid, body.query, body.k, body.detail_level)  # type: ignore[no-any-return]


@router.post("/users/{user_id}/context", response_model=ContextResponse)
def context(user_id: str, body: ContextRequest, gw: Gw, who: Who) -> ContextResponse:
    reader, uid = gw.reader_for(who, user_id)
    return ContextResponse(user_id=uid, context=reader.get_context(uid, body.query, body.max_tokens))


@router.get("/users/{user_id}/history", response_model=list[FactRecord])
def history(
    user_id: str,
    gw: Gw,
    who: Who,
    subject: Annotated[str, Query()],
    predicate: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query()] = HISTORY_LIMIT,
) -> list[FactRecord]:
    reader, uid = gw.reader_for(who, user_id)
    return reader.history(uid, subject, predicate, limit)  # type: ignore[no-any-return]


@router.get("/users/{user_id}/graph", response_model=GraphPage)
def graph(
    user_id: str, gw: Gw, who: Who, page: Annotated[int, Query()] = 1, page_size: Annotated[int, Query()] = 50
) -> GraphPage:
    reader, uid = gw.reader_for(who, user_id)
    return reader.get_graph(uid, page, page_size)  # type: ignore[no-any-return]


@router.get("/users/{user_id}/stats", response_model=UserStats)
def stats(user_id: str, gw: Gw, who: Who) -> UserStats:
    reader, uid = gw.reader_for(who, user_id)
    return reader.stats(uid)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------- operators
@router.get("/dead-letters", response_model=list[DeadLetter], summary="Dead letters of the key's namespace")
def dead_letters(gw: Gw, who: Who, user_id: Annotated[str | None, Query()] = None) -> list[DeadLetter]:
    return gw.dead_letters(who, user_id)


@router.post("/dead-letters/{user_id}/{message_id}/replay", status_code=202, response_model=Receipt)
def replay(user_id: str, message_id: str, gw: Gw, who: Who) -> Receipt:
    return gw.replay(who, user_id, message_id)


@router.delete("/dead-letters/{user_id}/{message_id}", response_model=Dropped, responses={404: {"model": Problem}})
def drop(user_id: str, message_id: str, gw: Gw, who: Who) -> Dropped:
    return Dropped(dropped=gw.drop(who, user_id, message_id))


@router.get("/metrics", response_class=Response, summary="Prometheus metrics of this gateway (operator)")
def metrics(request: Request, who: Who) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    who.require("operator")
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/health", response_model=Health, responses={503: {"model": Health}}, summary="Every check (no key)")
def health(gw: Gw) -> JSONResponse:
    return _health_response(gw.client.health())


@router.get("/livez", response_model=Health, summary="Liveness: the process answers (no key, no dependency)")
async def livez() -> Health:
    # Async and dependency-free: answers even while the thread pool is busy or Neo4j is down.
    return Health(ok=True, checks={})


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}}, summary="Readiness (no key)")
def readyz(gw: Gw) -> JSONResponse:
    """Redis and the graph store answer: 503 takes this replica out of the Service, without a restart."""
    from engram_api.health import check_ready

    return _health_response(check_ready(gw.client))


def _health_response(report: HealthReport) -> JSONResponse:
    body = Health(ok=report.ok, checks={name: check.ok for name, check in report.checks.items()})
    return JSONResponse(body.model_dump(), status_code=200 if report.ok else 503)
