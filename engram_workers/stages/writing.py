"""The apply stage's write: extracted messages of one user into its memory, as one batch under one ``UserWrite``.

Every write of extracted messages goes through ``write_members``: the apply stage's (``stages.batch``: the
task's message alone, or with its user's other ready messages) and that of tests and tools that write memory
in-process. A single message is a batch of one. What a batch shares is the per-message fixed cost: ONE
encoder call for every text of every member (with the vectors extract handed over), ONE ``write.finish`` at
the end (one FAISS delta record, one published stamp, one cache drop). What it does not share is anything
a message's correctness rests on.

With ``share`` (the stage: its batches may hold more than one message), where the store can
(``GraphStore.batched`` yields True: Neo4j), every member's write is also in ONE graph transaction,
committed once after the last member (the per-commit work is most of a write's server CPU).
If anything in that transaction fails (a member's plan or write, or the commit), all of it rolls back and
the batch is replayed one transaction per member, so a failure there has exactly the effects it has
without sharing. Otherwise (SQLite, whose write lock is the whole file's) each member commits on its own.

Invariants:
- Each member is idempotent by message id, with its own provenance and ``after_write`` hooks (run once its
  write is committed). Member i+1 is planned against the graph as member i left it (in a shared
  transaction, reads see its uncommitted writes) and an in-memory copy of the index holding i's upserts
  (dedup, entity resolution, supersession see it); nothing reaches the index file before ``finish``, which
  writes the upserts of exactly the members whose write committed.
- What planning takes from a member (its chunks, named entities, texts) is computed once (``Incoming``)
  however often it is planned in the batch (a replay after a rollback).
- A member that raises is skipped and the others go on; what committed is finished. The trigger's error
  (the message whose task runs the batch) is handed back in ``Written`` for the caller to raise after its
  bookkeeping; another member's is logged (its own task applies it). A store outage stops the batch (the
  rest would fail too); ``StaleWriteError`` (another writer moved the user) is raised at once, nothing of
  the batch finished, for ``UserWrites.run`` to plan it again under a fresh lease.
- ``enter`` wraps each member other than the trigger (the stage counts its delivery and calls its
  ``before_stage`` there); a member it refuses is not planned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from engram_api.errors import StaleWriteError, StoreUnavailableError
from engram_api.models import ApplyOutcome, Envelope, StageOutcome, StageResult
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.files import Kind, UserIndex
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.episodes import EmbedContext
from engram_api.storage.writer.userwrite import UserWrite
from engram_api.versions import Stamp
from engram_workers.consolidation.plan import Incoming, Planned, plan_message
from engram_workers.consolidation.resolution import Vectors
from engram_workers.middleware import Hooks
from engram_workers.stages.handover import CarriedVectors, HandOver

__all__ = ["Done", "Member", "Written", "write_members"]

log = logging.getLogger("engram.pipeline")


@dataclass(frozen=True)
class Member:
    """One message of a batch: what planning takes from it, and the vectors extract handed over with it."""

    message: Incoming
    carried: CarriedVectors | None = None

    @classmethod
    def handed(cls, envelope: Envelope, handed: HandOver, embed_context: EmbedContext = "other_turn") -> Member:
        """The member for a stored message and the extraction extract handed over for it; ``embed_context``:
        what a chunk's vector carries beside its words (``Settings.chunk_embed_context``)."""
        return cls(Incoming.of(envelope, handed.extraction, handed.usage, embed_context), handed.vectors)

    @property
    def message_id(self) -> str:
        return self.message.envelope.message_id


@dataclass(frozen=True)
class Done:
    """A member whose write committed (``outcome.applied``) or was found committed, and its seconds."""

    outcome: ApplyOutcome
    planned: Planned
    seconds: float

    @property
    def result(self) -> StageResult:
        plan, outcome = self.planned.plan, self.outcome
        detail = (
            f"v{outcome.version}, +{len(plan.new_entities)} entities, +{len(plan.new_facts)} facts, "
            f"{len(plan.fact_changes)} superseded, {len(plan.reinforced_fact_ids)} reinforced"
        )
        return StageResult(StageOutcome.APPLIED if outcome.applied else StageOutcome.ALREADY, detail)


@dataclass
class Written:
    """What ``write_members`` did: the members done, in batch order, with the index upserts of those that
    applied; the stamp ``finish`` left (None when nothing was finished); the trigger's error."""

    done: dict[str, Done] = field(default_factory=dict)
    upserts: list[tuple[str, Kind, Sequence[float]]] = field(default_factory=list)
    states: dict[str, bytes] = field(default_factory=dict)  # the upserted chunks' packed token states
    stamp: Stamp | None = None
    trigger_error: Exception | None = None
    stopped: bool = False  # a store outage: nothing more is planned


Enter = Callable[[Member], AbstractContextManager[bool]]


def _admitted(member: Member) -> AbstractContextManager[bool]:
    return nullcontext(True)


@dataclass
class _Run:
    """One pass over a batch: the encoded texts and the batch's own copy of the index. ``shared``: the
    members' writes are in one store transaction; then any member's error is raised (the transaction must
    roll back) and ``after_write`` waits for ``commit``."""

    graph: GraphStore
    hooks: Hooks
    write: UserWrite
    vectors: Vectors
    index: UserIndex
    shared: bool
    enter: Enter
    written: Written = field(default_factory=Written)
    copied: bool = False
    uncommitted: list[tuple[str, ApplyOutcome, Planned, float]] = field(default_factory=list)

    def all(self, members: Sequence[Member], trigger: Member) -> None:
        for i, member in enumerate(members):
            if self.written.stopped:
                break
            last = i == len(members) - 1
            if member is trigger:
                self.apply(member, is_trigger=True, last=last)
                continue
            with self.enter(member) as admitted:
                if admitted:
                    self.apply(member, is_trigger=False, last=last)

    def apply(self, member: Member, *, is_trigger: bool, last: bool) -> None:
        """Plan ``member`` against the graph and index as they are now and write it."""
        mid, started = member.message_id, time.perf_counter()
        try:
            planned = plan_message(member.message, graph=self.graph, index=self.index, vectors=self.vectors)
            self.write.feed_with_next_write(last)  # the last write's statement reads what the batch changed
            outcome = self.graph.apply(planned.plan)
        except StaleWriteError:
            raise  # another writer moved the user: the whole batch is planned again from fresh reads
        except Exception as exc:
            if self.shared:
                raise
            self._failed(mid, exc, is_trigger)
            self.written.stopped = isinstance(exc, StoreUnavailableError)
            return
        if outcome.applied:
            self.written.upserts.extend(planned.upserts)
            self.written.states.update(planned.states)
            if not last:
                # The next member must see this one's vectors. The keeper's cached index is shared with
                # readers and never mutated: the batch changes its own copy (the base is shared, the overlay
                # cloned once).
                if not self.copied:
                    self.index, self.copied = self.index.copy(), True
                self.index.upsert(planned.upserts, planned.states)
        if self.shared:
            self.uncommitted.append((mid, outcome, planned, started))
        else:
            self._committed(mid, outcome, planned, started, is_trigger)

    def commit(self, trigger: str) -> None:
        """The shared transaction committed: each member's ``after_write`` and result, in order."""
        for mid, outcome, planned, started in self.uncommitted:
            self._committed(mid, outcome, planned, started, mid == trigger)
        self.uncommitted.clear()

    def _committed(self, mid: str, outcome: ApplyOutcome, planned: Planned, started: float, is_trigger: bool) -> None:
        failed = self.hooks.try_emit("after_write", self.write.user_id, mid, outcome)
        if failed is not None:  # committed; its status is left to a retry (the trigger's, or its own task)
            self._failed(mid, failed, is_trigger)
            return
        self.written.done[mid] = Done(outcome, planned, time.perf_counter() - started)

    def _failed(self, mid: str, exc: Exception, is_trigger: bool) -> None:
        if is_trigger:
            self.written.trigger_error = exc
        else:
            log.warning("apply batch: %s left to its own task (%s)", mid, type(exc).__name__)


def write_members(
    write: UserWrite,
    members: Sequence[Member],
    *,
    trigger: Member,
    graph: GraphStore,
    embedder: Embedder,
    hooks: Hooks,
    share: bool = False,
    enter: Enter = _admitted,
) -> Written:
    """Plan and write ``members`` (in this order; ``trigger`` among them) inside ``write``, then one
    ``write.finish`` for what committed (see the module docstring). ``share``: in one store transaction where
    the store can; without it each write commits on its own, as a message applied alone always did (one
    transaction would also hold a cold server's first query plans to a single timeout)."""
    vectors = Vectors(
        embedder,
        write.user_id,
        [t for m in members for t in m.message.texts],
        [m.carried for m in members],
        {t: end for m in members for t, end in m.message.ends.items()},
    )

    def fresh(shared: bool) -> _Run:
        return _Run(
            graph=graph, hooks=hooks, write=write, vectors=vectors, index=write.index(), shared=shared, enter=enter
        )

    shared = False
    try:
        with graph.batched() if share else nullcontext(False) as shared:
            run = fresh(shared)
            run.all(members, trigger)
    except (StaleWriteError, StoreUnavailableError):
        raise  # re-planned under a fresh lease / the trigger's retry path: nothing of the batch committed
    except Exception as exc:
        if not shared:
            raise
        log.info("apply batch of %d rolled back (%s): one transaction per member", len(members), type(exc).__name__)
        run = fresh(False)
        run.all(members, trigger)
    run.commit(trigger.message_id)
    written = run.written
    if written.done or written.upserts:
        written.stamp = write.finish(upserts=written.upserts, states=written.states)
    return written
