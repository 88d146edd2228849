"""Smoke test for the launcher: start (building first if needed), connect with the Python driver, create
and query a vector index, stop. Prints the time to READY and to a clean stop.

Usage: python ops/neo4j-launcher/smoke_test.py      (needs `pip install neo4j`, a JDK 17+ and Maven)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from neo4j import GraphDatabase

HERE = Path(__file__).resolve().parent


def main() -> None:
    data = tempfile.mkdtemp(prefix="neo4j-smoke-")
    env = dict(os.environ, NEO4J_EXIT_ON_STDIN_EOF="1")
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(HERE / "run.sh"), data, "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # blocks until READY (or EOF on failure)
    assert line.startswith("READY "), f"launcher failed: {line!r} rc={proc.poll()}"
    uri = line.split()[1]
    print(f"{line}  ({time.monotonic() - started:.1f}s incl. build check)")
    try:
        with GraphDatabase.driver(uri, auth=None) as driver:
            driver.verify_connectivity()
            info = driver.get_server_info()
            print("server:", info.agent, "bolt", info.protocol_version)
            driver.execute_query(
                "CREATE VECTOR INDEX mem_vec IF NOT EXISTS FOR (n:Memory) ON n.embedding OPTIONS "
                "{indexConfig: {`vector.dimensions`: 4, `vector.similarity_function`: 'cosine'}}"
            )
            driver.execute_query("CALL db.awaitIndexes(60)")
            driver.execute_query(
                "UNWIND range(1, 50) AS i CREATE (:Memory {id: i, userId: CASE WHEN i % 2 = 0 THEN 'a' "
                "ELSE 'b' END, embedding: [toFloat(i), 1.0, 0.5, toFloat(i % 7)]})"
            )
            records, _, _ = driver.execute_query(
                "CALL db.index.vector.queryNodes('mem_vec', $k, $q) YIELD node, score "
                "WHERE node.userId = $uid RETURN node.id AS id, score ORDER BY score DESC LIMIT $n",
                k=20,
                q=[10.0, 1.0, 0.5, 3.0],
                uid="a",
                n=5,
            )
            print("filtered top:", [(r["id"], round(r["score"], 4)) for r in records])
            assert records, "vector query returned nothing"
    finally:
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # 143 = 128 + SIGTERM: the JVM's normal status after its shutdown hook ran.
        print(f"exit code: {proc.wait(timeout=60)} ({time.monotonic() - stopping:.1f}s to stop)")
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
