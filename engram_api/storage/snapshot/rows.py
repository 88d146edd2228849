"""A snapshot's facts and chunks held as rows: plain tuples of their models' fields, read by position by
the walk and the keyword filters (``SUBJECT``, ``EVENT_TIME``, ...), and by name through views made on
reading (``FactView``, ``ChunkView``) by recall.

Why rows: a pydantic model costs ~1.5 KB of its own (its ``__dict__``, its set of fields set) beyond its values
(a ``FactRecord`` as read from a store: ~2.1 KB, tracemalloc), so a snapshot of a 100K-fact user held as
models took ~370 MB and readers held no user above 20K records (issue 14: the 100K-fact user's graph step
and keyword search stayed in the store, 5-6x the floor). A row is one tuple; the strings many records repeat
(owner, entity ids and names, predicates, episode ids, speakers) are interned, so one copy serves every
record and every snapshot after a refresh (a fact with its keyword entry: ~0.8 KB).

Why plain tuples, not the views: CPython's collector stops tracking a tuple that holds only untracked values
(strings, numbers, datetimes, None, tuples of those) the first time it examines it, where an instance of a tuple
subclass (a named tuple) is tracked for life. Held as named tuples, every row of every held snapshot was
walked by each full collection (23 ms with a 10K-fact snapshot held, 118 ms with a 100K one, on a reader
thread's pause or a recall's); held as plain tuples they cost it nothing. A view is made only for the records a
recall reads by name (``RecordRows.views``, ``__getitem__``: ~0.1 us each, ~100-200 a recall), so no model
is built for a recall at all (building the models a recall read cost small users ~8 % of a recall against
their floor, docs/benchmarks/history.md "Stop 39").

Invariants: a row is a plain tuple holding its model's fields in their declared order, lists as tuples, and
nothing the collector tracks for good (``RowShape.row``); a view's methods and properties are its model's own
(``current_at``, ``conversation_order``, ``indexed_text``), borrowed, not copied; ``RecordRows`` is immutable
(``with_records`` returns a new one), as its snapshot is.
"""

from __future__ import annotations

import operator
import sys
from collections import namedtuple
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeAlias, TypeVar, get_args, get_origin

from engram_api.models import ChunkRecord, FactRecord, Record
from engram_api.storage.graph import validity

__all__ = [
    "ARCHIVED",
    "CHUNK_FACTS",
    "CHUNK_ROWS",
    "EPISODE",
    "EVENT_TIME",
    "FACT_ROWS",
    "IMPORTANCE",
    "OBJECT",
    "SOURCES",
    "STATEMENT",
    "SUBJECT",
    "VALID_FROM",
    "VALID_UNTIL",
    "AnyChunk",
    "AnyFact",
    "ChunkView",
    "FactView",
    "RecordRows",
    "Row",
    "RowShape",
    "conversation_order",
    "valid_at",
]

Row = tuple[Any, ...]
M = TypeVar("M", bound=Record)
V = TypeVar("V", bound=tuple[Any, ...])


class FactView(namedtuple("FactView", tuple(FactRecord.model_fields))):  # type: ignore[misc]
    """A held fact: ``FactRecord``'s fields by name and by position, read-only."""

    __slots__ = ()
    current_at = FactRecord.current_at


class ChunkView(namedtuple("ChunkView", tuple(ChunkRecord.model_fields))):  # type: ignore[misc]
    """A held episode chunk: ``ChunkRecord``'s fields by name and by position, read-only."""

    __slots__ = ()
    indexed_text = ChunkRecord.__dict__["indexed_text"]
    conversation_order = ChunkRecord.__dict__["conversation_order"]


# What recall reads: a record from a store or a cache, or a snapshot's view of one.
AnyFact: TypeAlias = FactRecord | FactView
AnyChunk: TypeAlias = ChunkRecord | ChunkView


@dataclass(frozen=True, slots=True)
class RowShape(Generic[M, V]):
    """How one model is held as a row (its ``view``): its fields in order, those interned, those that are
    lists."""

    model: type[M]
    view: type[V]
    fields: tuple[str, ...]
    shared: frozenset[int]
    lists: frozenset[int]

    @classmethod
    def of(cls, model: type[M], view: type[V], shared: Iterable[str]) -> RowShape[M, V]:
        fields = tuple(model.model_fields)
        if getattr(view, "_fields", None) != fields:
            raise TypeError(f"{view.__name__} does not hold {model.__name__}'s fields in their order")
        lists = (i for i, n in enumerate(fields) if _holds_list(model.model_fields[n].annotation))
        return cls(model, view, fields, frozenset(fields.index(n) for n in shared), frozenset(lists))

    def at(self, name: str) -> int:
        return self.fields.index(name)

    def row(self, record: M) -> Row:
        """``record`` as a row: a plain tuple (the module docstring says why not a view)."""
        values = record.__dict__
        row: list[Any] = []
        for i, name in enumerate(self.fields):
            value = values[name]
            if value and i in self.shared:
                value = sys.intern(value)
            elif i in self.lists and value is not None:
                value = tuple(value)
            row.append(value)
        return tuple(row)

    def viewed(self, row: Row) -> V:
        """``row`` read by name: its view (a copy of the tuple, ~0.1 us, dropped with the recall that read it)."""
        return tuple.__new__(self.view, row)

    def record(self, row: Row) -> M:
        # Validated again: pydantic-core's validation of these values (3.1 us a fact) is faster than
        # ``model_construct`` (6.5 us), and a tuple comes back as the field's list.
        return self.model.model_validate(dict(zip(self.fields, row, strict=True)))


def _holds_list(annotation: Any) -> bool:
    """``list[X]``, or ``list[X] | None``."""
    return get_origin(annotation) is list or any(get_origin(a) is list for a in get_args(annotation))


FACT_ROWS = RowShape.of(
    FactRecord,
    FactView,
    ("user_id", "subject_id", "subject_name", "predicate", "object_id", "object_name", "memory_type"),
)
CHUNK_ROWS = RowShape.of(ChunkRecord, ChunkView, ("user_id", "episode_id", "speaker", "role"))
SUBJECT, OBJECT, IMPORTANCE = FACT_ROWS.at("subject_id"), FACT_ROWS.at("object_id"), FACT_ROWS.at("importance")
VALID_FROM, VALID_UNTIL, ARCHIVED = FACT_ROWS.at("valid_from"), FACT_ROWS.at("valid_until"), FACT_ROWS.at("archived")
EVENT_TIME, CHUNK_FACTS = CHUNK_ROWS.at("event_time"), CHUNK_ROWS.at("fact_ids")
EPISODE = CHUNK_ROWS.at("episode_id")
STATEMENT, SOURCES = FACT_ROWS.at("statement"), FACT_ROWS.at("source_ids")
# A held chunk's ``ChunkRecord.conversation_order`` (event time, episode, seq), read by position.
conversation_order = operator.itemgetter(EVENT_TIME, EPISODE, CHUNK_ROWS.at("seq"))


def valid_at(fact: Row, at: datetime | None) -> bool:
    """``validity.valid_at`` of a held fact at ``at`` (current, at now, when None): what the stores' walk
    and keyword search keep."""
    return validity.valid_at(fact[VALID_FROM], fact[VALID_UNTIL], fact[ARCHIVED], validity.instant(at))


class RecordRows(Mapping[str, V], Generic[M, V]):
    """Records by id, held as rows of ``shape`` (plain tuples; ``shape.viewed`` reads one by name, and
    ``shape.record`` builds its model back): an immutable base, the rows written since (``recent``: new records
    and new versions of base ones) and the base's ids removed since (``gone``: hidden, never in ``recent``),
    which ``with_rows`` and ``without`` grow without copying the base and ``merged`` folds in (``overlay``'s
    policy). As a ``Mapping`` it gives views; ``rows`` gives the rows themselves, for reads by position."""

    __slots__ = ("_base", "_gone", "_recent", "_rows", "shape")

    def __init__(
        self,
        shape: RowShape[M, V],
        rows: dict[str, Row],
        recent: dict[str, Row] | None = None,
        gone: frozenset[str] = frozenset(),
    ) -> None:
        self.shape = shape
        self._base = rows
        self._recent = recent or {}
        self._gone = gone
        self._rows: Mapping[str, Row] = _Layered(self._recent, rows, gone) if self._recent or gone else rows

    @classmethod
    def of(cls, shape: RowShape[M, V], records: Iterable[M]) -> RecordRows[M, V]:
        return cls(shape, {r.id: shape.row(r) for r in records})

    def with_records(self, records: Iterable[M]) -> RecordRows[M, V]:
        """These rows with those of ``records`` added or in their place: only the recent rows are copied."""
        return self.with_rows({r.id: self.shape.row(r) for r in records})

    def with_rows(self, rows: Mapping[str, Row]) -> RecordRows[M, V]:
        """These rows with ``rows`` (views or rows, held as plain tuples) added or in their place: only the
        recent rows are copied."""
        fresh = {i: row if type(row) is tuple else tuple(row) for i, row in rows.items()}
        return RecordRows(self.shape, self._base, {**self._recent, **fresh}, self._gone - rows.keys())

    def without(self, ids: Collection[str]) -> RecordRows[M, V]:
        """These rows without those of ``ids``: a base's row is hidden (``gone``), only the recent rows are
        copied."""
        recent = {i: row for i, row in self._recent.items() if i not in ids}
        return RecordRows(self.shape, self._base, recent, self._gone | {i for i in ids if i in self._base})

    def merged(self) -> RecordRows[M, V]:
        """The same rows in one base (a copy of the base: the cost ``with_rows`` and ``without`` defer)."""
        if not self._recent and not self._gone:
            return self
        rows = {**self._base, **self._recent}
        for i in self._gone:
            del rows[i]
        return RecordRows(self.shape, rows)

    @property
    def gone(self) -> frozenset[str]:
        """The base's ids removed since the base."""
        return self._gone

    @property
    def recent(self) -> Mapping[str, Row]:
        """The rows added or replaced since the base."""
        return self._recent

    @property
    def base(self) -> Mapping[str, Row]:
        """The base's rows, a replaced one at its old version."""
        return self._base

    def rows(self) -> Mapping[str, Row]:
        """The rows by id, read by position: the plain dict when nothing is recent nor gone (the hot loops'
        lookups skip ``Mapping``'s)."""
        return self._rows

    def views(self, ids: Iterable[str]) -> dict[str, V]:
        """The views of the records among ``ids`` held (others absent), in ``ids``' order."""
        held, view, new = self._rows, self.shape.view, tuple.__new__
        return {i: new(view, row) for i in ids if (row := held.get(i)) is not None}

    def __getitem__(self, record_id: str) -> V:
        return self.shape.viewed(self._rows[record_id])

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


class _Layered(Mapping[str, Row]):
    """``recent`` over ``base`` without ``gone`` (base ids none of ``recent``): a recent row hides the base's
    row of its id, a gone id is not held."""

    __slots__ = ("_base", "_gone", "_len", "_recent")

    def __init__(self, recent: dict[str, Row], base: dict[str, Row], gone: frozenset[str]) -> None:
        self._recent, self._base, self._gone = recent, base, gone
        self._len = len(base) - len(gone) + sum(1 for i in recent if i not in base)

    def __getitem__(self, record_id: str) -> Row:
        row = self._recent.get(record_id)
        if row is None and record_id in self._gone:
            raise KeyError(record_id)
        return self._base[record_id] if row is None else row

    def get(self, record_id: str, default: Any = None) -> Any:
        row = self._recent.get(record_id)
        if row is None:
            return default if record_id in self._gone else self._base.get(record_id, default)
        return row

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._recent or (record_id in self._base and record_id not in self._gone)

    def __iter__(self) -> Iterator[str]:
        yield from (i for i in self._base if i not in self._gone) if self._gone else self._base
        yield from (i for i in self._recent if i not in self._base)

    def __len__(self) -> int:
        return self._len
