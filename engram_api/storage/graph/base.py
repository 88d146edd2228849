"""What every graph store shares whatever its role: lifecycle, the write fence, batching, and the input
policy of the contract's methods (``guarded``), written once for every backend.

Invariants:
- the fence is per store instance and per thread: inside ``fenced(user_id, stamp, epoch)`` every write
  transaction this thread runs through THIS store first checks (under the user's row/node lock) that the
  user's stamp is still the fence's, else raises ``StaleWriteError`` and writes nothing; after commit the
  fence follows the new stamp. Another store object (another database, or a test's second handle) is not
  fenced by it. ``engram_api.storage.writer.userwrite`` is the one production caller;
- a contract method declared with ``@guarded(...)`` runs every backend's implementation behind the same
  rules (``StoreBase.__init_subclass__`` wraps each override): sizes below 0 and other users' records
  raise ``InvalidInputError`` naming the field before any query, ids reach the backend once each (first
  seen order, as lists), and a request that asks for nothing is answered without calling the backend.
"""

from __future__ import annotations

import inspect
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar

from engram_api.errors import InvalidInputError, StaleWriteError
from engram_api.models import FactRecord, Record
from engram_api.storage.faiss.sync import UserChanges
from engram_api.storage.graph.fading import Fading
from engram_api.versions import ABSENT, Stamp, new_epoch

__all__ = ["Fence", "Link", "Rule", "StoreBase", "count", "distinct", "guarded", "linked", "owned"]

_H = TypeVar("_H", bound=Hashable)
_F = TypeVar("_F", bound=Callable[..., Any])
# A provenance or membership link as a backend reads it: (owner id, "fact" | "entity", node id).
Link = tuple[str, str, str]
# A rule of ``guarded``: checks and normalizes a call's arguments (by name) in place; False when the call
# asks for nothing.
Rule = Callable[[dict[str, Any]], bool]


@dataclass(slots=True)
class Fence:
    """What the next write of ``user_id`` in this thread must find: ``expected``; a write that creates
    the user (``expected`` is ``ABSENT``) creates it with ``epoch``.

    ``changes_since``: set by a writer that will read the user's changes after that version once it has
    written (the change feed's entry, ``UserWrite.finish``); a store that can read them inside its write
    statement at no extra round trip (Neo4j's ``apply``) leaves them in ``changes``, exactly what
    ``user_changes(user_id, changes_since)`` returns after the commit (the user is locked meanwhile). A
    batched block that rolls back clears ``changes``; a reader of it checks its stamp is the committed one."""

    user_id: str
    expected: Stamp
    epoch: int
    changes_since: int | None = None
    changes: UserChanges | None = None

    def check_before(self, found: Stamp) -> None:
        if found != self.expected:
            raise StaleWriteError(self.user_id, self.expected, found)

    def check_after(self, found: Stamp) -> None:
        # A store cannot lock a user that does not exist yet: two writers may both see ABSENT. Each
        # creates with its own epoch, so the one that finds another epoch after its write lost the race.
        if self.expected == ABSENT and found != ABSENT and found.epoch != self.epoch:
            raise StaleWriteError(self.user_id, self.expected, found)


def distinct(*names: str) -> Rule:
    """Each named sequence as a list of its values once each, first seen first; asks for something when
    any of them is non-empty."""

    def rule(args: dict[str, Any]) -> bool:
        for name in names:
            args[name] = dedupe(args[name])
        return any(args[name] for name in names)

    return rule


def count(name: str, *, zero_asks: bool = False) -> Rule:
    """A size asked for (a limit, a window, hops): a negative one is refused; 0 asks for nothing unless
    ``zero_asks`` (a version to read changes after, say)."""

    def rule(args: dict[str, Any]) -> bool:
        return bool(check_count(name, args[name])) or zero_asks

    return rule


def owned(name: str, *, drop: bool = False) -> Rule:
    """Every record of ``name`` must be the call's ``user_id``'s (a store never writes one user's record
    under another): another user's raise, or are left out when ``drop``; asks when any remain (always
    when not ``drop``: an empty replacement is a replacement)."""

    def rule(args: dict[str, Any]) -> bool:
        user_id, records = args["user_id"], list(args[name])
        if drop:
            args[name] = [r for r in records if r.user_id == user_id]
            return bool(args[name])
        check_owned(name, user_id, records)
        args[name] = records
        return True

    return rule


def guarded(*rules: Rule, nothing: Callable[[], Any] = list) -> Callable[[_F], _F]:
    """Declare a contract method's input policy: every backend's implementation of it runs behind
    ``rules`` (in order; each may refuse, normalize, or say the call asks for nothing), and a call that
    asks for nothing returns ``nothing()`` without reaching the backend."""

    def declare(method: _F) -> _F:
        method.__guard__ = (inspect.signature(method), rules, nothing)  # type: ignore[attr-defined]
        return method

    return declare


def _behind(guard: tuple[inspect.Signature, tuple[Rule, ...], Callable[[], Any]], impl: _F) -> _F:
    signature, rules, nothing = guard

    @wraps(impl)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        asks = [rule(bound.arguments) for rule in rules]  # every rule runs: each may refuse its input
        return impl(*bound.args, **bound.kwargs) if all(asks) else nothing()

    call.__guard__ = guard  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


class StoreBase(ABC):
    """Lifecycle, the per-instance write fence and batching; applies ``guarded`` declarations to every
    backend's implementations (see the module docstring)."""

    def __init__(self, fading: Fading | None = None) -> None:
        self._fences = threading.local()  # .fence: this thread's fence on this store
        # The decay policy every strength write computes ``archive_due_at`` with (``fading``); the
        # settings' (``open_graph_store``), the defaults when None.
        self.fading = fading or Fading()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, impl in list(vars(cls).items()):
            if not callable(impl) or getattr(impl, "__isabstractmethod__", False) or hasattr(impl, "__guard__"):
                continue
            declared = next((vars(b)[name] for b in cls.__mro__[1:] if name in vars(b)), None)
            guard = getattr(declared, "__guard__", None)
            if guard is not None:
                setattr(cls, name, _behind(guard, impl))

    def _fact_due(self, fact: FactRecord) -> datetime | None:
        """A stored fact's ``archive_due_at``: none when archived, else when its strength, measured at its
        reference instant (``last_decay_at``, else ``created_at``), fades below the threshold."""
        return None if fact.archived else self.fading.due(fact.strength, fact.last_decay_at or fact.created_at)

    # ----------------------------------------------------------------------------------- lifecycle
    @abstractmethod
    def ensure_schema(self) -> None:
        """Create constraints / tables / indexes if missing (idempotent)."""

    @abstractmethod
    def ping(self) -> None:
        """Raise ``StoreUnavailableError`` when the backend cannot answer."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def user_stamp(self, user_id: str) -> Stamp:
        """(epoch, version); ``ABSENT`` for a user the store does not hold."""

    def user_version(self, user_id: str) -> int:
        """0 for a user the store has never seen."""
        return self.user_stamp(user_id).version

    # ------------------------------------------------------------------------------------ fencing
    @contextmanager
    def fenced(self, user_id: str, expected: Stamp, epoch: int) -> Iterator[Fence]:
        """Fence this thread's writes of ``user_id`` through this store (see the module docstring)."""
        fence, previous = Fence(user_id, expected, epoch), getattr(self._fences, "fence", None)
        self._fences.fence = fence
        try:
            yield fence
        finally:
            self._fences.fence = previous

    def _fence(self) -> Fence | None:
        """The fence the backends' write transactions enforce, if this thread is inside one."""
        return getattr(self._fences, "fence", None)

    @contextmanager
    def batched(self) -> Iterator[bool]:
        """Run this thread's reads and writes inside the block in one transaction where that is cheaper
        and holds no store-wide lock (yields True): reads see the block's own writes, and everything
        commits when the block ends or nothing does (an error in the block, or at commit, rolls it all
        back and puts the fence back where the block found it). By default every write commits on its own
        (yields False): SQLite's write lock is the whole database's, and holding it while a batch is
        planned would stall every other writer."""
        yield False

    def _creation_epoch(self) -> int:
        fence = self._fence()
        return fence.epoch if fence is not None else new_epoch()


def dedupe(values: Iterable[_H]) -> list[_H]:
    """Each value once, in first-seen order: backends get no duplicate ids, names or terms."""
    return list(dict.fromkeys(values))


def check_count(field: str, value: int) -> int:
    """A size asked for: a negative one is refused."""
    if value < 0:
        raise InvalidInputError(field, f"must be >= 0 (got {value})")
    return value


def check_owned(field: str, user_id: str, records: Iterable[Record]) -> None:
    """Every record must be ``user_id``'s: a store never writes one user's record under another."""
    strangers = sorted({r.id for r in records if r.user_id != user_id})
    if strangers:
        raise InvalidInputError(field, f"records of another user than {user_id!r}: {strangers}")


def linked(rows: list[dict[str, Any]], links: list[Link], facts: str, entities: str) -> list[dict[str, Any]]:
    """Each row with the node ids its links name, each once and sorted, under ``facts`` and ``entities``."""
    by_owner: dict[tuple[str, str], set[str]] = {}
    for owner, kind, node_id in links:
        by_owner.setdefault((owner, kind), set()).add(node_id)
    return [
        {
            **row,
            facts: sorted(by_owner.get((row["id"], "fact"), ())),
            entities: sorted(by_owner.get((row["id"], "entity"), ())),
        }
        for row in rows
    ]
