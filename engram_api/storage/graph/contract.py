"""The graph-store contract: ``GraphStore``, the union of its three roles. Neo4j and the embedded SQLite
store both implement it and both pass ``tests/contract/``. Storage logic lives behind this interface
only: models stay plain data, the pipeline and the reader never write a query.

The roles, each a module of its own with its invariants:
- ``ingest.IngestStore``: the extract and apply stages' reads and ``apply``;
- ``recall.RecallStore``: the reader's reads (graph step, snapshot, keyword search, history, pages,
  stats, vectors for the FAISS indexes) and its feedback writes;
- ``upkeep.UpkeepStore``: maintenance, erasure (``forget_*``) and whole-user reads (backup, reconcile);
and ``base.StoreBase`` under all three: lifecycle, the per-instance write fence, ``batched``, and the
input policy of every method declared ``guarded`` (a negative size, another user's record raise
``InvalidInputError`` naming the field; ids reach the backend once each; an empty request is answered
without a query). Policy above the backends lives in the roles once: the decay formula, forget planning
(``forgetting``), "valid at" and "current" (``validity``), the shaping of raw rows into records, links,
``UserStats`` and ``ForgetResult``. Backends implement the abstract methods (the guarded ones under their
public names, the rest as ``_``-prefixed hooks): queries and transactions only.

Rules every backend keeps:
- every read and write is scoped by ``user_id``; nothing ever crosses users;
- ``apply`` runs one transaction and is idempotent by (user_id, episode id);
- the per-user ``version`` grows by one with every applied plan, forget and maintenance write that
  changes what recall can return, so readers and FAISS indexes can tell they are stale;
- every write transaction inside ``fenced`` checks the fence first and moves it after commit; inside
  ``batched()`` a backend may run the thread's calls in ONE transaction (``base`` says how).
"""

from __future__ import annotations

from engram_api.storage.graph.base import Fence, Link
from engram_api.storage.graph.ingest import ContextReads, ExtractionContext, IngestStore
from engram_api.storage.graph.recall import GraphStep, GraphStepQuery, RecallStore, SnapshotBuild, SnapshotChanges
from engram_api.storage.graph.upkeep import UpkeepStore

__all__ = [
    "ContextReads",
    "ExtractionContext",
    "Fence",
    "GraphStep",
    "GraphStepQuery",
    "GraphStore",
    "IngestStore",
    "Link",
    "RecallStore",
    "SnapshotBuild",
    "SnapshotChanges",
    "UpkeepStore",
]


class GraphStore(IngestStore, RecallStore, UpkeepStore):
    """One graph backend: every role. Callers that need one role may type against it instead."""
