"""A real gateway process for tests: ``engram serve`` on a free loopback port, with minted keys.

The process is the one users run (uvicorn, the CLI entry point); tests talk to it with httpx only.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engram_gateway.auth import mint_key
from engram_workers.services.celery_worker import ManagedProcess

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
