"""The consolidation world: the real embedded SQLite store (counting its reads), the real MiniLM, a FAISS
index and Redis stamps, and ``say`` to apply one model answer the way the apply stage does.

A fixture module: a test module brings ``world`` in with ``from tests.support.consolidation import world``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from engram_api import keys
from engram_api.models import Envelope, Extraction, WritePlan
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import get_embedder
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.sqlite.store import SqliteGraphStore
from engram_api.storage.writer.userwrite import UserWrites
from engram_api.versions import read_stamp
from engram_workers.middleware import build_hooks
from tests.support.memory import apply_message

T0 = datetime(2024, 1, 1, tzinfo=UTC)


class CountingStore(SqliteGraphStore):
    """The real embedded store, counting the reads consolidation makes (its store round trips)."""

    READS = ("find_entities", "get_entities", "lookup_entities", "get_facts", "facts_for_slots", "facts_and_slots")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reads: Counter[str] = Counter()


def _counted(name: str) -> Callable[..., Any]:
    def read(self: CountingStore, *args: Any, **kwargs: Any) -> Any:
        self.reads[name] += 1
        return getattr(SqliteGraphStore, name)(self, *args, **kwargs)

    return read


for _name in CountingStore.READS:
    setattr(CountingStore, _name, _counted(_name))


Say = Callable[..., WritePlan]


@pytest.fixture
def world(tmp_path: Path, redis_client: redis.Redis) -> Iterator[tuple[CountingStore, str, Say]]:
    graph = CountingStore(path=tmp_path / "g.sqlite3")
    graph.ensure_schema()
    embedder = get_embedder("all-MiniLM-L6-v2")
    keeper = IndexKeeper(graph=graph, vectors=VectorStore(root=tmp_path / "idx", dim=embedder.dim))
    user = f"c_{uuid.uuid4().hex[:8]}"
    middleware = build_hooks(Settings(data_dir=tmp_path))
    writes = UserWrites(graph=graph, keeper=keeper, redis_client=redis_client, lease_ttl_s=30)

    def say(message_id: str, extraction: dict[str, Any], when: datetime, *, again: bool = False) -> WritePlan:
        """What the apply stage does with one message (``apply_message``: its own write inside a UserWrite);
        ``again``: the message was written before, so the graph must say "already applied"."""
        envelope = Envelope(user_id=user, message_id=message_id, messages=[{"content": "x"}], timestamp=when)
        written = apply_message(writes, graph, embedder, middleware, envelope, Extraction.model_validate(extraction))
        assert written.outcome.applied is not again
        assert read_stamp(redis_client, user) == graph.user_stamp(user)
        assert written.outcome.version == graph.user_version(user)
        return written.planned.plan

    yield graph, user, say
    graph.close()
    redis_client.delete(keys.user_version(user))
