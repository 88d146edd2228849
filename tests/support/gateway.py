"""A real gateway process for tests: ``engram serve`` on a free loopback port, with minted keys.

The process is the one users run (uvicorn, the CLI entry point); tests talk to it with httpx only.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engram_api import keys
from engram_gateway.auth import mint_key
from engram_workers.services.celery_worker import ManagedProcess
from tests.support.stack import SETTLE_S, Stack

# name -> (scopes, namespace); every test module gets fresh secrets.
KEY_SPECS: dict[str, tuple[tuple[str, ...], str]] = {
    "a_rw": (("read", "write"), "appA"),
    "a_read": (("read",), "appA"),
    "a_op": (("read", "write", "operator"), "appA"),
    "b_rw": (("read", "write"), "appB"),
    "b_op": (("read", "write", "operator"), "appB"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mint_keys() -> tuple[dict[str, str], str]:
    """(name -> secret, the ENGRAM_API_KEYS value)."""
    secrets, entries = {}, []
    for name, (scopes, namespace) in KEY_SPECS.items():
        key, spec = mint_key(name, scopes, namespace)
        secrets[name] = key
        entries.append(spec.model_dump(mode="json"))
    return secrets, json.dumps(entries)


@dataclass
class GatewayProcess:
    url: str
    process: ManagedProcess


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "engram_workers.cli", "serve", *args]


@contextmanager
def gateway_process(env: Mapping[str, str], log_dir: Path, name: str = "gateway") -> Iterator[GatewayProcess]:
    port = free_port()
    proc = ManagedProcess(
        name=name, argv=serve_command("--host", "127.0.0.1", "--port", str(port)), env=env, log_dir=log_dir
    ).start()
    try:
        proc.wait_for_log("Application startup complete", timeout=120)
        yield GatewayProcess(url=f"http://127.0.0.1:{port}", process=proc)
    finally:
        proc.stop()


def auth(secrets: dict[str, str], name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secrets[name]}"}


def wait_state(http: httpx.Client, headers: dict[str, str], uid: str, mid: str, want: str = "applied") -> None:
    # A bound on waiting for the workers, not a timing assertion.
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        r = http.get(f"/v1/users/{uid}/messages/{mid}", headers=headers)
        if r.status_code == 200 and r.json()["state"] == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{uid}/{mid} never reached {want}: {r.status_code} {r.text}")


def footprint(stack: Stack, users: list[str]) -> tuple[Any, ...]:
    """What any write would change: message statuses (an enqueue writes one atomically with its payload and
    task), the queue, dead letters, and each user's graph."""
    r = stack.client.redis
    statuses = sorted(r.scan_iter(match="engram:status:*", count=1000))
    return (
        [(key, r.hget(key, "state")) for key in statuses],
        r.llen(keys.EXTRACT_QUEUE),
        r.zrange(keys.dead_letters(), 0, -1),
        [stack.client.graph.stats(u).model_dump(exclude={"usage"}) for u in users],
    )
