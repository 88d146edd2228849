"""A snapshot's facts and chunks held as rows (tuples of their field values), built into their models only
when read.

Why: a pydantic model costs ~1.5 KB of its own (its ``__dict__``, its set of fields set) beyond its values
(a ``FactRecord`` as read from a store: ~2.1 KB, tracemalloc), so a snapshot of a 100K-fact user held as
models took ~370 MB and readers held no user above 20K records (issue 14: the 100K-fact user's graph step
and keyword search stayed in the store, 5-6x the floor). A row is one tuple; the strings many records
repeat (owner, entity ids and names, predicates, episode ids, speakers) are interned, so one copy serves
every record and every snapshot after a refresh (a fact with its keyword entry: ~0.8 KB). The walk
(``UserSnapshot.graph_step``) and the keyword filters read the fields they need from the rows by position
(``SUBJECT``, ``EVENT_TIME``, ...); only the records a recall returns are built (~5 us a fact; a recall
of the 100K-fact user builds ~110, ~0.5 ms). Keeping the models built was tried twice: four in five of
the 100K-fact user's were new to the next recall, and for a 2K-fact user recall against its floor did not
move (1.47-1.48x kept, 1.48-1.51x built on every read; ops/bench/recall_ab.py, docs/benchmarks.md).

Invariants: a row holds its model's fields in their declared order, lists as tuples; ``RecordRows`` is
immutable (``with_records`` returns a new one), as its snapshot is; each read builds a new model.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from engram_api.models import ChunkRecord, FactRecord, Record

__all__ = [
    "ARCHIVED",
    "CHUNK_FACTS",
    "CHUNK_ROWS",
    "EPISODE",
    "EVENT_TIME",
    "FACT_ROWS",
    "IMPORTANCE",
    "OBJECT",
    "STATEMENT",
    "SUBJECT",
    "VALID_FROM",
    "VALID_UNTIL",
    "RecordRows",
    "Row",
    "RowShape",
    "conversation_order",
    "valid_at",
]

Row = tuple[Any, ...]
M = TypeVar("M", bound=Record)


@dataclass(frozen=True, slots=True)
class RowShape(Generic[M]):
    """How one model is held as a row: its fields in order, those interned, those that are lists."""

    model: type[M]
    fields: tuple[str, ...]
    shared: frozenset[int]
    lists: frozenset[int]

    @classmethod
    def of(cls, model: type[M], shared: Iterable[str]) -> RowShape[M]:
        fields = tuple(model.model_fields)
        lists = (
            i for i, n in enumerate(fields) if getattr(model.model_fields[n].annotation, "__origin__", None) is list
        )
        return cls(model, fields, frozenset(fields.index(n) for n in shared), frozenset(lists))

    def at(self, name: str) -> int:
        return self.fields.index(name)

    def row(self, record: M) -> Row:
        values = record.__dict__
        row: list[Any] = []
        for i, name in enumerate(self.fields):
            value = values[name]
            if value and i in self.shared:
                value = sys.intern(value)
            elif i in self.lists:
                value = tuple(value)
            row.append(value)
        return tuple(row)

    def record(self, row: Row) -> M:
        # Validated again: pydantic-core's validation of these values (3.1 us a fact) is faster than
        # ``model_construct`` (6.5 us), and a tuple comes back as the field's list.
        return self.model.model_validate(dict(zip(self.fields, row, strict=True)))


FACT_ROWS = RowShape.of(
    FactRecord, ("user_id", "subject_id", "subject_name", "predicate", "object_id", "object_name", "memory_type")
)
CHUNK_ROWS = RowShape.of(ChunkRecord, ("user_id", "episode_id", "speaker", "role"))
SUBJECT, OBJECT, IMPORTANCE = FACT_ROWS.at("subject_id"), FACT_ROWS.at("object_id"), FACT_ROWS.at("importance")
VALID_FROM, VALID_UNTIL, ARCHIVED = FACT_ROWS.at("valid_from"), FACT_ROWS.at("valid_until"), FACT_ROWS.at("archived")
EVENT_TIME, CHUNK_FACTS = CHUNK_ROWS.at("event_time"), CHUNK_ROWS.at("fact_ids")
EPISODE, _SEQ = CHUNK_ROWS.at("episode_id"), CHUNK_ROWS.at("seq")
STATEMENT = FACT_ROWS.at("statement")


def valid_at(fact: Row, as_of: datetime | None) -> bool:
    """Not archived, and valid at ``as_of`` (current when None): what the stores' walk and keyword search
    keep (``VALID_AT`` in neo4j_cypher, ``FACT_VALID_AT`` in sqlite_episodes)."""
    if fact[ARCHIVED]:
        return False
    until = fact[VALID_UNTIL]
    if as_of is None:
        return until is None
    return fact[VALID_FROM] <= as_of and (until is None or as_of < until)


def conversation_order(chunk: Row) -> tuple[datetime, str, int]:
    """``ChunkRecord.conversation_order`` of a held chunk."""
    return chunk[EVENT_TIME], chunk[EPISODE], chunk[_SEQ]


class RecordRows(Mapping[str, M]):
    """Records by id, held as rows of ``shape``; reading one builds its model, ``rows`` reads them as held."""

    __slots__ = ("_rows", "shape")

    def __init__(self, shape: RowShape[M], rows: dict[str, Row]) -> None:
        self.shape = shape
        self._rows = rows

    @classmethod
    def of(cls, shape: RowShape[M], records: Iterable[M]) -> RecordRows[M]:
        return cls(shape, {r.id: shape.row(r) for r in records})

    def with_records(self, records: Iterable[M]) -> RecordRows[M]:
        """These rows with those of ``records`` added or in their place."""
        return RecordRows(self.shape, {**self._rows, **{r.id: self.shape.row(r) for r in records}})

    def rows(self) -> Mapping[str, Row]:
        """The rows by id, as held (the walk reads them by position)."""
        return self._rows

    def __getitem__(self, record_id: str) -> M:
        return self.shape.record(self._rows[record_id])

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)
