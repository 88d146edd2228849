"""FAISS as a cache of the graph: a process's copy of a user's index is caught up from the graph by version.

The graph store is the only source of vectors. Every process (an apply worker, a reader, a maintenance
run, on any host) keeps its own copy of a user's index: in memory (``IndexKeeper``'s cache) and, as an
optional warm start, in its own data directory (``VectorStore``). No process ever needs another's files.
A copy at stamp ``(epoch, v)`` that is behind the graph reads from the graph only what changed since ``v``
(``GraphStore.vector_changes``) and applies it as one delta; a full read of the user's vectors (a rebuild)
happens only when that is impossible: no copy at all, another lifetime of the user, or a copy older than
the user's catch-up horizon.

How the graph records what changed, in both backends (``neo4j_vectors``, ``sqlite_vectors``):
- every write marks the facts, entities and chunks it creates or changes with the version it commits
  (``changed``); an embedding never changes after its record is created, so the records with an
  embedding marked after ``v`` are exactly the vectors to upsert (a re-upsert of an unchanged vector is
  harmless);
- every write that deletes records adds one removal record ``(user, version, node ids)`` in the same
  transaction; records older than ``REMOVAL_RETAIN`` versions are pruned by the next removal, which moves
  the user's ``vectors_from`` (the horizon) up to the oldest version still complete;
- ``vectors_from`` is set by the first write of this release to a user (the version before it), so a
  user written by an older release (unmarked entities, unlogged removals) is rebuilt once, never caught up
  from a history that was not recorded; ``forget_user`` deletes the removal records with the user.

Invariants:
- ``VectorChanges`` reads the stamp first, then the removals, then the records, then the stamp again, all
  in one read transaction: a record or removal may be newer than the stamp, never older, so a copy
  labelled with the stamp holds at least that state; anything newer is applied again, idempotently, by the
  next catch-up (removals first, then upserts, which reflect the records as they are now). A lifetime that
  changes between the two stamp reads makes the changes unusable (``usable_from`` says no).
- A caught-up copy is at the graph's stamp (or newer records), never at a stamp it does not hold:
  ``usable_from`` refuses another epoch, a graph behind the copy (a restore) and a copy below the horizon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engram_api.versions import Stamp

if TYPE_CHECKING:  # the stores import this module: no numpy (userindex's) for a process that reads no vectors
    from engram_api.models import ChunkRecord, FactRecord
    from engram_api.storage.faiss.index import Kind

__all__ = ["REMOVAL_RETAIN", "UserChanges", "VectorChanges"]

# Versions of removal history each user keeps: a copy more than this many writes behind is rebuilt (a
# catch-up over that many writes would read about as much as a rebuild anyway).
REMOVAL_RETAIN = 1000


@dataclass(frozen=True, slots=True)
class VectorChanges:
    """What ``GraphStore.vector_changes(user_id, since)`` read: the user's stamp (read first, and again
    last: ``settled`` is False when the lifetime changed in between), the catch-up horizon (None: a user
    no write of this release has touched, or absent), the ids removed by writes after ``since`` and the
    embedded records marked after ``since`` as (node id, kind, vector), with the token states of those
    that carry them (``states``, by node id: chunks embedded since late interaction)."""

    stamp: Stamp
    horizon: int | None
    removed: tuple[str, ...] = ()
    upserts: Sequence[tuple[str, Kind, Sequence[float]]] = field(default_factory=tuple)
    settled: bool = True
    states: Mapping[str, bytes] = field(default_factory=dict)  # upserted records' packed token states, by id

    def usable_from(self, copy: Stamp) -> bool:
        """True when these changes bring a copy at ``copy`` to ``stamp`` (see the module docstring)."""
        return (
            self.settled
            and self.horizon is not None
            and self.stamp.epoch == copy.epoch
            and self.stamp >= copy
            and copy.version >= self.horizon
        )

    @property
    def vector_bytes(self) -> int:
        """The float32 bytes of the upserted vectors (what a catch-up moved into the index)."""
        return sum(4 * len(vector) for _, _, vector in self.upserts)


@dataclass(frozen=True, slots=True)
class UserChanges:
    """What ``GraphStore.user_changes(user_id, since)`` read in ONE round trip for a reader holding both a
    FAISS copy and a snapshot of the user (``engram_api.reader.catchup``): ``vectors`` as ``vector_changes``
    reads them, and, read after the same first stamp read, the version of the user's last removal of a fact
    or chunk (``removed``, 0: none in this lifetime) and the facts and chunks marked after ``since``.

    No count of the user's records is read (on Neo4j a count walks the user's index entries: the larger part
    of a refresh of a 100K-fact user): the records are complete since ``since`` exactly when the vectors
    are (``vectors.usable_from``: every write after the horizon marks what it writes), which
    ``UserSnapshot.refreshed`` checks instead."""

    vectors: VectorChanges
    removed: int
    facts: Sequence[FactRecord] = ()
    chunks: Sequence[ChunkRecord] = ()
