"""Our client-side CPU of two per-message hot spots, each against a baseline measured in the same run.

``python ops/bench/client_cpu_ab.py [--other CHECKOUT] [--plans 150] [--rounds 3]``

- **Store write** (with ``--other``): ``Neo4jGraphStore.apply`` of realistic plans (two entities, three
  facts, one chunk, one supersession; 384-float vectors, as MiniLM's) for a fresh user, each as the apply
  stage writes it (the user's stamp read, then the write fenced on it), this checkout against another one,
  in alternating fresh processes (``PYTHONPATH`` = that checkout) against one Neo4j server this script
  starts: the process's CPU per plan after a warm-up, and the server's CPU over the same plans (``/proc``,
  clock ticks) apart.
- **Broker transport**: a publish, a delivery (with kombu's unacked-message bookkeeping) and an ack through
  kombu's Redis transport and through ``engram_workers.broker`` (one redis-py client object per pool), in
  alternating blocks in one process against one Redis this script starts: CPU per message.

Each prints its medians and the ratio this / baseline. Only ratios of one run compare (the machine's load
moves absolute CPU times).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parents[1]


def apply_cpu(uri: str, n: int, server_pid: int) -> tuple[float, float]:
    """In a process of the checkout on ``PYTHONPATH``: ms of this process's and of the server's CPU per
    fenced ``apply`` of ``n`` plans."""
    import random
    import uuid
    from datetime import UTC, datetime, timedelta

    from benchlib import process_cpu_seconds

    from engram_api.models import ChunkRecord, EntityRecord, EpisodeRecord, FactChange, FactRecord, WritePlan
    from engram_api.storage.graph.neo4j.store import Neo4jGraphStore
    from engram_api.versions import ABSENT, new_epoch

    rnd = random.Random(1)
    store = Neo4jGraphStore(uri=uri, user="neo4j", password=None, database="neo4j")
    # `engram migrate` where the tree has it (older trees created the schema in ensure_schema).
    getattr(store, "migrate", store.ensure_schema)()

    def vec() -> list[float]:
        return [rnd.uniform(-0.1, 0.1) for _ in range(384)]

    def plans(user: str, count: int) -> list[WritePlan]:
        t0, out, previous = datetime(2024, 1, 1, tzinfo=UTC), [], None
        me = EntityRecord(id=uuid.uuid4().hex, user_id=user, name="User", norm_name="user", embedding=vec())
        for i in range(count):
            t = t0 + timedelta(minutes=i)
            thing = EntityRecord(
                id=uuid.uuid4().hex, user_id=user, name=f"Thing {i}", norm_name=f"thing {i}", embedding=vec(),
                created_at=t, updated_at=t,
            )  # fmt: skip
            facts = [
                FactRecord(
                    id=uuid.uuid4().hex,
                    user_id=user,
                    subject_id=me.id,
                    predicate=f"LIKES_{i}_{k}",
                    object_id=thing.id if k == 0 else None,
                    statement=f"User likes thing {i}, number {k}",
                    valid_from=t,
                    embedding=vec(),
                    created_at=t,
                    updated_at=t,
                )
                for k in range(3)
            ]
            changes = [FactChange(id=previous, valid_until=t, superseded_by=facts[0].id)] if previous else []
            previous = facts[1].id
            episode = EpisodeRecord(id=f"m{i}", user_id=user, content=f"I like thing {i}", event_time=t)
            chunk = ChunkRecord(
                id=uuid.uuid4().hex, user_id=user, episode_id=episode.id, seq=0, text=episode.content,
                speaker="User", event_time=t, embedding=vec(),
            )  # fmt: skip
            out.append(
                WritePlan(
                    user_id=user,
                    episode=episode,
                    new_entities=[me, thing] if i == 0 else [thing],
                    new_facts=facts,
                    fact_changes=changes,
                    chunks=[chunk],
                )
            )
        return out

    def write(plan: WritePlan) -> None:
        stamp = store.user_stamp(plan.user_id)
        with store.fenced(plan.user_id, stamp, stamp.epoch if stamp != ABSENT else new_epoch()):
            store.apply(plan)

    for plan in plans(f"warm-{uuid.uuid4().hex}", 10):
        write(plan)
    measured = plans(f"ab-{uuid.uuid4().hex}", n)
    cpu, server = time.process_time(), process_cpu_seconds(server_pid)
    for plan in measured:
        write(plan)
    spent, served = time.process_time() - cpu, process_cpu_seconds(server_pid) - server
    store.close()
    return spent / n * 1e3, served / n * 1e3


def store_write(other: Path, n: int, rounds: int) -> None:
    from engram_testing.neo4j_server import Neo4jServer

    roots = {"this": REPO, "other": other.resolve()}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in roots}
    with tempfile.TemporaryDirectory() as tmp, Neo4jServer(data_dir=Path(tmp)) as server:
        for r in range(rounds):
            for name in roots if r % 2 == 0 else reversed(list(roots)):
                env = {**os.environ, "PYTHONPATH": str(roots[name])}
                code = f"import sys; sys.path.insert(0, {str(BENCH_DIR)!r}); import client_cpu_ab as m; "
                code += (
                    f"import engram_api; print(*m.apply_cpu({server.uri!r}, {n}, {server.pid}), engram_api.__file__)"
                )
                # cwd too: ``python -c`` puts the working directory first on sys.path
                out = subprocess.run(
                    [sys.executable, "-c", code], env=env, cwd=roots[name], capture_output=True, text=True, check=True
                )
                ours, served, source = out.stdout.strip().splitlines()[-1].split()
                assert source.startswith(str(roots[name])), f"{name} ran {source}"
                got[name].append((float(ours), float(served)))
                print(f"store write, round {r + 1}, {name} ({roots[name]}): {float(ours):.3f} ms CPU a plan, "
                      f"the server's {float(served):.3f}")  # fmt: skip
    for i, what in enumerate(("our", "the server's")):
        this = statistics.median(x[i] for x in got["this"])
        base = statistics.median(x[i] for x in got["other"])
        print(f"store write, {what} CPU: median {this:.3f} vs {base:.3f} ms a plan; this / other = {this / base:.3f}")


def broker_transport(rounds: int, block: int = 400) -> None:
    from kombu import Connection

    from engram_workers.broker import TRANSPORT
    from engram_workers.services.redis_server import RedisServer

    def cycle(queue: object, n: int) -> float:
        cpu = time.process_time()
        for i in range(n):
            queue.put({"n": i})  # type: ignore[attr-defined]
            queue.get(timeout=5).ack()  # type: ignore[attr-defined]
        return (time.process_time() - cpu) / n * 1e6

    with tempfile.TemporaryDirectory() as tmp, RedisServer(data_dir=Path(tmp)) as server:
        connections = {"kombu": Connection(server.url), "engram": Connection(server.url, transport=TRANSPORT)}
        queues = {k: c.SimpleQueue(f"client-cpu-ab-{k}") for k, c in connections.items()}
        got: dict[str, list[float]] = {k: [] for k in queues}
        for q in queues.values():
            cycle(q, 100)
        for r in range(2 * rounds):
            for name in queues if r % 2 == 0 else reversed(list(queues)):
                got[name].append(cycle(queues[name], block))
        for q in queues.values():
            q.close()
    ours, base = statistics.median(got["engram"]), statistics.median(got["kombu"])
    print(f"broker transport: publish + deliver + ack, median {ours:.0f} us CPU a message through")
    print(f"  engram_workers.broker vs {base:.0f} through kombu's Redis transport; ours / kombu = {ours / base:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", type=Path, help="another checkout, for the store-write comparison")
    parser.add_argument("--plans", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path[:0] = [str(REPO)]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"load average {os.getloadavg()[0]:.2f}")
    broker_transport(args.rounds)
    if args.other:
        store_write(args.other, args.plans, 2 * args.rounds)


if __name__ == "__main__":
    main()
