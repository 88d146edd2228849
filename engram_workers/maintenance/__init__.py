"""Maintenance jobs Celery Beat runs: decay and archival, cluster rebuild, weight learning, index
reconciliation, chunk re-embedding. Each is a plain function over the stores it is handed, works per user
under the caller's per-user guard, and returns a pydantic report (printed by the CLI, returned by Celery).
Beat runs decay, hierarchy, reconcile and reembed through ``fanout``: a driver sends per-user tasks of the
users with work (docs/operations.md "Maintenance")."""

from engram_workers.maintenance._common import Guard, UserFailure
from engram_workers.maintenance.decay import DecayReport, DecayUser, decay_users, run_decay
from engram_workers.maintenance.hierarchy import HierarchyReport, HierarchyUser, rebuild_hierarchy
from engram_workers.maintenance.reconcile import (
    BackfillUser,
    ReconcileReport,
    ReconcileUser,
    reconcile,
    reindex_user,
    remove_orphans,
)
from engram_workers.maintenance.redeliver import RedeliverReport, redeliver_stuck, resend_lost
from engram_workers.maintenance.reembed import ReembedReport, ReembedUser, reembed_users, run_reembed
from engram_workers.maintenance.weights import (
    ScopeOutcome,
    Weights,
    WeightsReport,
    effective_weights,
    learn_weights,
)

__all__ = [
    "BackfillUser",
    "DecayReport",
    "DecayUser",
    "Guard",
    "HierarchyReport",
    "HierarchyUser",
    "ReconcileReport",
    "ReconcileUser",
    "RedeliverReport",
    "ReembedReport",
    "ReembedUser",
    "ScopeOutcome",
    "UserFailure",
    "Weights",
    "WeightsReport",
    "decay_users",
    "effective_weights",
    "learn_weights",
    "rebuild_hierarchy",
    "reconcile",
    "redeliver_stuck",
    "reembed_users",
    "reindex_user",
    "remove_orphans",
    "resend_lost",
    "run_decay",
    "run_reembed",
]
