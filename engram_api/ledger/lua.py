"""``LuaScript``: the one way Engram runs a Lua script on Redis, by named KEYS and ARGV, in one ``EVALSHA``.

Each script declares its keys and its arguments as two ``NamedTuple`` classes; a caller builds those (by
name, checked by the type checker) and never writes ``KEYS[n]``. The script's text reads them by name too:
``K.<key name>`` and ``A.<argument name>`` are replaced by ``KEYS[i]`` and ``ARGV[i]`` (declaration order)
when the script is defined, so the Lua and the Python cannot disagree on a position, and a name the tuples
do not declare is refused there. A script whose ARGV ends in a variable list (field/value pairs) declares
``rest``: a prologue binds ``REST`` to the index of its first element. The scripts themselves are in
``scripts`` (a message's life), ``controls``, ``maintenance`` and ``turns``.

The ``EVALSHA`` is packed here as RESP bytes and sent through redis-py's own connection pool. Why (issue
45, item 6, measured): redis-py 8 packs every argument in Python (``Encoder.encode``'s type checks and a
re-copied buffer per argument) and runs every command through ``execute_command`` (a retry closure,
observability hooks, a response-callback lookup); for the enqueue script's 16 keys and arguments that was
13 µs in a hot loop and ~30 µs inside a real enqueue, the producer's largest cost after the round trip
itself (docs/benchmarks/history.md, 2026-12-06). Here a script's fixed head (``*n``, ``EVALSHA``, its sha,
the key count) is packed once per arity, and each argument costs one ``encode`` and one ``%`` format.

Invariants:
- Naming costs the running script nothing (issue 45: a prologue that built two tables of names cost each
  call ~3 µs of Redis CPU), and the ``REST`` prologue only binds a local: a script's first write is still
  its own first write (Redis checks ``maxmemory`` there, which ``ENQUEUE`` relies on).
- A script is hashed once, when it is defined; a call is one ``EVALSHA`` (one more round trip to load it
  the first time a server has not seen it, as redis-py's own ``Script`` does). Any client works, and a
  client is never cached, so a script outlives a reconnect or a fork.
- A call with a keys or args tuple of another script's types is refused (``TypeError``) before Redis
  is touched; a name that is not a plain Lua name (or is a Lua keyword) is refused at definition.
- The packed bytes are exactly redis-py's for the same arguments (``str`` as UTF-8, ``int`` and ``float``
  as their ``repr``, ``bytes`` as they are; ``tests/test_ledger.py`` compares them with redis-py's packer);
  any other argument goes through redis-py, which raises its own ``DataError``.
- Connection semantics are redis-py's: a connection from the client's pool, always given back; its health
  check before the send; its own ``Retry`` (a connection or timeout error disconnects it and sends again,
  as ``execute_command`` does; every script answers a second run of itself: ``ENQUEUE`` returns the task id
  its first run wrote); a connection marked for reconnect reconnected; an error reply raised as redis-py's
  exception (``NoScriptError``, ``OutOfMemoryError``), so the NOSCRIPT reload below and the producer's
  refusal when Redis is full see what they saw before.
- Only a plain ``redis.Redis`` on a pool (Sentinel's ``master_for`` included), redis-py 8 or later, takes
  the packed path. A pipeline (which queues), a single-connection client, another client class, or any
  client while tracing is on (redis-py's OpenTelemetry instrumentation wraps ``execute_command``, and its
  span stays) goes through ``execute_command``.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from engram_api import tracing

if TYPE_CHECKING:
    import redis

__all__ = ["LuaScript", "evalsha", "packed_evalsha"]

K = TypeVar("K", bound=tuple[Any, ...])
A = TypeVar("A", bound=tuple[Any, ...])

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_LUA_WORDS = frozenset({
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in", "local", "nil",
    "not", "or", "repeat", "return", "then", "true", "until", "while",
})  # fmt: skip


_REFERENCE = re.compile(r"\b([KA])\.([A-Za-z_]\w*)")


def _resolved(body: str, key_names: tuple[str, ...], arg_names: tuple[str, ...]) -> str:
    """``body`` with every ``K.name`` / ``A.name`` replaced by its ``KEYS[i]`` / ``ARGV[i]``."""
    tables = {"K": ("KEYS", key_names), "A": ("ARGV", arg_names)}

    def position(found: re.Match[str]) -> str:
        table, names = tables[found[1]]
        if found[2] not in names:
            raise ValueError(f"{found[0]} is not one of the script's {table} ({', '.join(names)})")
        return f"{table}[{names.index(found[2]) + 1}]"

    return _REFERENCE.sub(position, body)


class LuaScript(Generic[K, A]):
    """``keys`` and ``args`` are NamedTuple classes naming the script's KEYS and ARGV in order; ``body``
    is Lua that reads them as ``K.name`` and ``A.name`` (and ``REST``, with ``rest``)."""

    def __init__(self, keys: type[K], args: type[A], body: str, *, rest: str | None = None) -> None:
        key_names: tuple[str, ...] = keys._fields  # type: ignore[attr-defined]
        arg_names: tuple[str, ...] = args._fields  # type: ignore[attr-defined]
        for field in (*key_names, *arg_names):
            if not _NAME.match(field) or field in _LUA_WORDS:
                raise ValueError(f"{field!r} is not a plain Lua name")
        self.keys_type, self.args_type, self.rest = keys, args, rest
        prologue = "" if rest is None else f"local REST = {len(arg_names) + 1}  -- {rest}\n"
        self.source = prologue + _resolved(body.lstrip("\n"), key_names, arg_names)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: K, args: A, *rest: object) -> Any:
        """Run the script with ``keys`` and ``args`` (and, for a script that declares ``rest``, the
        variable tail of ARGV); returns what Redis returns."""
        if type(keys) is not self.keys_type or type(args) is not self.args_type:
            raise TypeError(f"expected {self.keys_type.__name__} and {self.args_type.__name__}")
        if rest and self.rest is None:
            raise TypeError("this script takes no variable arguments")
        flat = (*keys, *args, *rest)
        try:
            return evalsha(client, self.sha, len(keys), flat)
        except Exception as exc:
            # Imported here, off the common path: defining a script (importing this module) must not load
            # redis-py for a process that never runs one (a stopped fleet's CLI read).
            from redis.exceptions import NoScriptError

            if not isinstance(exc, NoScriptError):
                raise
        client.script_load(self.source)  # a server that has not seen it (new, restarted, or flushed its scripts)
        return evalsha(client, self.sha, len(keys), flat)


@functools.cache
def _head(sha: str, numkeys: int, count: int) -> bytes:
    """``*<n>``, ``EVALSHA``, the sha and the key count of a call with ``count`` keys and arguments."""
    keys = str(numkeys).encode()
    return b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (count + 3, len(sha), sha.encode(), len(keys), keys)


def packed_evalsha(sha: str, numkeys: int, flat: tuple[object, ...]) -> bytes | None:
    """``EVALSHA sha numkeys *flat`` as RESP bytes; None when an argument is not a str, int, float or bytes."""
    parts = [_head(sha, numkeys, len(flat))]
    for value in flat:
        kind = type(value)
        if kind is str:
            data = value.encode()  # type: ignore[attr-defined]
        elif kind is int or kind is float:
            data = repr(value).encode()
        elif kind is bytes:
            data = value  # type: ignore[assignment]
        else:
            return None
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


@functools.cache
def _packs(cls: type) -> bool:
    """Whether calls on clients of ``cls`` are packed here: redis-py's own ``Redis``, redis-py 8 or later."""
    import redis

    return cls is redis.Redis and int(redis.__version__.split(".")[0]) >= 8


def evalsha(client: redis.Redis, sha: str, numkeys: int, flat: tuple[object, ...]) -> Any:
    """What ``client.evalsha(sha, numkeys, *flat)`` returns (and raises), packed and sent here when it can be."""
    packed = packed_evalsha(sha, numkeys, flat) if _packs(type(client)) and client.connection is None else None
    if packed is None or tracing.enabled():
        return client.evalsha(sha, numkeys, *flat)
    pool = client.connection_pool
    conn = pool.get_connection()

    def roundtrip() -> Any:
        conn.send_packed_command([packed])
        return conn.read_response()

    try:
        return conn.retry.call_with_retry(
            roundtrip, lambda _error, _failures: conn.disconnect(), with_failure_count=True
        )
    finally:
        try:
            if conn.should_reconnect():
                conn.disconnect()
                conn.connect()
        finally:
            pool.release(conn)
