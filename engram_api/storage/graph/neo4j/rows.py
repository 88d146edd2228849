"""Row shaping of the Neo4j backend (``neo4j_store``): model -> node properties and driver values -> model
input.

Invariants: datetimes are stored as aware UTC ``DateTime`` values (a naive one is refused: it would be
stored as a LocalDateTime that never compares with a DateTime) and come back as aware UTC ``datetime``;
the times of written nodes go in as [seconds, nanoseconds] since the epoch (``instant``) that the query
turns into DateTimes (``neo4j_episodes.FROM_INSTANT``), other time parameters as datetimes; nulls read
back are dropped so the models' defaults apply; node properties always carry the user they are written
for, never the record's own claim; an embedding goes in as a ``Vector`` (a list whose repr is short).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from neo4j import time as neo4j_time

from engram_api.models import ChunkRecord, EntityRecord, EpisodeRecord, FactRecord, check_aware
from engram_api.naming import normalize_name
from engram_api.storage.graph.episodes import user_key
from engram_api.storage.graph.neo4j.cypher import ENTITY_TIMES, EPISODE_TIMES, FACT_TIMES

__all__ = [
    "Vector",
    "chunk_props",
    "each_live_chunk",
    "each_live_fact",
    "entity_props",
    "entity_record",
    "episode_fields",
    "episode_record",
    "fact_props",
    "fact_record",
    "from_db",
    "instant",
    "live_chunks",
    "live_facts",
    "norms",
    "opt_utc",
    "utc",
    "vector",
]


class Vector(list[float]):
    """An embedding as a query parameter: packed as the list it is (both of the driver's packstream codecs,
    Python and Rust, take list subclasses: the same bytes), but shown as ``<vector of N>``. The driver
    formats every RUN's query and parameters for its DEBUG log before the logger checks its level (neo4j
    6.4, ``Bolt5x5.run``: ``" ".join(map(repr, fields))``); the repr of one 384-float list costs ~0.2 ms,
    and a message's apply writes several: 9 % of the apply worker's Python CPU in an ingest burst went
    there (py-spy, ``ops/bench/profile_ingest.py``). It also keeps vectors out of that log."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<vector of {len(self)}>"


def vector(values: Sequence[float] | None) -> Vector | None:
    return None if values is None else Vector(values)


def utc(value: datetime) -> datetime:
    # A naive datetime would be stored as a LocalDateTime, which never compares with a DateTime.
    return cast(datetime, check_aware(value))


def opt_utc(value: datetime | None) -> datetime | None:
    return check_aware(value)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def instant(value: datetime | None) -> list[int] | None:
    """An aware datetime as exact [seconds, nanoseconds] since the epoch, floored (before 1970 the seconds
    are negative, the nanoseconds never are); None stays None."""
    aware = check_aware(value)
    if aware is None:
        return None
    seconds, micro = divmod((aware - _EPOCH) // _MICROSECOND, 1_000_000)
    return [seconds, micro * 1000]


def from_db(row: dict[str, Any]) -> dict[str, Any]:
    """Driver values -> model input: temporal types become aware UTC datetimes; nulls are dropped
    so the model's defaults (empty aliases, no embedding, ...) apply."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if value is None:
            continue
        if isinstance(value, neo4j_time.DateTime):
            value = value.to_native().astimezone(UTC)
        out[key] = value
    return out


def episode_fields(row: dict[str, Any]) -> dict[str, Any]:
    """An episode node read back: its metadata is stored as JSON text (a map property holds no nesting)."""
    return {**row, "metadata": json.loads(row.get("metadata") or "{}")}


def entity_props(entity: EntityRecord, user_id: str) -> dict[str, Any]:
    return {
        "id": entity.id,
        "user_id": user_id,
        "name": entity.name,
        "norm_name": entity.norm_name,
        "label": entity.label,
        "aliases": list(dict.fromkeys(entity.aliases)),
        "summary": entity.summary,
        "embedding": vector(entity.embedding),
        "created_at": instant(entity.created_at),
        "updated_at": instant(entity.updated_at),
    }


def fact_props(fact: FactRecord, user_id: str, due: datetime | None) -> dict[str, Any]:
    """A new fact's properties; ``due``: its ``archive_due_at`` (``Fading.due``; None when never)."""
    return {
        "id": fact.id,
        "user_id": user_id,
        "subject_id": fact.subject_id,
        "predicate": fact.predicate,
        "object_id": fact.object_id,
        "statement": fact.statement,
        "memory_type": fact.memory_type,
        "importance": float(fact.importance),
        "strength": float(fact.strength),
        "single_valued": fact.single_valued,
        "valid_from": instant(fact.valid_from),
        "valid_until": instant(fact.valid_until),
        "superseded_by": fact.superseded_by,
        "archived": fact.archived,
        "last_decay_at": instant(fact.last_decay_at),
        "archive_due_at": instant(due),
        "embedding": vector(fact.embedding),
        "token_states": fact.token_states,
        "ukey": user_key(user_id),
        "created_at": instant(fact.created_at),
        "updated_at": instant(fact.updated_at),
    }


def norms(names: Sequence[str]) -> list[str]:
    """Distinct, non-empty normalized forms, in first-seen order."""
    return list(dict.fromkeys(n for n in (normalize_name(a) for a in names) if n))


_CHUNK_ROW_TIMES = ("event_time", "created_at", "updated_at")  # read back (CHUNK_ROW); written: CHUNK_TIMES


def _with_times(row: dict[str, Any], times: Sequence[str]) -> dict[str, Any]:
    """``row`` with its ``times`` (epoch microseconds, ``neo4j_episodes.MICROS``) as aware datetimes."""
    return {**row, **{t: _EPOCH + timedelta(microseconds=row[t]) for t in times if row.get(t) is not None}}


def fact_record(row: dict[str, Any]) -> FactRecord:
    """A fact row of ``cypher.schema.FACT``: its times come as epoch microseconds."""
    return FactRecord.model_validate(_with_times(from_db(row), FACT_TIMES))


def entity_record(row: dict[str, Any]) -> EntityRecord:
    """An entity row of ``cypher.schema.ENTITY`` or ``ENTITY_EMB``: its times come as epoch microseconds."""
    return EntityRecord.model_validate(_with_times(from_db(row), ENTITY_TIMES))


def episode_record(row: dict[str, Any]) -> EpisodeRecord:
    """An episode row of ``cypher.schema.EPISODE``: its times come as epoch microseconds."""
    return EpisodeRecord.model_validate(episode_fields(_with_times(from_db(row), EPISODE_TIMES)))


def live_facts(rows: Iterable[dict[str, Any]]) -> list[FactRecord]:
    """Fact rows minus those a concurrent forget deleted mid-read (see ``live_chunks``)."""
    return list(each_live_fact(rows))


def each_live_fact(rows: Iterable[dict[str, Any]]) -> Iterator[FactRecord]:
    """``live_facts``, one at a time as ``rows`` are read (a snapshot's whole load holds no list of them)."""
    return (fact_record(r) for r in rows if r.get("statement") is not None)


def live_chunks(rows: Iterable[dict[str, Any]]) -> list[ChunkRecord]:
    """Chunk rows minus those a concurrent forget deleted mid-read: under read committed, a node matched
    before another transaction's delete committed reads back with null properties. Their times come as
    epoch microseconds (``neo4j_episodes.CHUNK_ROW``)."""
    return list(each_live_chunk(rows))


def each_live_chunk(rows: Iterable[dict[str, Any]]) -> Iterator[ChunkRecord]:
    """``live_chunks``, one at a time as ``rows`` are read."""
    return (ChunkRecord.model_validate(_with_times(r, _CHUNK_ROW_TIMES)) for r in rows if r.get("text") is not None)


def chunk_props(c: ChunkRecord, user_id: str, episode_id: str, context: str | None) -> dict[str, Any]:
    """A chunk's node properties: ``body`` (speaker and words) and ``ukey`` feed the keyword index;
    ``embedded_with`` is the policy its vector was made with (``WritePlan.chunk_context``; absent: not known)."""
    return {
        "id": c.id,
        "user_id": user_id,
        "ukey": user_key(user_id),
        "episode_id": episode_id,
        "seq": c.seq,
        "text": c.text,
        "body": c.indexed_text,
        "speaker": c.speaker,
        "role": c.role,
        "event_time": instant(c.event_time),
        "embedding": vector(c.embedding),
        "token_states": c.token_states,
        "created_at": instant(c.created_at),
        "embedded_with": context,
    }
