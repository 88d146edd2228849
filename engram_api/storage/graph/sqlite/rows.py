"""Row helpers of the embedded SQLite backend (``sqlite_store``): value encodings, row -> model, and
the statements one write transaction is built from.

Encodings: datetimes are INTEGER microseconds since the epoch (exact round trip; a naive datetime is
refused), embeddings float32 BLOBs, id lists one JSON parameter. Every helper takes the open
connection of the caller's transaction and filters on the user.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from engram_api.models import (
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    Usage,
    WritePlan,
    check_aware,
    utcnow,
)
from engram_api.naming import normalize_name
from engram_api.storage.faiss.sync import REMOVAL_RETAIN
from engram_api.versions import ABSENT, Stamp, new_epoch

__all__ = [
    "bump",
    "change_entity",
    "check_fact_entities",
    "chunk_ids",
    "delete_nodes",
    "entity_exists",
    "entity_row",
    "episode_exists",
    "episode_fields",
    "fact_fields",
    "fact_row",
    "from_blob",
    "from_us",
    "from_us_opt",
    "index_aliases",
    "insert_entity",
    "insert_episode",
    "insert_fact",
    "json_ids",
    "link_episode",
    "read_stamp",
    "read_version",
    "to_blob",
    "to_us",
    "to_us_opt",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_us(value: datetime) -> int:
    check_aware(value)  # a naive datetime would be read as local time: refuse it
    return (value - _EPOCH) // _MICROSECOND


def to_us_opt(value: datetime | None) -> int | None:
    return None if value is None else to_us(value)


def from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def from_us_opt(value: int | None) -> datetime | None:
    return None if value is None else from_us(value)


# numpy is imported by the two vector helpers, not with the module: counts and fact rows (`engram stats`,
# `engram history`) carry no vectors and must not pay for it.
def to_blob(vector: Sequence[float] | None) -> bytes | None:
    import numpy as np

    return None if vector is None else np.asarray(vector, dtype=np.float32).tobytes()


def from_blob(blob: bytes) -> list[float]:
    import numpy as np

    return np.frombuffer(blob, dtype=np.float32).astype(float).tolist()


def json_ids(values: Sequence[str]) -> str:
    return json.dumps(list(values))


def fact_fields(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "user_id": row["user_id"],
        "created_at": from_us(row["created_at"]),
        "updated_at": from_us(row["updated_at"]),
        "subject_id": row["subject_id"],
        "subject_name": row["subject_name"],
        "predicate": row["predicate"],
        "object_id": row["object_id"],
        "object_name": row["object_name"],
        "statement": row["statement"],
        "memory_type": row["memory_type"],
        "importance": row["importance"],
        "strength": row["strength"],
        "single_valued": bool(row["single_valued"]),
        "valid_from": from_us(row["valid_from"]),
        "valid_until": from_us_opt(row["valid_until"]),
        "superseded_by": row["superseded_by"],
        "archived": bool(row["archived"]),
        "last_decay_at": from_us_opt(row["last_decay_at"]),
        "source_ids": sorted(json.loads(row["source_ids"])),
    }


def episode_fields(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "user_id": row["user_id"],
        "content": row["content"],
        "role": row["role"],
        "event_time": from_us(row["event_time"]),
        "metadata": json.loads(row["metadata"]),
        "created_at": from_us(row["created_at"]),
        "updated_at": from_us(row["updated_at"]),
    }


def fact_row(row: sqlite3.Row) -> FactRecord:
    return FactRecord(**fact_fields(row))


def entity_row(row: sqlite3.Row) -> EntityRecord:
    return EntityRecord(
        id=row["id"],
        user_id=row["user_id"],
        created_at=from_us(row["created_at"]),
        updated_at=from_us(row["updated_at"]),
        name=row["name"],
        norm_name=row["norm_name"],
        label=row["label"],
        aliases=json.loads(row["aliases"]),
        summary=row["summary"],
        embedding=None if row["embedding"] is None else from_blob(row["embedding"]),
    )


def read_stamp(conn: sqlite3.Connection, user_id: str) -> Stamp:
    row = conn.execute("SELECT epoch, version FROM users WHERE user_id = ?", (user_id,)).fetchone()
    return ABSENT if row is None else Stamp(row["epoch"], row["version"])


def read_version(conn: sqlite3.Connection, user_id: str) -> int:
    return read_stamp(conn, user_id).version


def bump(
    conn: sqlite3.Connection,
    user_id: str,
    usage: Usage | None,
    epoch: int | None = None,
    *,
    facts: Sequence[str] = (),
    chunks: Sequence[str] = (),
    entities: Sequence[str] = (),
    removed: bool = False,
    gone: Sequence[str] = (),
) -> int:
    """Bump the version; creates the user (with ``epoch``, else a fresh one) when absent. Marks with the
    new version the ``facts``, ``chunks`` and ``entities`` the write created or changed, or the user when it
    ``removed`` any (``GraphStore.refresh_snapshot`` reads what a reader's snapshot lacks by these marks);
    the ids it deleted (``gone``) become removal rows of that version (``vectorsync``)."""
    usage = usage or Usage()
    now = to_us(utcnow())
    row = conn.execute(
        """INSERT INTO users (user_id, version, epoch, prompt_tokens, completion_tokens, cost_usd, llm_calls,
                              created_at, updated_at, vectors_from)
           VALUES (:user_id, 1, :epoch, :prompt, :completion, :cost, :calls, :now, :now, 0)
           ON CONFLICT (user_id) DO UPDATE SET
               vectors_from = COALESCE(vectors_from, version),
               version = version + 1,
               prompt_tokens = prompt_tokens + :prompt,
               completion_tokens = completion_tokens + :completion,
               cost_usd = cost_usd + :cost,
               llm_calls = llm_calls + :calls,
               updated_at = :now
           RETURNING version""",
        {
            "user_id": user_id,
            "epoch": new_epoch() if epoch is None else epoch,
            "prompt": usage.prompt_tokens,
            "completion": usage.completion_tokens,
            "cost": usage.cost_usd,
            "calls": usage.llm_calls,
            "now": now,
        },
    ).fetchone()
    version = int(row["version"])
    if removed:
        conn.execute("UPDATE users SET removed = version WHERE user_id = ?", (user_id,))
    if gone:
        _log_removals(conn, user_id, version, gone)
    for table, ids in (("facts", facts), ("chunks", chunks), ("entities", entities)):
        if ids:
            conn.execute(
                f"UPDATE {table} SET changed = ? WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))",
                (version, user_id, json.dumps(list(dict.fromkeys(ids)))),
            )
    return version


def _log_removals(conn: sqlite3.Connection, user_id: str, version: int, gone: Sequence[str]) -> None:
    """One removal row per deleted id at ``version``; rows older than ``REMOVAL_RETAIN`` versions go and the
    horizon follows them."""
    conn.executemany(
        "INSERT INTO removals (user_id, version, node_id) VALUES (?, ?, ?)",
        [(user_id, version, node_id) for node_id in dict.fromkeys(gone)],
    )
    floor = version - REMOVAL_RETAIN
    conn.execute("DELETE FROM removals WHERE user_id = ? AND version <= ?", (user_id, floor))
    conn.execute("UPDATE users SET vectors_from = MAX(vectors_from, ?) WHERE user_id = ?", (floor, user_id))


def episode_exists(conn: sqlite3.Connection, user_id: str, episode_id: str) -> bool:
    row = conn.execute("SELECT 1 FROM episodes WHERE user_id = ? AND id = ?", (user_id, episode_id)).fetchone()
    return row is not None


def entity_exists(conn: sqlite3.Connection, user_id: str, entity_id: str) -> bool:
    row = conn.execute("SELECT 1 FROM entities WHERE user_id = ? AND id = ?", (user_id, entity_id)).fetchone()
    return row is not None


def insert_episode(conn: sqlite3.Connection, episode: EpisodeRecord) -> None:
    conn.execute(
        "INSERT INTO episodes (user_id, id, content, role, event_time, metadata, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            episode.user_id,
            episode.id,
            episode.content,
            episode.role,
            to_us(episode.event_time),
            json.dumps(episode.metadata, sort_keys=True),
            to_us(episode.created_at),
            to_us(episode.updated_at),
        ),
    )


def insert_entity(conn: sqlite3.Connection, entity: EntityRecord) -> None:
    aliases = list(dict.fromkeys(entity.aliases))
    conn.execute(
        "INSERT INTO entities (id, user_id, name, norm_name, label, aliases, summary, embedding, created_at,"
        " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            entity.id,
            entity.user_id,
            entity.name,
            entity.norm_name,
            entity.label,
            json.dumps(aliases),
            entity.summary,
            to_blob(entity.embedding),
            to_us(entity.created_at),
            to_us(entity.updated_at),
        ),
    )
    index_aliases(conn, entity.user_id, entity.id, aliases)


def index_aliases(conn: sqlite3.Connection, user_id: str, entity_id: str, aliases: Sequence[str]) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO entity_aliases (entity_id, user_id, norm_alias) VALUES (?, ?, ?)",
        [(entity_id, user_id, normalize_name(a)) for a in aliases if normalize_name(a)],
    )


def change_entity(
    conn: sqlite3.Connection,
    user_id: str,
    entity_id: str,
    add_aliases: Sequence[str],
    summary: str | None,
    label: str | None,
) -> tuple[list[str], str] | None:
    """Apply one entity change; (the aliases it really added, the summary it replaced), None when the
    entity is gone."""
    row = conn.execute(
        "SELECT aliases, summary, label FROM entities WHERE user_id = ? AND id = ?", (user_id, entity_id)
    ).fetchone()
    if row is None:
        return None
    before = json.loads(row["aliases"])
    aliases = list(dict.fromkeys([*before, *add_aliases]))
    conn.execute(
        "UPDATE entities SET aliases = ?, summary = ?, label = ?, updated_at = ? WHERE user_id = ? AND id = ?",
        (
            json.dumps(aliases),
            row["summary"] if summary is None else summary,
            row["label"] if label is None else label,
            to_us(utcnow()),
            user_id,
            entity_id,
        ),
    )
    index_aliases(conn, user_id, entity_id, aliases)
    return aliases[len(before) :], row["summary"]


def check_fact_entities(conn: sqlite3.Connection, plan: WritePlan) -> None:
    new_ids = {e.id for e in plan.new_entities}
    for fact in plan.new_facts:
        for role, entity_id in (("subject", fact.subject_id), ("object", fact.object_id)):
            if entity_id is None or entity_id in new_ids:
                continue
            if not entity_exists(conn, plan.user_id, entity_id):
                raise ValueError(
                    f"fact {fact.id!r}: {role} entity {entity_id!r} is neither new in this plan "
                    f"nor stored for user {plan.user_id!r}"
                )


def insert_fact(conn: sqlite3.Connection, fact: FactRecord, due: datetime | None) -> None:
    """``due``: the fact's ``archive_due_at`` (``Fading.due``; None when archived or never due)."""
    conn.execute(
        """INSERT INTO facts (id, user_id, subject_id, predicate, object_id, statement, memory_type,
                              importance, strength, single_valued, valid_from, valid_until, superseded_by,
                              archived, last_decay_at, archive_due_at, embedding, created_at, updated_at,
                              token_states)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (
            fact.id,
            fact.user_id,
            fact.subject_id,
            fact.predicate,
            fact.object_id,
            fact.statement,
            fact.memory_type,
            fact.importance,
            fact.strength,
            int(fact.single_valued),
            to_us(fact.valid_from),
            to_us_opt(fact.valid_until),
            fact.superseded_by,
            int(fact.archived),
            to_us_opt(fact.last_decay_at),
            to_us_opt(due),
            to_blob(fact.embedding),
            to_us(fact.created_at),
            to_us(fact.updated_at),
            fact.token_states,
        ),
    )
    edges = [(fact.id, fact.subject_id, "subject", fact.user_id)]
    if fact.object_id is not None:
        edges.append((fact.id, fact.object_id, "object", fact.user_id))
    conn.executemany("INSERT INTO mentions (fact_id, entity_id, role, user_id) VALUES (?, ?, ?, ?)", edges)


def link_episode(conn: sqlite3.Connection, user_id: str, node_id: str, kind: str, episode_id: str) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO provenance (node_id, node_kind, episode_id, user_id) VALUES (?, ?, ?, ?)",
        (node_id, kind, episode_id, user_id),
    )


def delete_nodes(conn: sqlite3.Connection, user_id: str, table: str, node_ids: Sequence[str]) -> None:
    """Delete facts or entities (``table``, a constant) with their FROM links and cluster memberships
    (a fact's mentions cascade)."""
    ids = json_ids(node_ids)
    for statement in (
        "DELETE FROM provenance WHERE user_id = ? AND node_id IN (SELECT value FROM json_each(?))",
        "DELETE FROM cluster_members WHERE user_id = ? AND member_id IN (SELECT value FROM json_each(?))",
        f"DELETE FROM {table} WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))",
    ):
        conn.execute(statement, (user_id, ids))


def chunk_ids(conn: sqlite3.Connection, user_id: str, episode_ids: Sequence[str] | None) -> list[str]:
    """The chunk ids of some episodes (of all of them when None)."""
    rows = conn.execute(
        """SELECT id FROM chunks WHERE user_id = :user_id
            AND (:episodes IS NULL OR episode_id IN (SELECT value FROM json_each(:episodes))) ORDER BY id""",
        {"user_id": user_id, "episodes": None if episode_ids is None else json_ids(episode_ids)},
    ).fetchall()
    return [r[0] for r in rows]
