"""Housekeeping against the keyspace (issue 45): the redelivery sweep (with its dead-letter prune),
``erase_user`` and a user's dead-letter listing, on a keyspace of N applied messages and on one of N/10,
in the same run. Their Redis commands (INFO commandstats) and wall time must follow what is in flight and
the user's own messages, not the keyspace: the printed ratios (N against N/10) should be ~1.

Each keyspace is a Redis database loaded through the ledger itself (``MessageLedger`` on a pipeline: the
real scripts, so the real keys and indexes): N applied messages of many users (full 1M, quick 100K), one
dead letter per 100 of them, the same few thousand messages in flight (queued, their tasks on the extract
queue) and one measured user (messages in every state, dead letters, recall logs). The sweep runs with a
threshold of 0, so every in-flight message is overdue and found waiting in the broker (nothing re-sent:
each round sees the same state); the erased user is loaded again before each round. Rounds alternate
between the two databases, so drift on a shared machine hits both alike.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

from benchlib import BenchContext, BenchResult, Table, command_calls, ratio

_ROUNDS = 5
_REPEAT = 5  # samples per round of the listing (a few ms: one sample is noise)
_IN_FLIGHT = 3_000
_USERS = 2_000  # the applied messages' users
_TARGET = 200  # the measured user's messages: 40 each queued, started, extracted, applied, dead
_LOAD_PAGE = 2_000
_NOT_MEASURED = ("info", "config", "select", "client")


def _ledger(client: Any) -> Any:
    from engram_api.ledger import MessageLedger

    return MessageLedger(client, status_ttl_s=7 * 24 * 3600)


_TEMPLATE: list[Any] = []  # one envelope built (and validated) by the producer; the others are its copies


def _envelope(user: str, mid: str) -> Any:
    """The producer's envelope of "I like tea." for ``user`` and ``mid`` (plain ids, valid as they are): a
    copy of one built once, so that loading 1M messages is not spent validating the same text again."""
    from datetime import UTC, datetime

    from engram_api.producer import build_envelope
    from engram_api.settings import Settings

    if not _TEMPLATE:
        _TEMPLATE.append(
            build_envelope(Settings(), "u", "I like tea.", message_id="m", timestamp=datetime(2024, 5, 1, tzinfo=UTC))
        )
    return _TEMPLATE[0].model_copy(update={"user_id": user, "message_id": mid})


def _load(client: Any, applied: int) -> float:
    """The keyspace: ``applied`` applied messages over ``_USERS`` users, a dead letter per 100 of them,
    and ``_IN_FLIGHT`` queued messages, written by the ledger's own scripts, pipelined; returns the bytes
    of Redis memory per applied message (its dead letters included)."""
    from engram_api import keys
    from engram_api.ledger import controls, maintenance, scripts, turns
    from engram_api.models import DeadLetter, MessageState

    client.flushdb(asynchronous=True)
    for module in (scripts, turns, controls, maintenance):  # a pipelined EVALSHA does not load its script on a miss
        for script in vars(module).values():
            if isinstance(script, scripts.LuaScript):
                client.script_load(script.source)
    used = int(client.info("memory")["used_memory"])
    for start in range(0, applied, _LOAD_PAGE):
        pipe = client.pipeline(transaction=False)
        ledger = _ledger(pipe)
        for i in range(start, min(applied, start + _LOAD_PAGE)):
            user, mid = f"bg{i % _USERS}", f"a{i}"
            envelope = _envelope(user, mid)
            ledger.enqueue(envelope, task_id=f"t{i}", limit=1_000_000)
            if i % 100 == 99:
                ledger.dead_letter(
                    DeadLetter(user_id=user, message_id=mid, stage="extract", reason="x", envelope=envelope)
                )
            else:
                ledger.set_state(user, mid, MessageState.APPLIED, fields={"version": "1"})
        pipe.execute()
    client.delete(keys.EXTRACT_QUEUE)  # the workers took these messages' tasks
    per_applied = (int(client.info("memory")["used_memory"]) - used) / applied
    pipe = client.pipeline(transaction=False)
    ledger = _ledger(pipe)
    for i in range(_IN_FLIGHT):
        ledger.enqueue(_envelope(f"fl{i % 300}", f"q{i}"), task_id=f"f{i}", limit=1_000_000)
    pipe.execute()
    return per_applied


def _load_target(client: Any, user: str) -> None:
    """The measured user: messages in every state, dead letters and two recall logs."""
    from engram_api import keys
    from engram_api.models import DeadLetter, MessageState

    ledger = _ledger(client)
    for i in range(_TARGET):
        mid, kind = f"m{i}", i % 5
        envelope = _envelope(user, mid)
        ledger.enqueue(envelope, task_id=f"u{i}", limit=1_000_000)
        if kind >= 1:
            ledger.enter(user, mid, "extract")
        if kind >= 2:
            ledger.set_state(user, mid, MessageState.EXTRACTED, extraction="{}", event_time=0.0)
        if kind == 3:
            ledger.set_state(user, mid, MessageState.APPLIED)
        if kind == 4:
            ledger.dead_letter(DeadLetter(user_id=user, message_id=mid, stage="apply", reason="x", envelope=envelope))
    for recall_id in ("r1", "r2"):  # as the reader writes them (engram_api.reader.background)
        client.set(keys.recall_log(user, recall_id), "{}", ex=60)
        client.zadd(keys.recall_logs(user), {recall_id: time.time()})
    assert len(ledger.dead_letters.list(user)) == _TARGET // 5


def _measured(client: Any, action: Any) -> tuple[dict[str, int], float]:
    """Redis commands ``action`` sent, by name (all of them: a script counts as one EVALSHA plus what it
    calls), and its wall time in ms."""
    before = command_calls(client)
    t0 = time.perf_counter()
    action()
    ms = (time.perf_counter() - t0) * 1e3
    after = command_calls(client, since=before)
    return {name: n for name, n in after.items() if n and name not in _NOT_MEASURED}, ms


def run(ctx: BenchContext) -> BenchResult:
    import redis

    from engram_api import keys
    from engram_workers.maintenance import redeliver_stuck

    large = ctx.size(100_000, 1_000_000)
    sizes = {"large": large, "small": large // 10}
    base = ctx.services.redis_url.rsplit("/", 1)[0]
    clients = {name: redis.Redis.from_url(f"{base}/{db}") for name, db in (("large", 11), ("small", 12))}
    memory: dict[str, float] = {}
    for name, client in clients.items():
        t0 = time.perf_counter()
        memory[name] = _load(client, sizes[name])
        ctx.log(
            f"{name}: {sizes[name]:,} applied + {_IN_FLIGHT:,} in flight loaded in {time.perf_counter() - t0:.0f} s"
        )
    user = "target"
    samples: dict[tuple[str, str], list[tuple[dict[str, int], float]]] = {}
    for _ in range(_ROUNDS):
        for name, client in clients.items():
            ledger = _ledger(client)
            _load_target(client, user)
            ops = {
                "redelivery sweep + dead-letter prune": lambda c=client: redeliver_stuck(
                    client=c, send=_no_send, older_than_s=0, dead_letter_retention=timedelta(days=14)
                ),
                "dead-letter listing (one user)": lambda lg=ledger: lg.dead_letters.list(user),
                "erase_user": lambda lg=ledger: lg.forget_user(user),
            }
            for op, action in ops.items():  # the erasure last: it removes the user measured before it
                for _ in range(_REPEAT if op.startswith("dead-letter listing") else 1):
                    samples.setdefault((op, name), []).append(_measured(client, action))
            left = [k for p in keys.user_keys_pattern(user) for k in client.scan_iter(match=p, count=1000)]
            assert not left, f"erase_user left {len(left)} keys"
    dbsize = {name: int(client.dbsize()) for name, client in clients.items()}
    for client in clients.values():
        client.flushdb(asynchronous=True)  # a synchronous flush of 1M keys outlasts the socket timeout
        client.close()

    table = Table(
        f"housekeeping on {sizes['large']:,} vs {sizes['small']:,} applied messages "
        f"(+{_IN_FLIGHT:,} in flight, a {_TARGET}-message user), median of {_ROUNDS} rounds",
        ["operation", "commands (N)", "commands (N/10)", "ratio", "ms (N)", "ms (N/10)", "ratio"],
        caption=f"keys: {dbsize['large']:,} vs {dbsize['small']:,}; ratio = N / (N/10): ~1 means the cost "
        "does not follow the keyspace",
    )
    summary: dict[str, Any] = {"applied": sizes, "in_flight": _IN_FLIGHT, "target_messages": _TARGET, "keys": dbsize}
    for op in ("redelivery sweep + dead-letter prune", "erase_user", "dead-letter listing (one user)"):
        big, small = samples[(op, "large")], samples[(op, "small")]
        cmd = (statistics.median(sum(c.values()) for c, _ in big), statistics.median(sum(c.values()) for c, _ in small))
        ms = (statistics.median(m for _, m in big), statistics.median(m for _, m in small))
        table.add(op, cmd[0], cmd[1], f"{ratio(cmd[0], cmd[1]):.2f}", ms[0], ms[1], f"{ratio(ms[0], ms[1]):.2f}")
        summary[op] = {
            "commands": cmd, "ms": ms, "commands_ratio": ratio(cmd[0], cmd[1]), "ms_ratio": ratio(ms[0], ms[1]),
            "by_command": {name: dict(samples[(op, name)][-1][0]) for name in clients},
        }  # fmt: skip
    mem = Table("Redis memory per applied message (used_memory over its load / messages)", ["keyspace", "bytes"])
    for name in clients:
        mem.add(f"{sizes[name]:,} applied", round(memory[name]))
    summary["bytes_per_applied"] = memory
    return BenchResult(
        bench="housekeeping",
        summary=summary,
        tables=[table, mem],
        notes=[
            "the sweep's threshold is 0: every in-flight message is overdue and found waiting in the queue",
            "a dead letter per 100 applied messages, so the fleet's letters grow with N too",
        ],
    )


def _no_send(task: str, args: tuple[str, ...]) -> None:
    raise AssertionError(f"the sweep re-sent {task}{args}: every in-flight task is on its queue")
