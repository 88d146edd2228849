"""Free TCP ports on the loopback interface, for services started by tests and local runs."""

from __future__ import annotations

import socket

__all__ = ["free_port", "port_in_use"]


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
