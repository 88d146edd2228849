"""Typed errors shared by the producer, the reader, the workers and the CLI.

Every error a caller can act on is an ``EngramError``; ``field`` names the input that was wrong so
callers (and the CLI's one-line error output) can say exactly what to fix.
"""

from __future__ import annotations

__all__ = [
    "BackPressureError",
    "BreakerOpenError",
    "ConfigError",
    "EngramError",
    "InvalidInputError",
    "LLMError",
    "NotFoundError",
    "SchemaNotMigratedError",
    "StaleWriteError",
    "StoreUnavailableError",
    "UserBusyError",
    "WaitTimeoutError",
]


class EngramError(Exception):
    """Base class of every error Engram raises on purpose."""


class InvalidInputError(EngramError, ValueError):
    """Bad input from a caller; nothing was enqueued or written."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid {field}: {problem}")


class ConfigError(EngramError):
    """A setting has a wrong value; raised at start-up and names the environment variable."""

    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"{variable}: {problem}")


class StoreUnavailableError(EngramError):
    """A backing service (Redis, Neo4j, the embedded store) cannot be reached right now."""


class SchemaNotMigratedError(EngramError):
    """The graph database's schema is not the version this code expects: run `engram migrate` (once, by an
    operator or an init job) before starting processes against it."""

    def __init__(self, found: int | None, expected: int) -> None:
        self.found = found
        self.expected = expected
        state = "has no Engram schema" if found is None else f"is at schema version {found}"
        super().__init__(f"the Neo4j database {state}, this code needs version {expected}: run `engram migrate`")


class StaleWriteError(EngramError):
    """A write was refused: the user's stamp moved since the write was planned (another writer got in
    after this one's lease lapsed). Nothing was written; plan again from fresh reads."""

    def __init__(self, user_id: str, expected: object, found: object) -> None:
        self.user_id = user_id
        self.expected = expected
        self.found = found
        super().__init__(f"user {user_id!r} moved from {expected} to {found} since the write was planned")


class NotFoundError(EngramError, LookupError):
    """The thing asked for does not exist for this user."""


class LLMError(EngramError):
    """The extraction model failed; ``transient`` says whether a retry may help."""

    def __init__(self, message: str, *, transient: bool, raw: str | None = None) -> None:
        self.transient = transient
        self.raw = raw
        super().__init__(message)


class BreakerOpenError(EngramError):
    """The fleet-wide LLM circuit breaker is open: the model is not called for ``retry_in`` seconds."""

    def __init__(self, retry_in: float) -> None:
        self.retry_in = retry_in
        super().__init__(f"LLM circuit breaker open (retry in {retry_in:.1f}s)")


class UserBusyError(EngramError):
    """Another process holds ``user_id``'s write lock (one writer per user); try again shortly."""

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id
        super().__init__(f"user {user_id!r} is being written by another process; try again shortly")


class WaitTimeoutError(EngramError, TimeoutError):
    """``wait()`` ran out of time before every message was applied or dead-lettered."""


class BackPressureError(EngramError):
    """The pipeline (or one user's backlog: ``user_id``, ``pending``, ``limit``) is too far behind to take
    more now; nothing was enqueued. Retry after ``retry_after_s``."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = 5.0,
        user_id: str | None = None,
        pending: int | None = None,
        limit: int | None = None,
    ) -> None:
        self.retry_after_s = retry_after_s
        self.user_id = user_id
        self.pending = pending
        self.limit = limit
        self.field = "user_id" if user_id is not None else None
        super().__init__(message)
