"""The change feed: each user's last few committed writes in Redis, so a reader whose copies (FAISS index,
snapshot) are one or a few writes behind catches both up from Redis instead of the graph.

Why: a reader that recalls right after another host's write, before the writer's stamp signal arrived,
had to read what changed from the graph (``GraphStore.user_changes``) on the recall's path. On Neo4j that
one round trip is the cost: measured at 27-86 ms p50 on this loaded 2-core machine (a ``RETURN 1`` alone
45 ms), where a Redis read took 0.1-0.2 ms; on SQLite it is a local file read (~0.5 ms), hidden behind the
query's embedding.

How: the writer, right after its commit and under its lease, reads ``user_changes`` from its stamp before
(what every reader would otherwise read) and hands it, as one JSON entry (``FeedEntry``), to the script
that moves the published stamp (``publish_stamp``, ``keys.change_feed``): the entry is added with the stamp
in one atomic step, the feed cut to ``FEED_LENGTH`` entries and set to expire ``FEED_TTL_S`` after its
last one. A reader behind reads the entries after its version up to the stamp its recall read (one
command; the stamp with them in one transaction when it has none: ``read_feed``) and applies them as one
``UserChanges`` (``changes_of``), exactly what the graph read would have returned from that version.

Removals travel in the feed too: an entry lists the ids its write removed (``gone``: facts, chunks and
entities, the graph's removal records of that version), so a reader's FAISS copy drops their vectors and
its snapshot their records (``UserSnapshot.caught_up``) with no read of the graph.

Invariants:
- the graph stays the truth. An entry is what the graph returned after the commit; a reader uses the feed
  only when its entries chain without a gap from at or before its copy's version to the stamp read in the
  same transaction, in one lifetime; anything else (no feed, trimmed or expired, a write that added no
  entry, another lifetime, an entry that does not parse) falls back to ``user_changes``;
- forgotten means gone: a write that removed any record (a forget, decay's expired chunks, a dedup) deletes
  the feed's earlier entries in the same script that moves the stamp and adds its own (``scrub``), so an
  entry that still held a removed record or its vector is gone once the removal is published; the removal's
  own entry holds only the removed ids (the graph keeps them too, as removal records). A reader exactly one
  write behind a removal catches up from that entry; one farther behind reads the graph. A write that does
  not say what it changed (``changed=False`` maintenance), that starts a lifetime, or whose removal the read
  cannot list scrubs with no entry; ``forget_user`` deletes the feed with the user's keys;
- in a chain of entries, an id an entry removes is dropped from every earlier entry's records and vectors
  (``changes_of``): the changes never hold a record the chain's end no longer holds;
- an entry above ``FEED_ENTRY_MAX_BYTES`` is not added (the chain breaks: readers read the graph), nor one
  whose read is not exactly at the write's stamp.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from engram_api import keys
from engram_api.models import ChunkRecord, FactRecord
from engram_api.storage.faiss.sync import UserChanges, VectorChanges
from engram_api.versions import Stamp

if TYPE_CHECKING:
    import redis

    from engram_api.storage.faiss.index import Kind

__all__ = [
    "FEED_ENTRY_MAX_BYTES",
    "FEED_LENGTH",
    "FEED_TTL_S",
    "FeedEntry",
    "changes_of",
    "entry_of",
    "read_feed",
    "vectors_from_feed",
]

log = logging.getLogger(__name__)

# Entries kept per user: a reader more writes behind than this reads the graph (a listening reader is
# caught up by the signals within one write or two; CATCH_UP_VERSIONS bounds a snapshot's refresh at 64).
FEED_LENGTH = 16
# The feed lives this long after its last write: it serves the recalls right after a write, not history.
FEED_TTL_S = 120.0
# A bigger write (a restore, a reconcile of many chunks) adds no entry: readers read the graph.
FEED_ENTRY_MAX_BYTES = 256 * 1024


class FeedEntry(BaseModel):
    """One committed write of a user as the graph returned it right after the commit (see the module
    docstring): stamps ``(epoch, since)`` -> ``(epoch, version)``, the user's catch-up horizon and last
    removal version, the vectors marked after ``since`` (id, kind, float32 bytes base64), the token states
    of those that carry them (``states``: id, packed bytes base64), the records, and the ids the write
    removed (``gone``, in id order; none in an entry of an older release)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epoch: int
    since: int
    version: int
    horizon: int
    removed: int
    vectors: list[tuple[str, Literal["fact", "entity", "episode"], str]]
    facts: list[FactRecord]
    chunks: list[ChunkRecord]
    gone: list[str] = []
    states: list[tuple[str, str]] = []


def entry_of(before: Stamp, after: Stamp, changes: UserChanges) -> tuple[str, bool]:
    """``(entry, scrub)`` for a write from ``before`` to ``after`` given ``changes``, the graph's
    ``user_changes(user, before.version)`` read right after the commit (or by the write's own statement):
    the entry ('' for none) and whether the feed's earlier entries must be deleted (the read shows a record
    removed since ``before``: the entry, when there is one, lists the removed ids). Its records are in
    (kind,) id order: a store returns them in no set order, and the read in the write's statement and one
    after the commit need not agree on it."""
    import numpy as np  # only a writer with Redis builds entries

    vectors = changes.vectors
    scrub = bool(vectors.removed) or changes.removed > before.version
    if scrub and not vectors.removed:
        return "", True  # a removal the read cannot list: no entry can stand for it
    if vectors.stamp != after or not vectors.settled or vectors.horizon is None or after.epoch != before.epoch:
        return "", scrub
    entry = FeedEntry(
        epoch=after.epoch, since=before.version, version=after.version, horizon=vectors.horizon,
        removed=changes.removed,
        vectors=[
            (node, kind, base64.b64encode(np.asarray(vec, dtype=np.float32).tobytes()).decode())
            for node, kind, vec in sorted(vectors.upserts, key=lambda u: (u[1], u[0]))
        ],
        facts=sorted(changes.facts, key=lambda f: f.id), chunks=sorted(changes.chunks, key=lambda c: c.id),
        gone=sorted(set(vectors.removed)),
        states=[(node, base64.b64encode(blob).decode()) for node, blob in sorted(vectors.states.items())],
    ).model_dump_json(exclude_defaults=False)  # fmt: skip
    return (entry, scrub) if len(entry) <= FEED_ENTRY_MAX_BYTES else ("", scrub)


def changes_of(raw: Sequence[str | bytes], since: int, stamp: Stamp) -> UserChanges | None:
    """The user's changes after version ``since`` up to ``stamp`` from the feed's entries after ``since``
    (in version order); None unless they chain from at or before ``since`` to exactly ``stamp`` in its
    lifetime (see the module docstring)."""
    import numpy as np

    try:
        entries = [FeedEntry.model_validate_json(r) for r in raw]
    except ValidationError:
        log.warning("change feed entry does not parse: reading the graph")
        return None
    if not entries or entries[0].since > since:
        return None
    at = entries[0].since
    for entry in entries:
        if entry.epoch != stamp.epoch or entry.since != at:
            return None
        at = entry.version
    if at != stamp.version:
        return None
    upserts: dict[str, tuple[str, Kind, Sequence[float]]] = {}
    states: dict[str, bytes] = {}
    facts: dict[str, FactRecord] = {}
    chunks: dict[str, ChunkRecord] = {}
    gone: dict[str, None] = {}
    for entry in entries:  # later entries hold the later state of a record written twice
        for node in entry.gone:  # removed by this write: no earlier entry's record or vector survives it
            upserts.pop(node, None)
            states.pop(node, None)
            facts.pop(node, None)
            chunks.pop(node, None)
            gone[node] = None
        upserts.update(
            (node, (node, kind, np.frombuffer(base64.b64decode(b64), dtype=np.float32)))
            for node, kind, b64 in entry.vectors
        )
        for node, _, _ in entry.vectors:  # a row upserted again holds the states of its latest write only
            states.pop(node, None)
        states.update((node, base64.b64decode(b64)) for node, b64 in entry.states)
        facts.update((f.id, f) for f in entry.facts)
        chunks.update((c.id, c) for c in entry.chunks)
    return UserChanges(
        vectors=VectorChanges(
            stamp=stamp,
            horizon=entries[-1].horizon,
            removed=tuple(gone),
            upserts=list(upserts.values()),
            states=states,
        ),
        removed=max(e.removed for e in entries),
        facts=list(facts.values()),
        chunks=list(chunks.values()),
    )


def read_feed(client: redis.Redis, user_id: str, since: int, upto: Stamp | None = None) -> UserChanges | None:
    """The feed's changes after ``since`` as ``changes_of``, None when they do not bring a copy at ``since``
    there: up to the published stamp, read with the entries in one transaction (they agree); with ``upto``
    (a stamp the caller read as published: a recall's, a writer's signal), up to it, by one command, the
    entries alone (no stamp, no transaction: ~0.06 ms of a reader's CPU less on a recall right after
    another host's write).

    Why one command suffices there: an entry is added in the script that publishes its version's stamp,
    so every entry up to a published ``upto`` was added before the read; one deleted since (a scrub, a
    trim, the key expired) leaves a gap, a ``forget_user`` the key gone or a new lifetime's epoch, and
    ``changes_of`` then answers None (the graph is read). An entry read is one no removal published before
    the read had scrubbed: what a transaction with the stamp would have returned at ``upto``."""
    if upto is not None:
        raw = client.zrangebyscore(keys.change_feed(user_id), f"({since}", upto.version)
        return changes_of(raw, since, upto) if raw else None
    with client.pipeline(transaction=True) as pipe:
        pipe.get(keys.user_version(user_id))
        pipe.zrangebyscore(keys.change_feed(user_id), f"({since}", "+inf")
        raw_stamp, raw = pipe.execute()
    if raw_stamp is None or not raw:
        return None
    return changes_of(raw, since, Stamp.parse(raw_stamp))


def vectors_from_feed(client: redis.Redis, user_id: str, since: int) -> VectorChanges | None:
    """The vectors' part of ``read_feed`` (what a writer's copy of the index needs); None also when Redis
    fails: the caller reads the graph."""
    import redis  # only with a client, so loaded already

    try:
        changes = read_feed(client, user_id, since)
    except redis.RedisError as exc:
        log.info("change feed of %s not read (%s): reading the graph", user_id, exc)
        return None
    return None if changes is None else changes.vectors
