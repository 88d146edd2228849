"""The writers' change feed (``engram_api.storage.faiss.feed``) and reads that lag (a Neo4j follower), on
both backends with a real Redis: a reader host behind another host's writes catches its FAISS copy and
snapshot up from Redis without reading the graph, and answers what a fresh reader answers; a gap falls
back to the graph; the feed never holds a forgotten fact or an erased user; a copy is never labelled with
a stamp its read did not reach.

The writer is the apply stage's path (``Memory``); each reader host has its own index directory, and the
oracle is a fresh reader over a third one (as in test_reader_signals).
"""

# ruff: noqa: F811 - ``memory`` (and ``embedder``, which it takes) are the suites' fixtures, imported below

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from engram_api import keys
from engram_api.models import ChatMessage, Envelope, Extraction, Usage
from engram_api.reader.reader import Reader
from engram_api.settings import Settings
from engram_api.storage import GraphStore
from engram_api.storage.faiss import feed
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.versions import Stamp, publish_stamp
from engram_workers.consolidation.plan import Incoming
from engram_workers.middleware import Hooks
from engram_workers.stages.writing import Member, write_members
from tests.support.extractions import fact, lives_in
from tests.support.factories import at, new_user

from .test_hybrid_recall import Memory, embedder  # noqa: F401 - ``embedder``: the fixture
from .test_reader_signals import Reads, _answer, _chatter, _host, _warm, memory  # noqa: F401 - ``memory``


def _entries(client: redis.Redis, user: str) -> list[str]:
    return list(client.zrange(keys.change_feed(user), 0, -1))


def test_a_reader_behind_catches_up_from_the_feed_and_reads_nothing_of_the_graph(
    memory: Memory,
    tmp_path: Path,
) -> None:
    reader = _host(memory, tmp_path / "reader")  # listens to nothing: only the recall catches it up
    user = new_user()
    _chatter(memory, user)
    _warm(reader, user)
    memory.say(user, "m1", "I live in Tampa.", at(20), lives_in("Tampa"))
    memory.say(user, "m2", "I moved, I live in Austin now.", at(30), lives_in("Austin"))  # supersedes Tampa
    assert len(_entries(memory.redis, user)) >= 2
    with Reads(memory.graph) as reads:
        got = _answer(reader, user, "where does the user live now?")
        reader.flush()
    assert reads.calls == []  # both copies caught up from Redis
    assert reader.catchups.from_feed == 1
    stamp = memory.graph.user_stamp(user)
    held, index = reader.snapshots.peek(user), reader.keeper.held(user)
    assert held is not None and held.stamp == stamp and index is not None and index.stamp == stamp
    assert got == _answer(_host(memory, tmp_path / "fresh"), user, "where does the user live now?")
    whole = memory.graph.snapshot(user, max_records=10_000)
    assert whole is not None and dict(held.facts) == dict(whole.facts) and dict(held.chunks) == dict(whole.chunks)


def test_right_after_a_write_the_keyword_channel_searches_the_caught_up_snapshot(
    memory: Memory,
    tmp_path: Path,
) -> None:
    """The recall's keyword search waits for the catch-up on its reader thread (so both overlap the query's
    embedding) and then searches the snapshot at the new stamp: never the older one it started from, and
    not the store."""
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    _chatter(memory, user)
    _warm(reader, user)
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(20))
    with Reads(memory.graph) as reads:
        items = reader.recall(user, "northern lights over the fjord", k=10).items
        reader.flush()
    assert reads.calls == []  # caught up from the feed; the keyword search and the graph step in memory
    said = [i for i in items if i.kind == "episode" and "northern lights" in i.statement]
    assert said and "keyword" in said[0].channels, [(i.statement, i.channels) for i in items]
    held = reader.snapshots.peek(user)
    assert held is not None and held.stamp == memory.graph.user_stamp(user)


def _envelope(user: str, mid: str, text: str, when: datetime) -> Envelope:
    return Envelope(user_id=user, message_id=mid, messages=[ChatMessage(role="user", content=text)], timestamp=when)


def _published_entry(memory: Memory, user: str, before: Stamp) -> feed.FeedEntry:
    (raw,) = memory.redis.zrangebyscore(keys.change_feed(user), f"({before.version}", "+inf")
    return feed.FeedEntry.model_validate_json(raw)


def test_a_writes_entry_is_what_the_graph_reads_after_it(memory: Memory, tmp_path: Path) -> None:
    """The entry a write publishes is exactly the entry of ``user_changes`` from the stamp before, read
    after the commit (same stamps, vectors and records), whether the write's own statement read it (Neo4j:
    no read of its own) or the writer read it after the commit (SQLite); so is a batch's, one entry for
    every member. A reader host caught up from those entries answers as a fresh single-host reader."""
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    _chatter(memory, user)
    _warm(reader, user)
    neo4j = type(memory.graph).__name__.startswith("Neo4j")
    said = (
        ("m1", "I live in Tampa.", at(20), lives_in("Tampa")),
        ("m2", "I moved, I live in Austin now.", at(30), lives_in("Austin")),  # supersedes Tampa
        ("m3", "We saw the northern lights over the fjord last night!", at(40), None),
        ("m4", "I live in Austin, yes.", at(41), lives_in("Austin")),  # restated: reinforces
        ("m5", "Tampa was nice though.", at(42), None),
    )
    for mid, text, when, extraction in said:
        before = memory.graph.user_stamp(user)
        with Reads(memory.graph) as reads:
            memory.say(user, mid, text, when, extraction)
        after = memory.graph.user_stamp(user)
        read, scrub = feed.entry_of(before, after, memory.graph.user_changes(user, before.version))
        assert not scrub and _published_entry(memory, user, before) == feed.FeedEntry.model_validate_json(read)
        assert reads.calls.count(("user_changes", user)) == (0 if neo4j else 1)
    # A batch in one shared transaction (the stage's, on Neo4j): its last member's statement reads for all.
    before = memory.graph.user_stamp(user)
    members = [
        Member(Incoming.of(_envelope(user, mid, text, when), Extraction.model_validate(extraction), Usage()))
        for mid, text, when, extraction in (
            ("m6", "I live in Denver now.", at(50), lives_in("Denver")),
            (
                "m7",
                "My sister visited me in Denver.",
                at(51),
                {"facts": [fact("user", "HAS_SISTER", None, "User has a sister")]},
            ),
        )
    ]
    with Reads(memory.graph) as reads:
        memory.writes.run(
            user,
            lambda write: write_members(
                write,
                members,
                trigger=members[0],
                graph=memory.graph,
                embedder=memory.embedder,
                hooks=Hooks(()),
                share=True,
            ),
            wait=30,
        )
    after = memory.graph.user_stamp(user)
    assert after.version > before.version
    read, _ = feed.entry_of(before, after, memory.graph.user_changes(user, before.version))
    assert _published_entry(memory, user, before) == feed.FeedEntry.model_validate_json(read)
    assert reads.calls.count(("user_changes", user)) == (0 if neo4j else 1)
    for question in ("where does the user live now?", "northern lights over the fjord", "who visited?"):
        assert _answer(reader, user, question) == _answer(_host(memory, tmp_path / "fresh"), user, question)
    assert reader.catchups.from_feed >= 1


def test_a_feed_that_does_not_reach_back_to_the_copy_reads_the_graph(
    memory: Memory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    _chatter(memory, user)
    _warm(reader, user)
    monkeypatch.setattr(feed, "FEED_LENGTH", 1)  # the feed keeps one write: the reader is two behind
    memory.say(user, "m1", "I live in Tampa.", at(20), lives_in("Tampa"))
    memory.say(user, "m2", "I moved, I live in Austin now.", at(30), lives_in("Austin"))
    assert len(_entries(memory.redis, user)) == 1
    with Reads(memory.graph) as reads:
        got = _answer(reader, user, "where does the user live now?")
        reader.flush()
    assert reads.calls == [("user_changes", user)] and reader.catchups.from_feed == 0
    assert got == _answer(_host(memory, tmp_path / "fresh"), user, "where does the user live now?")


def test_a_read_up_to_a_stamp_stops_there_and_one_a_removal_scrubbed_reads_the_graph(memory: Memory) -> None:
    """``read_feed``'s ``upto`` (a recall's catch-up: the stamp it read, one command): the changes end at that
    stamp however many writes came after it, and once a later removal scrubbed the entries it needs, there
    are none (the graph is read), never the entries a removal published before the read deleted."""
    user = new_user()
    _chatter(memory, user)
    since = memory.graph.user_stamp(user)
    memory.say(user, "m1", "I live in Tampa.", at(20), lives_in("Tampa"))
    first = memory.graph.user_stamp(user)
    memory.say(user, "m2", "I moved, I live in Austin now.", at(30), lives_in("Austin"))
    last = memory.graph.user_stamp(user)
    upto = feed.read_feed(memory.redis, user, since.version, upto=first)
    whole = feed.read_feed(memory.redis, user, since.version)
    assert upto is not None and whole is not None
    assert upto.vectors.stamp == first and whole.vectors.stamp == last
    assert any("Tampa" in f.statement for f in upto.facts) and not any("Austin" in f.statement for f in upto.facts)
    (item,) = [
        i for i in memory.reader.recall(user, "Austin", k=10).items if i.kind == "fact" and "Austin" in i.statement
    ]
    memory.reader.forget(user, item.id)
    memory.reader.close()  # its recall's threads: none left running after the test
    assert feed.read_feed(memory.redis, user, since.version, upto=first) is None  # scrubbed: the graph it is


def _collector(memory: Memory, user: str) -> str:
    """The user's chatter, then a message stating one fact (the one forgotten later); its statement."""
    _chatter(memory, user)
    secret = "User collects antique cuckoo clocks"
    memory.say(
        user, "clocks", "I collect antique cuckoo clocks.", at(20), {"facts": [fact("user", "COLLECTS", None, secret)]}
    )
    return secret


def test_the_feed_holds_nothing_of_a_forgotten_fact_or_an_erased_user(memory: Memory, tmp_path: Path) -> None:
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    secret = _collector(memory, user)
    _warm(reader, user)
    memory.say(user, "m1", "I live in Tampa.", at(21), lives_in("Tampa"))
    (item,) = [i for i in memory.reader.recall(user, "cuckoo clocks", k=10).items if i.statement == secret]
    assert any(item.id in e and secret in e for e in _entries(memory.redis, user))  # the feed held it
    memory.reader.forget(user, item.id)
    # The forget's publish deleted every earlier entry and added its own: the removed id, nothing of the fact.
    (entry,) = [feed.FeedEntry.model_validate_json(e) for e in _entries(memory.redis, user)]
    assert item.id in entry.gone and not any(f.id == item.id for f in entry.facts)
    assert "cuckoo" not in entry.model_dump_json() and item.id not in {v[0] for v in entry.vectors}
    memory.say(user, "m2", "I moved, I live in Austin now.", at(30), lives_in("Austin"))
    entries = _entries(memory.redis, user)
    assert len(entries) == 2 and not any("cuckoo" in e for e in entries)
    with Reads(memory.graph) as reads:
        got = reader.recall(user, "cuckoo clocks", k=10)
        reader.flush()
    assert ("user_changes", user) in reads.calls  # two writes behind, the first before the forget: the graph
    assert secret not in {i.statement for i in got.items}

    memory.reader.forget_user(user)
    assert not memory.redis.exists(keys.change_feed(user))
    assert not any(user in key for key in memory.redis.scan_iter(match=f"{keys.PREFIX}:feed:*"))


def test_removals_travel_in_the_feed_and_no_host_reads_the_user_whole_again(memory: Memory, tmp_path: Path) -> None:
    """Writes alternating two apply hosts mix additions, a supersession, a single-fact forget, a message
    forget and an archival (the decay job's write): after each, a reader host one write behind catches its
    FAISS copy and snapshot up from the feed alone (no graph read at all), answers exactly as a fresh
    single-host reader (ids, channels, scores), holds what a whole read holds, and the apply host behind
    catches up from the feed too; after its first load no host reads the user whole again."""
    a, b = memory, Memory(memory.graph, tmp_path / "writer-b", memory.embedder, memory.redis)
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    secret = _collector(a, user)
    a.say(user, "m1", "I live in Tampa.", at(21), lives_in("Tampa"))
    a.say(user, "m2", "My sister Ana plays the violin.", at(22), {"facts": [fact("user", "HAS_SISTER", None, "User has a sister")]})  # fmt: skip
    _warm(reader, user)
    (clocks,) = [i for i in a.reader.recall(user, "cuckoo clocks", k=10).items if i.statement == secret]

    def austin() -> str:
        (found,) = [f.id for f in a.graph.snapshot(user, max_records=10_000).facts.values() if "Austin" in f.statement]
        return found

    def archive(write: Any) -> int:
        # The decay job's write (``run_decay``): one transaction archiving the first fact due, years ahead.
        flags = a.graph._archive_batch(write.user_id, now=datetime.now(UTC) + timedelta(days=3650), batch=1)
        write.finish(changed=True)
        return sum(flags)

    steps = (
        lambda: b.say(user, "m3", "I moved, I live in Austin now.", at(30), lives_in("Austin")),  # supersedes
        lambda: a.reader.forget(user, clocks.id),  # one fact
        lambda: b.say(user, "m4", "We saw the northern lights over the fjord last night!", at(40)),
        lambda: a.reader.forget(user, "m2"),  # a message: its chunks, its facts, its entities
        lambda: b.writes.run(user, archive, wait=30),
        lambda: a.say(user, "m5", "I live in Austin, yes.", at(50), lives_in("Austin")),  # restated: 2 sources
        lambda: b.reader.forget(user, "m3"),  # Austin keeps m5 as its source: its record changes, it stays
        lambda: a.reader.forget(user, austin()),  # Tampa is current again (its chain repaired)
        lambda: b.say(user, "m6", "I play chess with my neighbour on Sundays.", at(60)),
    )
    questions = ("where does the user live now?", "cuckoo clocks", "sister violin", "northern lights", "chess")
    for step in steps:
        step()
        stamp = memory.graph.user_stamp(user)
        with Reads(memory.graph) as reads:
            got = [_answer(reader, user, q) for q in questions]
            reader.flush()
        assert reads.calls == []  # both copies caught up from the feed, removals included
        assert got == [_answer(_host(memory, tmp_path / f"fresh-{stamp.version}"), user, q) for q in questions]
        held, index = reader.snapshots.peek(user), reader.keeper.held(user)
        assert held is not None and held.stamp == stamp and index is not None and index.stamp == stamp
        whole = memory.graph.snapshot(user, max_records=10_000)
        assert whole is not None and dict(held.facts) == dict(whole.facts) and dict(held.chunks) == dict(whole.chunks)
        assert index.node_ids() == whole_index(memory, user, tmp_path).node_ids()
    assert all(secret not in e for e in _entries(memory.redis, user))
    assert reader.keeper.rebuilds == 1 and reader.catchups.from_feed == len(steps)
    # a made the user (no load); b loaded it at its first write of its own index, then only caught up.
    assert (a.keeper.rebuilds, b.keeper.rebuilds) == (0, 1)
    assert a.keeper.feed_catchups >= 3 and b.keeper.feed_catchups >= 3


def whole_index(memory: Memory, user: str, tmp_path: Path) -> Any:
    """The user's index as a single-host reader reads it whole from the graph (nothing kept)."""
    keeper = IndexKeeper(
        graph=memory.graph, vectors=VectorStore(root=tmp_path / "whole", dim=memory.embedder.dim), cache=False,
        persist=False,
    )  # fmt: skip
    return keeper.rebuild(user)


def test_an_entry_is_added_only_with_a_stamp_that_moves_forward_under_the_lease(memory: Memory) -> None:
    client, user = memory.redis, new_user()
    assert publish_stamp(client, user, Stamp(5, 2), entry="two")
    assert not publish_stamp(client, user, Stamp(5, 3), lease_token="not-ours", entry="three")  # lease lost
    assert publish_stamp(client, user, Stamp(5, 1), entry="one")  # older than the published stamp
    assert _entries(client, user) == ["two"]
    assert not publish_stamp(client, user, Stamp(5, 4), lease_token="not-ours", scrub=True)
    assert _entries(client, user) == []  # a scrub happens whatever the lease says
    assert publish_stamp(client, user, Stamp(5, 6), entry="six")
    assert 0 < client.pttl(keys.change_feed(user)) <= feed.FEED_TTL_S * 1000  # it expires
    assert feed.read_feed(client, user, 5) is None  # an entry that does not parse: the graph is read


class Lagging:
    """The graph store as a lagging replica serves it: while ``behind`` holds an earlier reader's answers
    (taken from the real store before a write), each catch-up read returns that pre-write state, ``once``
    or until ``caught`` is called; every other call goes to the real store."""

    LAGGED = ("user_changes", "vector_changes")

    def __init__(self, graph: GraphStore) -> None:
        self._graph = graph
        self.behind: dict[str, Any] = {}
        self.once = True
        self.served = 0

    def lag(self, user: str, since: int) -> None:
        self.behind = {name: getattr(self._graph, name)(user, since) for name in self.LAGGED}

    def caught(self) -> None:
        self.behind = {}

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._graph, name)
        if name not in self.LAGGED:
            return real

        def read(user: str, since: int) -> Any:
            if name in self.behind:
                self.served += 1
                return self.behind.pop(name) if self.once else self.behind[name]
            return real(user, since)

        return read


def _lagging_host(writer: Memory, root: Path) -> tuple[Reader, Lagging]:
    graph = Lagging(writer.graph)
    keeper = IndexKeeper(graph=graph, vectors=VectorStore(root=root, dim=writer.embedder.dim))  # type: ignore[arg-type]
    reader = Reader(
        settings=Settings(), graph=graph, keeper=keeper, embedder=writer.embedder, redis_client=writer.redis,  # type: ignore[arg-type]
    )  # fmt: skip
    return reader, graph


def test_a_lagging_read_never_labels_a_copy_with_a_stamp_it_did_not_reach(memory: Memory, tmp_path: Path) -> None:
    reader, graph = _lagging_host(memory, tmp_path / "reader")
    user = new_user()
    _chatter(memory, user)
    _warm(reader, user)
    before = memory.graph.user_stamp(user)
    graph.lag(user, before.version)  # the replica's answer before the write
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(20))
    memory.redis.delete(keys.change_feed(user))  # the graph's own reads, not the feed
    stamp = memory.graph.user_stamp(user)
    question = "aurora borealis trip"

    # Lagging once: the catch-up read returns the pre-write state; the recall reads again and reaches the stamp.
    got = _answer(reader, user, question)
    reader.flush()
    assert graph.served >= 1
    index = reader.keeper.held(user)
    assert index is not None and index.stamp == stamp
    assert got == _answer(_host(memory, tmp_path / "fresh"), user, question)

    # Lagging on every catch-up read: the index stays labelled with the stamp it holds, and the answer
    # built on it is not cached under the new stamp: once the replica caught up, the same question reads
    # again (no cache hit) and finds the message in the caught-up index.
    reader, graph = _lagging_host(memory, tmp_path / "reader-2")
    _warm(reader, user)
    graph.once = False
    graph.lag(user, stamp.version)
    memory.say(user, "later", "We are planning a trip to see the midnight sun next summer.", at(21))
    memory.redis.delete(keys.change_feed(user))
    newer = memory.graph.user_stamp(user)
    lagged = reader.recall(user, "midnight sun trip", k=10)
    reader.flush()
    index = reader.keeper.held(user)
    assert graph.served >= 1 and index is not None and index.stamp == stamp  # what its reads reached
    assert not lagged.cached
    graph.caught()
    again = reader.recall(user, "midnight sun trip", k=10)
    assert not again.cached and "later" in {s for i in again.items for s in i.source_ids}
    assert reader.keeper.held(user).stamp == newer  # type: ignore[union-attr]
