"""Erasure reaches the bytes: after ``forget_user`` (and ``forget`` of one message) no file under the data
directory (the Redis AOF and RDB, the SQLite file, its WAL and FTS5 shadow tables, the FAISS files, the
worker logs) and no Redis key or value holds the erased words, the user id or the user's keyword token.

The real stack on both graph stores: worker processes, a Redis of the test's own inside the data directory
(AOF on, RDB snapshots on as in Redis's default config), the LLM stand-in. Neo4j's own files live with the
Neo4j server, outside the data directory: what they keep is documented (docs/operations.md), not scanned.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from engram_api.ledger.erasure import purge_redis
from engram_api.storage.graph.episodes import user_key
from engram_testing.llm_standin import Reply
from engram_workers.services import RedisServer
from tests.support.extractions import entity, fact, message_text
from tests.support.scan import file_hits, redis_hits
from tests.support.stack import SETTLE_S, engram_stack

T0 = datetime(2024, 6, 1, 9, 0, tzinfo=UTC)

# Words no stemmer changes and no other text contains: one set per user, one for hank's forgotten message.
GINA = ("zorblax", "quavmir")
HANK = ("druvok",)
HANK_FORGOTTEN = ("vextrop", "glimmork")
IVY = ("plenthar",)


def _extraction(place: str, friend: str) -> dict[str, Any]:
    return {
        "entities": [
            entity("e1", place.title(), "Place", summary=f"a place called {place}"),
            entity("e2", friend.title(), "Person", aliases=[f"{friend.title()} the Great"]),
        ],
        "facts": [
            fact("user", "VISITED", "e1", f"User visited {place.title()}"),
            fact("user", "KNOWS", "e2", f"User knows {friend.title()}"),
        ],
    }


def _say(place: str, friend: str) -> str:
    return f"I visited {place.title()} with my friend {friend.title()}."


def _answer(request: dict[str, Any]) -> Reply:
    text = message_text(request)
    if "poison" in text:
        return Reply.malformed()  # dead-lettered: the letter keeps the envelope, text included
    for place, friend in ((GINA[0], GINA[1]), (HANK[0], "Bob"), (HANK_FORGOTTEN[0], HANK_FORGOTTEN[1]), (IVY[0], "Al")):
        if place in text.lower():
            return Reply.json(_extraction(place, friend))
    return Reply.json({"entities": [], "facts": []})


@pytest.fixture(params=["sqlite", "neo4j"])
def stack(request: pytest.FixtureRequest, tmp_path: Path, llm_standin: Any) -> Iterator[Any]:
    data = tmp_path / "data"
    # rdbcompression off in this test only: the AOF's RDB preamble and the snapshot then keep strings as
    # they are, so a byte scan that finds nothing proves nothing is there (compressed text could hide).
    server = RedisServer(data_dir=data / "redis", appendonly=True, extra_config=["save 3600 1", "rdbcompression no"])
    server.start()
    llm_standin.script(_answer)
    neo4j_uri = request.getfixturevalue("neo4j_uri") if request.param == "neo4j" else None
    try:
        with engram_stack(redis_url=server.url, data_dir=data, neo4j_uri=neo4j_uri, llm_url=llm_standin.url) as s:
            s.server = server
            yield s
    finally:
        server.stop()


def test_forget_user_and_forget_leave_no_byte_of_what_they_erased(stack: Any) -> None:
    client, suffix = stack.client, uuid.uuid4().hex[:8]
    gina, hank, ivy = f"gina{suffix}", f"hank{suffix}", f"ivy{suffix}"
    said = [
        (gina, f"{gina}-m0", _say(*GINA)),
        (gina, f"{gina}-m1", f"poison: my {GINA[0]} diary"),
        (hank, f"{hank}-m0", _say(HANK[0], "Bob")),
        (hank, f"{hank}-m1", _say(*HANK_FORGOTTEN)),
        (hank, f"{hank}-m2", f"poison: the {HANK[0]} letter"),
        (ivy, f"{ivy}-m0", _say(IVY[0], "Al")),
    ]
    receipts = [
        client.enqueue(user, text, message_id=mid, timestamp=T0 + timedelta(hours=i))
        for i, (user, mid, text) in enumerate(said)
    ]
    waited = client.wait(receipts, timeout=SETTLE_S)
    assert sorted(waited.dead_lettered) == [f"{gina}-m1", f"{hank}-m2"], waited
    client.redis.save()  # a snapshot from before the erasure: the purge must replace it

    erased = [*GINA, gina, user_key(gina), *HANK_FORGOTTEN, f"{hank}-m1"]
    kept = [HANK[0], IVY[0]]
    before = file_hits(stack.data_dir, erased + kept)
    assert set(before) >= {GINA[0], gina, HANK_FORGOTTEN[0]}, before  # premise: the scan sees them on disk
    assert any(path.startswith("redis/") for path in before[GINA[0]]), before

    client.forget_user(gina)
    client.forget(hank, f"{hank}-m1")

    assert file_hits(stack.data_dir, erased) == {}
    assert redis_hits(stack.server.url, erased) == {}
    # What stays is still there and still found: the scans would have seen the erased words too.
    after = file_hits(stack.data_dir, kept)
    assert any(path.startswith("redis/") for path in after.get(HANK[0], [])), after  # hank's dead letter
    assert [d.message_id for d in client.dead_letters(hank)] == [f"{hank}-m2"]
    assert client.stats(hank).episodes == 1 and client.stats(ivy).episodes == 1
    assert client.stats(gina).episodes == 0 and client.dead_letters(gina) == []
    statements = [f.statement for f in client.history(hank, "user")]
    assert statements == [f"User visited {HANK[0].title()}", "User knows Bob"], statements


def test_a_purge_that_finds_a_rewrite_running_waits_for_it_and_rewrites_again(tmp_path: Path) -> None:
    """The running rewrite may have forked before the erasure's deletes: it cannot count as the purge."""
    server = RedisServer(data_dir=tmp_path / "redis", appendonly=True)
    server.start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        client.set("engram:msg:someone:m1", "text")
        forks = int(client.info("stats")["total_forks"])  # this server forks for AOF rewrites only
        client.bgrewriteaof()  # running (or done) when the purge starts
        assert purge_redis(client, timeout_s=120) == ["aof"]
        assert int(client.info("stats")["total_forks"]) == forks + 2
        assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"
        client.close()
    finally:
        server.stop()
