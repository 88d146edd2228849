"""What every chaos scenario shares: the services, a fleet of real workers, a workload whose every message
leaves distinct facts, the count (sent / applied / dead-lettered / lost / duplicated) and the result table.

Scenarios are plain functions ``run(services, params) -> ScenarioResult``; ``run_all.py`` and
``tests/test_chaos.py`` call the same code at different sizes. Counting rules (README.md):

- sent: messages the producer got a receipt for;
- applied / dead-lettered: the status hash of each message (``engram_api.keys.status``), cross-checked
  with the dead-letter store;
- lost: sent - applied - dead-lettered once everything settled (``client.wait`` with a generous timeout);
- duplicated: duplicate entities (user + norm_name), facts (user + statement + valid_from), episodes,
  provenance links (repeated ``source_ids``, parallel ``FROM`` relationships) and vectors (FAISS rows
  beyond the graph's unique embeddings, or rows for nodes the graph does not have).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    # Workers import the fault middleware as tests.support.faults; this process needs the same tree.
    sys.path.insert(0, str(REPO_ROOT))

from engram_api import MemoryClient  # noqa: E402
from engram_api.errors import WaitTimeoutError  # noqa: E402
from engram_api.models import MessageState, Receipt  # noqa: E402
from engram_testing import LLMStandin, Neo4jServer, Reply  # noqa: E402
from engram_workers.services import RedisServer  # noqa: E402
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER, ManagedProcess  # noqa: E402
from tests.support.extractions import entity, fact, lives_in, message_text  # noqa: E402
from tests.support.stack import Stack, engram_stack  # noqa: E402

__all__ = [
    "APPLY_WORKER",
    "EXTRACT_WORKER",
    "AppliedMonitor",
    "Duplicates",
    "Message",
    "ScenarioResult",
    "Services",
    "Tally",
    "Workload",
    "audit",
    "enqueue_paced",
    "fleet",
    "format_table",
    "kill_pid",
    "pool_children",
    "restart_worker",
    "settle",
    "start_workers",
    "warm_up",
]

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
# Verbs x nouns give statements far enough apart (cosine < 0.93) that consolidation keeps them as
# separate facts: a message applied twice then shows up as a duplicate instead of a reinforcement.
_VERBS = [
    ("COLLECTS", "collects", "collect"),
    ("REPAIRS", "repairs", "repair"),
    ("PAINTS", "paints", "paint"),
    ("STUDIES", "studies", "study"),
]
_NOUNS = ["vintage stamps", "old bicycles", "mountain landscapes", "jazz records", "sourdough bread",
          "chess openings", "tropical orchids", "pocket watches"]  # fmt: skip
_CITIES = ["Tampa", "Austin", "Denver", "Portland", "Chicago", "Boston", "Seattle", "Phoenix"]


# ------------------------------------------------------------------------------------------ services
@dataclass
class Services:
    """Where Redis, Neo4j and the LLM stand-in are; ``neo4j`` is the server itself, for the outage scenario.

    The Redis-restart scenario starts a Redis of its own, so no scenario stops the shared one.
    """

    work_dir: Path
    redis_url: str
    neo4j_uri: str
    llm: LLMStandin
    neo4j: Neo4jServer | None = None

    @classmethod
    @contextlib.contextmanager
    def started(cls, work_dir: Path) -> Iterator[Services]:
        """Start all three on loopback for a run of the scenarios; everything is stopped afterwards."""
        work_dir.mkdir(parents=True, exist_ok=True)
        with (
            RedisServer(data_dir=work_dir / "redis", appendonly=True) as redis,
            Neo4jServer(data_dir=work_dir / "neo4j") as neo4j,
            LLMStandin() as llm,
        ):
            yield cls(work_dir=work_dir, redis_url=redis.url, neo4j_uri=neo4j.uri, llm=llm, neo4j=neo4j)


@contextlib.contextmanager
def fleet(services: Services, name: str, *, redis_url: str | None = None, **settings: object) -> Iterator[Stack]:
    """A stack (own Redis database, own data directory) with no workers yet: scenarios start their own."""
    with engram_stack(
        redis_url=redis_url or services.redis_url,
        data_dir=services.work_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}",
        neo4j_uri=services.neo4j_uri,
        llm_url=services.llm.url,
        workers=False,
        **settings,
    ) as stack:
        yield stack


def warm_up(stack: Stack, llm: LLMStandin, *rules: Callable[[dict[str, Any]], Reply | None], users: int = 4) -> None:
    """Run a few real messages through the fleet before the clock starts, so cold starts (litellm import,
    embedding model load) are not mistaken for fault recovery; then script the stand-in with ``rules``."""
    warm = Workload(f"warm{time.monotonic_ns()}", users=users, per_user=2)
    llm.script(warm.reply, *rules)
    # One message per user at a time: a user's second message makes extraction read the user's graph and
    # embed the text (the extract process loads the embedding model then), as in steady state.
    for n in range(2):
        stack.client.wait([stack.client.enqueue(**m.item()) for m in warm.messages[n::2]], timeout=300)
    llm.script(*rules)


def start_workers(stack: Stack, specs: Mapping[str, Mapping[str, Any]]) -> dict[str, ManagedProcess]:
    """Start several workers at once (each spends seconds on imports before "ready.") and wait for all.

    ``specs`` maps a worker name to ``EXTRACT_WORKER`` / ``APPLY_WORKER``, optionally with overrides.
    """
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {name: pool.submit(stack.start_worker, name, spec) for name, spec in specs.items()}
        return {name: future.result() for name, future in futures.items()}


# ----------------------------------------------------------------------------------------- processes
def pool_children(pid: int) -> list[int]:
    """Direct children of ``pid`` (a prefork worker's pool processes), read from /proc."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name may hold spaces or parentheses: fields start after the last ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return sorted(children)


def kill_pid(pid: int) -> bool:
    """SIGKILL one process we started (or one of its pool children); False if it was already gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.1)
    return alive


def restart_worker(proc: ManagedProcess, *, orphans: Sequence[int] = (), timeout: float = 120.0) -> float:
    """Reap a worker whose main process was SIGKILLed, start it again and wait for "ready."; returns seconds.

    Pool children outlive a SIGKILLed parent only until they notice it is gone; any still there after a
    grace period are killed (they are ours, and a real crash of the host process takes them too).
    """
    started = time.monotonic()
    assert proc.proc is not None
    proc.proc.wait()
    for pid in _wait_gone(orphans, timeout=10.0):
        kill_pid(pid)
    since = proc.log_path.stat().st_size if proc.log_path.exists() else 0
    proc.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with proc.log_path.open("rb") as log:
            log.seek(since)
            if b"ready." in log.read():
                return time.monotonic() - started
        if not proc.alive():
            break
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not come back within {timeout}s; see {proc.log_path}")


# ------------------------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class Message:
    user_id: str
    message_id: str
    text: str
    timestamp: datetime
    city: str | None = None  # set for LIVES_IN moves

    def item(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "messages": self.text, "message_id": self.message_id,
                "timestamp": self.timestamp}  # fmt: skip


class Workload:
    """Messages for ``users`` users, ``per_user`` each, in event-time order per user.

    Every message yields facts no other message of its user yields (so a double apply is visible), nouns
    repeat across a user's messages (so entity resolution runs under load), and ``moves`` messages per
    user are single-valued LIVES_IN moves whose final chain must follow event time.
    """

    def __init__(self, tag: str, *, users: int, per_user: int, moves: int = 0) -> None:
        if per_user > len(_VERBS) * len(_NOUNS) + moves or moves > len(_CITIES):
            raise ValueError("per_user or moves too large for the statement vocabulary")
        self.messages: list[Message] = []
        self.extractions: dict[str, dict[str, Any]] = {}
        step = max(1, per_user // max(1, moves)) if moves else 0
        for u in range(users):
            user = f"chaos-{tag}-u{u:03d}"
            move_slots = {i * step for i in range(moves)}
            facts_done = 0
            for n in range(per_user):
                ts = T0 + timedelta(minutes=n)
                if n in move_slots:
                    city = _CITIES[len([m for m in move_slots if m < n])]
                    text = f"Update {n} from {user}. I moved to {city}."
                    self.extractions[text] = lives_in(city)
                    self.messages.append(Message(user, f"{user}-m{n:03d}", text, ts, city))
                    continue
                (predicate, verb, infinitive), noun = (
                    _VERBS[facts_done % len(_VERBS)],
                    _NOUNS[facts_done // len(_VERBS)],
                )
                facts_done += 1
                text = f"Update {n} from {user}. I {infinitive} {noun}."
                self.extractions[text] = {
                    "entities": [entity("e1", noun.title(), "Hobby")],
                    "facts": [fact("user", predicate, "e1", f"User {verb} {noun}")],
                }
                self.messages.append(Message(user, f"{user}-m{n:03d}", text, ts))

    @property
    def users(self) -> list[str]:
        return sorted({m.user_id for m in self.messages})

    def reply(self, request: dict[str, Any]) -> Reply | None:
        """The stand-in's scripted answer for one of our messages (None: not ours)."""
        extraction = self.extractions.get(message_text(request).strip())
        return Reply.json(extraction) if extraction is not None else None

    def order_violations(self, client: MemoryClient, applied: set[str]) -> list[str]:
        """Users whose LIVES_IN chain is not the applied moves in event-time order with only the last current."""
        bad = []
        for user in self.users:
            moves = sorted((m for m in self.messages if m.user_id == user and m.city), key=lambda m: m.timestamp)
            expected = [(m.city, m.timestamp, [m.message_id]) for m in moves if m.message_id in applied]
            chain = client.graph.history(user, "user", "LIVES_IN")
            got = [(f.object_name, f.valid_from, f.source_ids) for f in chain]
            linked = all(
                a.valid_until == b.valid_from and a.superseded_by == b.id for a, b in itertools.pairwise(chain)
            )
            if got != expected or not linked or (chain and chain[-1].valid_until is not None):
                bad.append(user)
        return bad


def enqueue_paced(
    client: MemoryClient,
    messages: Sequence[Message],
    receipts: list[Receipt],
    *,
    seconds: float,
    on_error: Callable[[Message, Exception, int], float | None] | None = None,
) -> None:
    """Enqueue ``messages`` spread over ``seconds``, appending to ``receipts`` as they go (monitors read it).

    ``on_error(message, exc, attempt)`` returns a pause before retrying the same message, or None to raise.
    """
    gap = seconds / max(1, len(messages))
    start = time.monotonic()
    for i, message in enumerate(messages):
        attempt = 0
        while True:
            try:
                receipts.append(client.enqueue(**message.item()))
                break
            except Exception as exc:
                attempt += 1
                pause = on_error(message, exc, attempt) if on_error else None
                if pause is None:
                    raise
                time.sleep(pause)
        lag = start + (i + 1) * gap - time.monotonic()
        if lag > 0:
            time.sleep(lag)


# ----------------------------------------------------------------------------------------- counting
@dataclass
class Tally:
    sent: int
    applied: set[str]
    dead: set[str]
    pending: set[str]
    notes: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.sent - len(self.applied) - len(self.dead)


_SWEEP_EVERY_S = 15.0


def _redeliver(client: MemoryClient) -> list[str]:
    from engram_workers.celery_config import make_celery
    from engram_workers.dispatch import celery_dispatch
    from engram_workers.maintenance import redeliver_stuck

    report = redeliver_stuck(
        client=client.redis,
        send=celery_dispatch(make_celery(client.settings, client.redis_url)),
        older_than_s=client.settings.visibility_timeout_s,
    )
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
    if resent:
        notes.append(f"redelivery sweep re-sent {len(resent)}: {resent[:3]}")
    tally = Tally(sent=len(pairs), applied=set(), dead=set(), pending=set(), notes=notes)
    for (_, mid), state in zip(pairs, client.producer.states(pairs), strict=True):
        if state == MessageState.APPLIED:
            tally.applied.add(mid)
        elif state == MessageState.DEAD:
            tally.dead.add(mid)
        else:
            tally.pending.add(mid)
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


@dataclass
class Duplicates:
    entities: int = 0
    facts: int = 0
    episodes: int = 0
    source_ids: int = 0
    from_links: int = 0
    vectors: int = 0
    samples: list[str] = field(default_factory=list)
    stale_indexes: int = 0

    @property
    def total(self) -> int:
        return self.entities + self.facts + self.episodes + self.source_ids + self.from_links + self.vectors

    def breakdown(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if isinstance(v, int) and k != "stale_indexes"}


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
            setattr(dup, kind, sum(r["c"] - 1 for r in records))
            dup.samples += [f"{kind}: {r['u']} {r['key']} x{r['c']}" for r in records[:2]]

    # ``read``, not ``load``: an unreadable index (base + delta log) is counted, not skipped as missing.
    files = client.reader.keeper.vectors
    for user in users:
        page, facts = 1, []
        while True:
            batch = client.graph.page(user, page, 1000)
            facts += batch.facts
            if len(facts) >= batch.total_facts or not batch.facts:
                break
            page += 1
        dup.source_ids += sum(len(f.source_ids) - len(set(f.source_ids)) for f in facts)

        items, version = client.graph.vectors(user)
        graph_ids = Counter(item.node_id for item in items)
        path = files.path_for(user)
        if not path.exists():
            continue  # no index yet: the reader builds it from the graph, nothing can be duplicated
        try:
            index = files.read(user)
        except ValueError as exc:  # FAISS rows and id map disagree: rows were added twice
            dup.vectors += 1
            dup.samples.append(f"vectors: {user} unreadable index ({exc})")
            continue
        strangers = index.node_ids() - graph_ids.keys()
        surplus = sum(index.count(k) for k in ("fact", "entity", "episode")) - len(set(graph_ids))
        if index.version >= version:
            dup.vectors += len(strangers) + max(0, surplus)
        else:
            dup.stale_indexes += 1  # behind the graph (crash between commit and save): rebuilt on read
        if strangers:
            dup.samples.append(f"vectors: {user} has {len(strangers)} rows for nodes not in the graph")
    return dup


class AppliedMonitor(threading.Thread):
    """Samples how many of the given messages are applied, to measure when throughput resumes."""

    def __init__(self, client: MemoryClient, pairs: Callable[[], Sequence[tuple[str, str]]], every: float = 0.2):
        super().__init__(daemon=True, name="applied-monitor")
        self.client = client
        self.pairs = pairs
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            with contextlib.suppress(Exception):  # Redis may be down on purpose: just skip the sample
                states = self.client.producer.states(self.pairs())
                self.samples.append((time.monotonic(), sum(s == MessageState.APPLIED for s in states)))
            self._stop_event.wait(self.every)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

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
@dataclass
class ScenarioResult:
    scenario: str
    sent: int = 0
    applied: int = 0
    dead_lettered: int = 0
    lost: int = 0
    duplicated: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # shown in the table
    details: dict[str, Any] = field(default_factory=dict)  # JSON only (per-kill logs, timelines)
    notes: list[str] = field(default_factory=list)
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
        return {**asdict(self), "ok": self.ok}


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
