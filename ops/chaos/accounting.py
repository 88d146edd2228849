"""Counting what a chaos scenario did (sent / applied / dead-lettered / lost / duplicated), and the table.

Counting rules (README.md, "How the table counts"):

- sent: messages the producer got a receipt for;
- applied / dead-lettered: the status hash of each message (``engram_api.keys.status``), cross-checked
  with the dead-letter store;
- lost: sent - applied - dead-lettered once everything settled (``settle``, a generous timeout); while
  it waits, ``settle`` runs the redelivery sweep as production's Beat would, and returns what it re-sent
  (``Tally.resent``): the scenario must account for each (``Scenario.strandable``), so a message the
  fleet lost and only this sweep brought home is never counted as delivered without a word;
- duplicated: duplicate entities (user + norm_name), facts (user + statement + valid_from), episodes,
  provenance links (repeated ``source_ids``, parallel ``FROM`` relationships) and vectors (FAISS rows
  beyond the graph's unique embeddings, or rows for nodes the graph does not have), read by ``audit``
  over a separate Neo4j driver and the index files, not through the store code under test.

A ``ScenarioResult`` is ``ok`` only when nothing was lost or duplicated and every check passed.
"""

from __future__ import annotations

import contextlib
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet import Poller
from pydantic import BaseModel, Field
from workload import all_facts

from engram_api import MemoryClient
from engram_api.errors import WaitTimeoutError
from engram_api.models import MessageState, Receipt


@dataclass
class Tally:
    sent: int
    applied: set[str]
    dead: set[str]
    pending: set[str]
    notes: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)  # user_id:message_id the harness's own sweep re-sent

    @property
    def lost(self) -> int:
        return self.sent - len(self.applied) - len(self.dead)


_SWEEP_EVERY_S = 15.0


def _redeliver(client: MemoryClient) -> list[str]:
    from engram_workers.maintenance import resend_lost

    report = resend_lost(client.settings, client.redis_url, older_than_s=client.settings.visibility_timeout_s)
    return report.resent


def settle(client: MemoryClient, receipts: Sequence[Receipt], *, timeout: float) -> Tally:
    """Wait (up to ``timeout``) for every message to be applied or dead-lettered, then count."""
    notes: list[str] = []
    pairs = sorted({(r.user_id, r.message_id) for r in receipts})
    deadline = time.monotonic() + timeout
    resent: list[str] = []
    while True:
        try:
            client.wait(pairs, timeout=max(0.1, min(_SWEEP_EVERY_S, deadline - time.monotonic())))
            break
        except WaitTimeoutError:
            if time.monotonic() >= deadline:
                break
            # What production's Beat does every ENGRAM_REDELIVER_INTERVAL_S: re-send the stage task of
            # messages stuck between stages (kombu can lose one taken by a worker SIGKILLed mid-fetch).
            resent += _redeliver(client)
    verdict = client.producer.verdict(pairs)
    tally = Tally(
        sent=len(pairs),
        applied=set(verdict.applied),
        dead=set(verdict.dead_lettered),
        pending=set(verdict.pending),
        notes=notes,
        resent=resent,
    )
    letters = {(d.user_id, d.message_id) for d in client.dead_letters()} & set(pairs)
    in_dlq = {mid for _, mid in letters}
    if in_dlq != tally.dead:
        tally.notes.append(
            f"DLQ and status disagree: {len(tally.dead - in_dlq)} dead without a letter, "
            f"{len(in_dlq - tally.dead)} letters not dead"
        )
    if tally.pending:
        tally.notes.append(f"still pending after {timeout:.0f}s: {sorted(tally.pending)[:3]}")
    return tally


# What the audit counts, in the report's order (``ScenarioResult.duplicates``).
DUPLICATE_KINDS = ("entities", "facts", "episodes", "source_ids", "from_links", "vectors")


@dataclass
class Duplicates:
    """Surplus copies (beyond the first) per kind; an index behind the graph is not one (``stale_indexes``)."""

    surplus: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    stale_indexes: int = 0

    @property
    def total(self) -> int:
        return sum(self.surplus.values())

    def breakdown(self) -> dict[str, int]:
        return {kind: self.surplus[kind] for kind in DUPLICATE_KINDS}


# Each query returns the surplus (copies beyond the first) of one kind of node or link, for our users only.
_CYPHER_DUPLICATES = {
    "entities": "MATCH (e:Entity) WHERE e.user_id IN $users "
    "WITH e.user_id AS u, e.norm_name AS key, count(*) AS c WHERE c > 1 RETURN u, key, c",
    "facts": "MATCH (f:Fact) WHERE f.user_id IN $users "
    "WITH f.user_id AS u, [f.statement, toString(f.valid_from)] AS key, count(*) AS c WHERE c > 1 RETURN u, key, c",
    "episodes": "MATCH (ep:Episode) WHERE ep.user_id IN $users "
    "WITH ep.user_id AS u, ep.id AS key, count(*) AS c WHERE c > 1 RETURN u, key, c",
    "from_links": "MATCH (x)-[r:FROM]->(ep:Episode) WHERE ep.user_id IN $users "
    "WITH ep.user_id AS u, [x.id, ep.id] AS key, count(r) AS c WHERE c > 1 RETURN u, key, c",
}


def audit(client: MemoryClient, users: Sequence[str]) -> Duplicates:
    """Count duplicates for ``users``: Cypher on a separate driver, the store's API, and the FAISS files."""
    import neo4j

    dup = Duplicates()
    uri = client.settings.neo4j_uri
    if uri is None:
        raise RuntimeError("the chaos audit reads Neo4j directly: set NEO4J_URI")
    with neo4j.GraphDatabase.driver(uri, auth=None) as driver:
        for kind, query in _CYPHER_DUPLICATES.items():
            records, _, _ = driver.execute_query(query, users=list(users), database_=client.settings.neo4j_database)
            dup.surplus[kind] = sum(r["c"] - 1 for r in records)
            dup.samples += [f"{kind}: {r['u']} {r['key']} x{r['c']}" for r in records[:2]]

    # ``read``, not ``load``: an unreadable index (base + delta log) is counted, not skipped as missing.
    files = client.reader.keeper.vectors
    for user in users:
        facts = all_facts(client, user)
        dup.surplus["source_ids"] += sum(len(f.source_ids) - len(set(f.source_ids)) for f in facts)

        items, version = client.graph.vectors(user)
        graph_ids = Counter(item.node_id for item in items)
        path = files.path_for(user)
        if not path.exists():
            continue  # no index yet: the reader builds it from the graph, nothing can be duplicated
        try:
            index = files.read(user)
        except ValueError as exc:  # FAISS rows and id map disagree: rows were added twice
            dup.surplus["vectors"] += 1
            dup.samples.append(f"vectors: {user} unreadable index ({exc})")
            continue
        strangers = index.node_ids() - graph_ids.keys()
        surplus = sum(index.count(k) for k in ("fact", "entity", "episode")) - len(set(graph_ids))
        if index.version >= version:
            dup.surplus["vectors"] += len(strangers) + max(0, surplus)
        else:
            dup.stale_indexes += 1  # behind the graph (crash between commit and save): rebuilt on read
        if strangers:
            dup.samples.append(f"vectors: {user} has {len(strangers)} rows for nodes not in the graph")
    return dup


class AppliedMonitor(Poller):
    """Samples how many of the given messages are applied, to measure when throughput resumes."""

    def __init__(self, client: MemoryClient, pairs: Callable[[], Sequence[tuple[str, str]]], every: float = 0.2):
        super().__init__("applied-monitor", every, join_timeout=10)
        self.client = client
        self.pairs = pairs
        self.samples: list[tuple[float, int]] = []

    def poll(self) -> None:
        with contextlib.suppress(Exception):  # Redis may be down on purpose: just skip the sample
            states = self.client.producer.states(self.pairs())
            self.samples.append((time.monotonic(), sum(s == MessageState.APPLIED for s in states)))

    def resumed_after(self, t: float) -> float | None:
        """Seconds from ``t`` until the applied count first grew past its first sample at or after ``t``.

        The baseline is taken after ``t``, not before: while Redis is down there are no samples, and the
        last one before the outage would make work finished before it look like a recovery.
        """
        after = [(s, n) for s, n in self.samples if s >= t]
        if not after:
            return None
        baseline = after[0][1]
        return next((s - t for s, n in after if n > baseline), None)


# ------------------------------------------------------------------------------------------- results
class ScenarioResult(BaseModel):
    """One scenario's row of the table and its entry in ``bench-results/chaos.json``."""

    scenario: str
    sent: int = Field(default=0, description="messages the producer got a receipt for")
    applied: int = Field(default=0, description="messages whose status says applied")
    dead_lettered: int = Field(default=0, description="messages whose status says dead-lettered")
    lost: int = Field(default=0, description="sent - applied - dead-lettered, once everything settled")
    duplicated: int = Field(default=0, description="surplus copies the audit found, all kinds together")
    duplicates: dict[str, int] = Field(default_factory=dict, description="the surplus per kind")
    checks: dict[str, bool] = Field(default_factory=dict, description="the scenario's own guarantees")
    metrics: dict[str, Any] = Field(default_factory=dict, description="figures shown in the table")
    details: dict[str, Any] = Field(default_factory=dict, description="JSON only: per-kill logs, timelines")
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.lost == 0 and self.duplicated == 0 and all(self.checks.values())

    def count(self, tally: Tally, dup: Duplicates) -> None:
        self.sent, self.applied, self.dead_lettered = tally.sent, len(tally.applied), len(tally.dead)
        self.lost, self.duplicated, self.duplicates = tally.lost, dup.total, dup.breakdown()
        self.notes += tally.notes + dup.samples[:4]
        if dup.stale_indexes:
            self.notes.append(f"{dup.stale_indexes} FAISS index(es) behind the graph (rebuilt on next read)")

    def to_json(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json"), "ok": self.ok}


_COLUMNS = ("scenario", "sent", "applied", "dead-lettered", "lost", "duplicated", "ok", "notes")


def _row(result: ScenarioResult) -> list[str]:
    failed = [name for name, passed in result.checks.items() if not passed]
    notes = [f"FAILED CHECKS: {', '.join(failed)}"] if failed else []
    if result.error:
        notes.append(f"ERROR: {result.error}")
    notes += [f"{k}={v}" for k, v in result.metrics.items()] + result.notes
    return [
        result.scenario, str(result.sent), str(result.applied), str(result.dead_lettered), str(result.lost),
        str(result.duplicated), "yes" if result.ok else "NO", "; ".join(notes),
    ]  # fmt: skip


def format_table(results: Sequence[ScenarioResult], *, notes_width: int = 72) -> str:
    rows = [_row(r) for r in results]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(_COLUMNS[:-1])]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(_COLUMNS, [*widths, 0], strict=True)).rstrip(),
        "-+-".join("-" * w for w in [*widths, notes_width]),
    ]
    for row in rows:
        wrapped = textwrap.wrap(row[-1], notes_width) or [""]
        for i, note in enumerate(wrapped):
            cells = row[:-1] if i == 0 else [""] * len(widths)
            lines.append(" | ".join([*(c.ljust(w) for c, w in zip(cells, widths, strict=True)), note]).rstrip())
    return "\n".join(lines)
