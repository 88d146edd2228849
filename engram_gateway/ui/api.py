"""The JSON the memory explorer needs that the rest of ``/v1`` lacks: who the key is, which users it may
open, and a small neighbourhood of one entity.

Invariants:
- The same guard as every ``/v1`` route (``GuardedRoute``, ``who: Reader``): a key and its ``read`` scope
  are checked before anything runs, and every user id passes ``Principal.user`` (syntax, then namespace),
  so another namespace's user is refused (403) whether or not it exists.
- Every answer is bounded: a user list stops at ``limit`` (at most ``USERS_MAX``), a neighbourhood at
  ``limit`` facts (at most ``NEIGHBOURHOOD_MAX``) within ``hops`` (at most ``HOPS_MAX``) of its entity.
- The neighbourhood is recall's own graph step (``RecallStore.graph_step``, one round trip on either
  store): the facts valid at ``as_of`` (current ones when absent), never archived ones, nearest first. Paths
  never cross the user's own node (every fact of the user touches it), unless it is the entity asked for.
- Read-only: nothing here writes, so a read key may call all of it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from engram_api.errors import NotFoundError
from engram_api.models import FactRecord
from engram_api.naming import self_entity_id
from engram_api.settings import Scope
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.step import GraphStepQuery
from engram_gateway.guard import GuardedRoute, Reader
from engram_gateway.problems import Problem
from engram_gateway.routes import Gw

__all__ = ["HOPS_MAX", "NEIGHBOURHOOD_MAX", "USERS_MAX", "KeyInfo", "Neighbourhood", "UserList", "router"]

USERS_MAX = 1000
NEIGHBOURHOOD_MAX = 200
HOPS_MAX = 3


class KeyInfo(BaseModel):
    """The key a request was made with: what it may do and which user ids it may name."""

    name: str = Field(description="the key's name ('local' when no key is configured)")
    scopes: list[Scope] = Field(description="sorted: read, write (enqueue, feedback, forget), operator")
    namespace: str = Field(description="user ids of this key start with '<namespace>.'; '*' is every user")
    local_mode: bool = Field(description="no key is configured: every caller is 'local'")


class UserList(BaseModel):
    users: list[str] = Field(description="user ids of the key's namespace the graph store holds, sorted")
    truncated: bool = Field(description="more users match than `limit`")


class NeighbourEntity(BaseModel):
    id: str
    name: str
    label: str = Field(description="the entity's type (Person, Place, ...)")
    hops: int = Field(description="graph steps from the entity asked for (0 = itself)")


class NeighbourFact(BaseModel):
    fact: FactRecord
    hops: int = Field(description="0 = a fact on the entity asked for, 1 = on an entity those facts reach, ...")


class Neighbourhood(BaseModel):
    user_id: str
    entity_id: str
    as_of: datetime | None = Field(None, description="the instant the facts hold at (None = now)")
    entities: list[NeighbourEntity] = Field(description="the entity asked for first, then the others the facts name")
    facts: list[NeighbourFact] = Field(description="nearest first")
    truncated: bool = Field(description="`limit` facts were found: there may be more within `hops`")


_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": Problem} for code in (400, 401, 403, 429, 503)}
router = APIRouter(prefix="/v1", responses=_ERRORS, route_class=GuardedRoute, tags=["explorer"])


@router.get("/whoami", response_model=KeyInfo, summary="The calling key: its name, scopes and namespace")
def whoami(gw: Gw, who: Reader) -> KeyInfo:
    return KeyInfo(name=who.name, scopes=sorted(who.scopes), namespace=who.namespace, local_mode=gw.ring.local_mode)


@router.get("/users", response_model=UserList, summary="User ids of the key's namespace that the graph store holds")
def users(
    gw: Gw,
    who: Reader,
    prefix: Annotated[str, Query(max_length=200, description="only ids that start with this")] = "",
    limit: Annotated[int, Query(ge=1, le=USERS_MAX)] = 100,
) -> UserList:
    # The store lists every user; the namespace filter runs here, before anything leaves the process.
    found = (u for u in gw.client.reader.graph.list_users() if who.owns(u) and u.startswith(prefix))
    picked: list[str] = []
    for uid in found:
        if len(picked) == limit:
            return UserList(users=sorted(picked), truncated=True)
        picked.append(uid)
    return UserList(users=sorted(picked), truncated=False)


@router.get(
    "/users/{user_id}/neighbourhood",
    response_model=Neighbourhood,
    responses={404: {"model": Problem}},
    summary="The facts within a few graph steps of one entity (a small, bounded part of the user's graph)",
)
def neighbourhood(
    user_id: str,
    gw: Gw,
    who: Reader,
    entity_id: Annotated[str | None, Query(max_length=128, description="default: the user's own node")] = None,
    hops: Annotated[int, Query(ge=0, le=HOPS_MAX)] = 1,
    limit: Annotated[int, Query(ge=1, le=NEIGHBOURHOOD_MAX)] = 40,
    as_of: Annotated[datetime | None, Query(description="ISO 8601 with a zone; default now")] = None,
) -> Neighbourhood:
    reader, uid = gw.reader_for(who, user_id)
    graph = reader.graph
    hub = self_entity_id(uid)
    centre = entity_id or hub
    if not graph.get_entities(uid, [centre]):
        raise NotFoundError(f"{uid!r} has no entity {centre[:80]!r}")
    query = GraphStepQuery.model_validate(
        {"seeds": [centre], "max_hops": hops, "limit": limit, "per_seed": limit, "as_of": as_of,
         "avoid": [] if centre == hub else [hub]}
    )  # fmt: skip
    step = graph.graph_step(uid, query)
    by_id = {f.id: f for f in step.facts}
    facts = [NeighbourFact(fact=by_id[fid], hops=h) for fid, h in step.hops if fid in by_id]
    return Neighbourhood(
        user_id=uid,
        entity_id=centre,
        as_of=as_of,
        entities=_entities(graph, uid, centre, facts),
        facts=facts,
        truncated=len(facts) >= limit,
    )


def _entities(graph: GraphStore, uid: str, centre: str, facts: list[NeighbourFact]) -> list[NeighbourEntity]:
    """The entities the facts name, each at the fewest hops a fact naming it has (a fact at hop h names
    entities h or h + 1 steps away; the nearer bound is the one drawn)."""
    hops: dict[str, int] = {centre: 0}
    for item in facts:
        for eid in (item.fact.subject_id, item.fact.object_id):
            if eid is not None and eid not in hops:
                hops[eid] = item.hops + 1
    records = {e.id: e for e in graph.get_entities(uid, list(hops))}
    return [
        NeighbourEntity(id=eid, name=records[eid].name, label=records[eid].label, hops=h)
        for eid, h in sorted(hops.items(), key=lambda kv: (kv[1], kv[0] != centre))
        if eid in records
    ]
