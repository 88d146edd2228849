"""What each message did to an entity, so that forgetting the message undoes it (SQLite side).

An entity outlives the message that created or changed it when other messages mention it; the aliases and
the summary that message brought must not. Every apply records one ``entity_edits`` row per entity it
created or changed: the aliases it added, the summary it set and the summary it replaced. Forgetting the
message (``revert_edits``, in the forget's transaction, before the episode row goes):

- removes the aliases it added (an alias said again later by another message, which added nothing new
  then, goes too: forgetting errs on the side of forgetting);
- puts back the summary it replaced when its own is still the current one, and in every later edit of the
  entity that recorded its summary as the one replaced, so no later forget brings the text back;
- its edit rows go with the episode (foreign key, ON DELETE CASCADE).

Entities written before this table existed have no rows: their aliases and summary are left as they are.
Topic clusters holding a forgotten fact or entity are dropped (``drop_clusters``): their summaries quote
member facts, and the next hierarchy run rebuilds them from what is left.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from engram_api.models import utcnow
from engram_api.storage.graph.forgetting import revert_edit
from engram_api.storage.graph.sqlite import rows as db

__all__ = ["SCHEMA", "drop_clusters", "record_edit", "revert_edits"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS entity_edits (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id    TEXT NOT NULL,
    entity_id  TEXT NOT NULL,
    episode_id TEXT NOT NULL,
    aliases    TEXT NOT NULL,  -- JSON list: the aliases this message added
    summary    TEXT,           -- the summary it set (NULL: none)
    replaced   TEXT,           -- the summary that was current before it
    FOREIGN KEY (user_id, episode_id) REFERENCES episodes (user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS ix_entity_edits_user_episode ON entity_edits (user_id, episode_id);
CREATE INDEX IF NOT EXISTS ix_entity_edits_user_entity ON entity_edits (user_id, entity_id);
"""


def record_edit(
    conn: sqlite3.Connection,
    user_id: str,
    entity_id: str,
    episode_id: str,
    aliases: Sequence[str],
    summary: str | None,
    replaced: str | None,
) -> None:
    """One message's edit of an entity (none when it added no alias and set no summary)."""
    if not aliases and summary is None:
        return
    conn.execute(
        "INSERT INTO entity_edits (user_id, entity_id, episode_id, aliases, summary, replaced)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (user_id, entity_id, episode_id, json.dumps(list(aliases)), summary, replaced),
    )


def revert_edits(conn: sqlite3.Connection, user_id: str, episode_id: str) -> list[str]:
    """Undo the episode's entity edits, newest first (see the module docstring); the entities changed."""
    rows = conn.execute(
        """SELECT x.entity_id, x.aliases AS added, x.summary AS summary_set, x.replaced, e.aliases, e.summary
             FROM entity_edits x JOIN entities e ON e.user_id = x.user_id AND e.id = x.entity_id
            WHERE x.user_id = ? AND x.episode_id = ? ORDER BY x.seq DESC""",
        (user_id, episode_id),
    ).fetchall()
    for row in rows:
        revert = revert_edit(
            row["entity_id"],
            added=json.loads(row["added"]),
            summary_set=row["summary_set"],
            replaced=row["replaced"],
            aliases=json.loads(row["aliases"]),
            summary=row["summary"],
        )
        params = {"user_id": user_id, "id": revert.entity_id}
        conn.execute(
            "UPDATE entities SET aliases = :aliases, summary = :summary, updated_at = :now"
            " WHERE user_id = :user_id AND id = :id",
            {**params, "aliases": json.dumps(revert.aliases), "summary": revert.summary, "now": db.to_us(utcnow())},
        )
        conn.execute(
            "DELETE FROM entity_aliases WHERE user_id = :user_id AND entity_id = :id"
            " AND norm_alias IN (SELECT value FROM json_each(:norms))",
            {**params, "norms": db.json_ids(revert.drop_norms)},
        )
        if revert.summary_set is not None:
            conn.execute(
                "UPDATE entity_edits SET replaced = :replaced WHERE user_id = :user_id AND entity_id = :id"
                " AND replaced = :set AND episode_id <> :episode_id",
                {**params, "replaced": revert.replaced, "set": revert.summary_set, "episode_id": episode_id},
            )
    return sorted({row["entity_id"] for row in rows})


def drop_clusters(conn: sqlite3.Connection, user_id: str, member_ids: Sequence[str]) -> None:
    """Drop the user's topic clusters with any of ``member_ids`` among their members (memberships cascade)."""
    conn.execute(
        "DELETE FROM clusters WHERE user_id = ? AND id IN (SELECT cluster_id FROM cluster_members"
        " WHERE user_id = ? AND member_id IN (SELECT value FROM json_each(?)))",
        (user_id, user_id, db.json_ids(member_ids)),
    )
