"""Free TCP ports on the loopback interface, for services started by tests and local runs."""

from __future__ import annotations

import socket
from collections.abc import Callable

__all__ = ["free_port", "port_in_use", "start_on_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel reports free right now.

    Another process can take it before our server binds it; the service classes retry with a new port
    when an automatically chosen one turns out to be taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def start_on_port(
    *,
    label: str,
    port: int,
    movable: bool,
    start_once: Callable[[int], None],
    error: type[Exception],
    host: str = "127.0.0.1",
    attempts: int = 3,
) -> int:
    """Start a server on ``port``; an automatically chosen (``movable``) port that turns out to be taken
    is replaced by a fresh one, up to ``attempts`` times. Returns the port the server is listening on."""
    for _ in range(attempts):
        if movable:
            port = free_port(host)
        elif port_in_use(port, host):
            raise error(f"{label}: port {host}:{port} is already in use")
        try:
            start_once(port)
        except error as exc:
            if not movable or "Address already in use" not in str(exc):
                raise
            continue
        return port
    raise error(f"{label}: no free port after {attempts} attempts")
