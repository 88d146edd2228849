"""Cells: N independent Engram stacks, each user in exactly one, picked by a stable function of the user id.

One stack is one Redis primary and one graph-store leader (docs/operations.md, "Scaling"). Nothing in
Engram spans users, so past one stack the users are spread over cells that share nothing; this module is
the routing hook: ``cell_of`` says which cell a user is in, ``CellClient`` sends each call to that cell's
own ``MemoryClient``, and a gateway configured as one cell (``ENGRAM_CELL_INDEX`` / ``ENGRAM_CELL_COUNT``)
refuses the users of the others with ``WrongCellError`` (HTTP 421, naming the right cell).

Invariants:
- ``cell_of(user_id, count)`` is the SHA-256 of the user id's UTF-8 bytes, as a big-endian integer, modulo
  ``count``: the same answer in every process, host and Python version (never ``hash()``, which is salted
  per process). A user's cell changes only when ``count`` does; adding cells moves users, so a deployment
  copies them (``export_memory`` / ``import_memory``) before it changes the count.
- A ``CellMap`` is checked whole before any client exists: every cell names its own Redis (``REDIS_URL``)
  and its own graph store (``NEO4J_URI``, or the SQLite file and FAISS caches of its own
  ``ENGRAM_DATA_DIR``), and a cell whose settings carry a cell index carries its own position; otherwise a
  ``ConfigError`` names the field (``cells[1].REDIS_URL``).
- ``CellClient`` sends a per-user call only to the user's cell and opens a cell's client on its first
  call. A call that would span cells is refused before anything is sent (``enqueue_many`` with users of
  two cells: ``InvalidInputError`` naming the first item of another cell), or fanned out read-only
  (``wait``: every cell waits, within one deadline); calls with no user (``health``, a fleet-wide dead-letter listing) go through ``cell(i)``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engram_api.client import MemoryClient
from engram_api.errors import ConfigError, EngramError, InvalidInputError, WaitTimeoutError
from engram_api.models import Receipt, WaitResult, check_user_id
from engram_api.settings import Settings

__all__ = ["Cell", "CellClient", "CellMap", "WrongCellError", "cell_of"]

# The per-user calls of ``MemoryClient`` (the user id is the first argument), routed as they are.
PER_USER = (
    "enqueue", "replay", "drop_dead_letter", "recall", "search", "get_context", "history", "get_graph", "stats",
    "feedback", "forget", "forget_user", "export_memory",
)  # fmt: skip


class WrongCellError(EngramError):
    """The user belongs to another cell than this stack's: the router sent it to the wrong one. Nothing was
    read or written here; ``cell`` is where the user's memory is (the gateway answers 421 with it)."""

    def __init__(self, user_id: str, cell: int, here: int, field: str = "user_id") -> None:
        self.user_id = user_id
        self.cell = cell
        self.here = here
        self.field = field
        super().__init__(f"user {user_id!r} belongs to cell {cell}, this is cell {here}: send it to cell {cell}")


def cell_of(user_id: str, count: int) -> int:
    """The user's cell among ``count``: SHA-256 of the id modulo ``count`` (a bad id: ``InvalidInputError``)."""
    if count < 1:
        raise InvalidInputError("count", f"must be at least 1 (got {count})")
    uid = check_user_id(user_id)
    return int.from_bytes(hashlib.sha256(uid.encode("utf-8")).digest(), "big") % count


@dataclass(frozen=True)
class Cell:
    """Where a stack is: cell ``index`` of ``count`` (``ENGRAM_CELL_INDEX`` / ``ENGRAM_CELL_COUNT``)."""

    index: int
    count: int

    @classmethod
    def of(cls, settings: Settings) -> Cell | None:
        """This stack's cell, or None when no cells are configured (every user is this stack's)."""
        if settings.cell_index is None or settings.cell_count is None:
            return None
        return cls(settings.cell_index, settings.cell_count)

    def check(self, user_id: str, field: str = "user_id") -> None:
        """``WrongCellError`` (naming ``field``) when ``user_id`` is another cell's."""
        cell = cell_of(user_id, self.count)
        if cell != self.index:
            raise WrongCellError(user_id, cell, self.index, field)


class CellMap(BaseModel):
    """The cells, in order (a user's cell is its position here): each cell's own ``Settings``."""

    model_config = ConfigDict(frozen=True)

    cells: tuple[Settings, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _share_nothing(self) -> CellMap:
        # Two cells on one Redis would share queues and leases; on one graph store, users' data; raised as
        # ConfigError (not ValueError) so that it reaches the caller as it is, naming the field.
        seen: dict[tuple[str, str], int] = {}
        for i, cell in enumerate(self.cells):
            if not cell.redis_url:
                raise ConfigError(f"cells[{i}].REDIS_URL", "every cell names its own Redis (unset)")
            if cell.cell_count is not None and (cell.cell_count, cell.cell_index) != (len(self.cells), i):
                raise ConfigError(
                    f"cells[{i}].ENGRAM_CELL_INDEX",
                    f"says cell {cell.cell_index} of {cell.cell_count}, but is cell {i} of {len(self.cells)} here",
                )
            places = [("REDIS_URL", cell.redis_url), ("ENGRAM_DATA_DIR", str(cell.data_dir.resolve()))]
            if cell.neo4j_uri is not None:
                places.append(("NEO4J_URI", cell.neo4j_uri))
            for place in places:
                if place in seen:
                    raise ConfigError(f"cells[{i}].{place[0]}", f"is cell {seen[place]}'s too: cells share nothing")
                seen[place] = i
        return self

    @property
    def count(self) -> int:
        return len(self.cells)


def _routed(name: str) -> Callable[..., Any]:
    method = getattr(MemoryClient, name)

    def call(self: CellClient, user_id: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.client_for(user_id), name)(user_id, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``MemoryClient.{name}`` on the user's cell." + (f"\n\n{method.__doc__}" if method.__doc__ else "")
    return call


class CellClient:
    """``MemoryClient``'s per-user API over cells: every call goes to the user's cell's own client."""

    def __init__(self, cells: CellMap | Sequence[Settings]) -> None:
        self.map = cells if isinstance(cells, CellMap) else CellMap(cells=tuple(cells))
        self._clients: dict[int, MemoryClient] = {}
        self._lock = threading.Lock()  # one client per cell, even when two threads ask first at once

    def cell_of(self, user_id: str) -> int:
        return cell_of(user_id, self.map.count)

    def cell(self, index: int) -> MemoryClient:
        """Cell ``index``'s client, opened on first use (its own Redis, graph store and reader)."""
        if not 0 <= index < self.map.count:
            raise InvalidInputError("cell", f"must be 0 .. {self.map.count - 1} (got {index})")
        with self._lock:
            if index not in self._clients:
                self._clients[index] = MemoryClient(settings=self.map.cells[index])
            return self._clients[index]

    def client_for(self, user_id: str) -> MemoryClient:
        return self.cell(self.cell_of(user_id))

    def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[Receipt]:
        """One cell's batch, all or nothing: items of users of two cells are refused before any is queued
        (group them by ``cell_of`` and send one batch per cell)."""
        items = list(items)
        first: int | None = None
        for i, item in enumerate(items):
            user_id = item.get("user_id") if isinstance(item, Mapping) else None
            try:
                cell = self.cell_of(user_id)  # type: ignore[arg-type]
            except InvalidInputError as exc:
                raise InvalidInputError(f"items[{i}].user_id", exc.problem) from None
            if first is None:
                first = cell
            elif cell != first:
                raise InvalidInputError(
                    f"items[{i}].user_id", f"is in cell {cell}, items[0]'s in cell {first}: one batch per cell"
                )
        return [] if first is None else self.cell(first).enqueue_many(items)

    def wait(self, receipts: Sequence[Receipt] | Receipt, timeout: float = 60.0) -> WaitResult:
        """Fanned out: each cell waits for its users' messages, all within one deadline. Every cell is waited
        on even when one runs out of time; then ``WaitTimeoutError`` names the cells still pending."""
        items = [receipts] if isinstance(receipts, Receipt) else list(receipts)
        by_cell: dict[int, list[Receipt]] = {}
        for receipt in items:
            by_cell.setdefault(self.cell_of(receipt.user_id), []).append(receipt)
        deadline = time.monotonic() + timeout
        merged, late = WaitResult(), []
        for index, group in sorted(by_cell.items()):
            try:
                part = self.cell(index).wait(group, timeout=max(0.0, deadline - time.monotonic()))
            except WaitTimeoutError as exc:
                late.append(f"cell {index}: {exc}")
                continue
            merged.applied += part.applied
            merged.dead_lettered += part.dead_lettered
        if late:
            raise WaitTimeoutError("; ".join(late))
        return merged

    def dead_letters(self, user_id: str) -> list[Any]:
        """One user's dead letters (every user's of a cell: ``cell(i).dead_letters()``)."""
        return self.client_for(user_id).dead_letters(user_id)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def __enter__(self) -> CellClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    for _name in PER_USER:
        locals()[_name] = _routed(_name)
    del _name
