"""Index reconciliation: make every user's FAISS file agree with the graph store again.

The graph is the source of truth and the index is derived from it. Writers keep the two in step
(``IndexKeeper.advance``), but a crash between the graph commit and the file write, a lost or damaged
disk file, or a bug can leave them apart; readers only catch an index that is behind. This job compares
each user's file with ``graph.vectors()`` and rebuilds what disagrees.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from engram_api.storage.base import GraphStore
from engram_api.storage.indexes import IndexKeeper
from engram_workers.maintenance._common import Guard, UserFailure, isolate, target_users

__all__ = ["ReconcileReport", "ReconcileUser", "reconcile"]

Problem = Literal["missing", "unreadable", "behind", "ahead", "ids differ"]


class ReconcileUser(BaseModel):
    """A user whose index was wrong, what was wrong, and that it was rebuilt."""

    user_id: str
    problem: Problem
    detail: str
    graph_version: int
    index_version: int | None = None
    missing_ids: int = Field(0, description="graph vectors the index lacked")
    extra_ids: int = Field(0, description="index rows the graph no longer has")
    rebuilt_rows: int = 0


class ReconcileReport(BaseModel):
    users: int = 0
    ok: int = 0
    rebuilt: int = 0
    fixed: list[ReconcileUser] = Field(default_factory=list)
    failed: list[UserFailure] = Field(default_factory=list)


def reconcile(
    *,
    graph: GraphStore,
    keeper: IndexKeeper,
    guard: Guard,
    user_ids: list[str] | None = None,
) -> ReconcileReport:
    """Rebuild every index that is missing, unreadable, at another version or holds other node ids."""
    report = ReconcileReport()
    for user_id in target_users(graph, user_ids):
        with isolate("reconcile", user_id, report.failed), guard(user_id):
            # Under the guard no apply moves the graph or the file between the comparison and the fix.
            fault = _diagnose(graph, keeper, user_id)
            report.users += 1
            if fault is None:
                report.ok += 1
                continue
            fault.rebuilt_rows = len(keeper.rebuild(user_id))
            report.rebuilt += 1
            report.fixed.append(fault)
    return report


def _diagnose(graph: GraphStore, keeper: IndexKeeper, user_id: str) -> ReconcileUser | None:
    items, version = graph.vectors(user_id)

    def fault(
        problem: Problem, detail: str, index_version: int | None = None, missing: int = 0, extra: int = 0
    ) -> ReconcileUser:
        return ReconcileUser(
            user_id=user_id,
            problem=problem,
            detail=detail,
            graph_version=version,
            index_version=index_version,
            missing_ids=missing,
            extra_ids=extra,
        )

    if not keeper.vectors.path_for(user_id).exists():
        return fault("missing", "no index file")
    index = keeper.vectors.load(user_id)
    if index is None:
        return fault("unreadable", "index file cannot be read (damaged, truncated or another dimension)")
    if index.version < version:
        return fault("behind", f"index at v{index.version}, graph at v{version}", index_version=index.version)
    if index.version > version:
        # The graph went back (e.g. a restore): the index holds a future it cannot be trusted with.
        return fault("ahead", f"index at v{index.version}, graph at v{version}", index_version=index.version)
    expected = {item.node_id for item in items}
    actual = index.node_ids()
    if expected != actual:
        missing, extra = len(expected - actual), len(actual - expected)
        return fault(
            "ids differ",
            f"{missing} graph vectors missing from the index, {extra} index rows not in the graph",
            index_version=index.version,
            missing=missing,
            extra=extra,
        )
    return None
