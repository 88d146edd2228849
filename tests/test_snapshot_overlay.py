"""A held snapshot keeps what was written since its base apart (``engram_api.storage.snapshot.overlay``):
every read through the overlay must answer exactly as a snapshot built whole from the same records (the
same records, each entity's facts in the same order, the same keyword hits with the same scores, the same
graph step), and folding the overlay into a new base (``UserSnapshot.merged``) must give that whole build.
The stores' answers are held against the snapshot by the contract suite (tests/contract/); here the
oracle is ``UserSnapshot.of``, with no store.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest

from engram_api.models import ChunkRecord, FactRecord
from engram_api.reader.facts import SnapshotCache
from engram_api.storage.graph.step import GraphStepQuery
from engram_api.storage.snapshot.graph import UserSnapshot
from engram_api.storage.snapshot.keywords import KeywordTable, stems
from engram_api.storage.snapshot.overlay import MERGE_MIN, merge_due
from engram_api.storage.snapshot.removal import compacted, table_without, without
from engram_api.versions import ABSENT, Stamp
from tests.support.factories import T0, at, make_entity, make_fact

USER = "u-overlay"
WORDS = [
    "coffee",
    "paris",
    "violin",
    "sister",
    "garden",
    "chess",
    "museum",
    "bakery",
    "novel",
    "guitar",
    "river",
    "mountain",
    "tea",
]
QUERIES = (["coffee", "paris"], ["violin"], ["sister", "garden", "tea"], ["river", "user"], ["nothing"])


def _chunk(rng: random.Random, n: int, episode: str, seq: int, day: float) -> ChunkRecord:
    return ChunkRecord(
        id=f"chk-{n:05d}", user_id=USER, episode_id=episode, seq=seq, speaker="user", event_time=at(day),
        text=" ".join(rng.choices(WORDS, k=rng.randint(2, 6))),
    )  # fmt: skip


def _world(rng: random.Random, n: int) -> tuple[list, list[FactRecord], list[ChunkRecord]]:
    people = [make_entity(USER, f"P{i}") for i in range(8)]
    facts = [
        make_fact(
            USER, rng.choice(people), "R", rng.choice([None, *people]), importance=rng.choice((0.2, 0.5, 0.9)),
            statement=f"the user {' '.join(rng.choices(WORDS, k=3))}", valid_from=at(rng.randint(0, 30)),
        )
        for _ in range(n)
    ]  # fmt: skip
    chunks = [_chunk(rng, i, f"ep-{i // 2}", i % 2, i / 10) for i in range(n)]
    return people, facts, chunks


def _steps(people: list) -> list[GraphStepQuery]:
    return [
        GraphStepQuery(seeds=[p.id], max_hops=2, limit=20, per_seed=per_seed, now=at(60), avoid=[people[0].id])
        for p in people
        for per_seed in (2, 5)
    ]


def _answers(snapshot: UserSnapshot, people: list) -> tuple:
    """Everything a recall reads of a snapshot, as plain values."""
    step = [snapshot.graph_step(q) for q in _steps(people)]
    return (
        dict(snapshot.facts),
        dict(snapshot.chunks),
        {p.id: tuple(snapshot.entity_facts(p.id)) for p in people},
        [snapshot.keyword_search(q, 4) for q in QUERIES],
        [snapshot.keyword_search(q, 3, as_of=at(10)) for q in QUERIES],
        [(s.facts, s.hops, s.chunks) for s in step],
        snapshot.episode_chunks([f"ep-{i}" for i in range(0, 400, 7)]),
    )


def test_an_overlay_answers_every_read_as_a_snapshot_built_whole_and_its_merge_is_that_build() -> None:
    rng = random.Random(11)
    people, facts, chunks = _world(rng, 120)
    held = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks)
    every_fact, every_chunk = {f.id: f for f in facts}, {c.id: c for c in chunks}
    for version in range(2, 9):
        n = 1000 + 10 * version
        new = _world(rng, 3)[1]  # facts about other entities too: a P of another world is a new entity
        new = [f.model_copy(update={"id": f"fact-new-{version}-{i}"}) for i, f in enumerate(new)]
        old = rng.sample(list(every_fact.values()), 4)
        changed = [
            old[0].model_copy(update={"importance": 0.7}),  # re-ranked
            old[1].model_copy(update={"valid_until": at(40), "superseded_by": new[0].id}),  # superseded
            old[2].model_copy(update={"archived": True}),
            old[3].model_copy(update={"strength": 0.3}),  # changed, same rank
        ]
        written_chunks = [_chunk(rng, n, f"ep-new-{version}", 0, 50 + version), _chunk(rng, n + 1, "ep-3", 5, 0.3)]
        written_chunks[1] = written_chunks[1].model_copy(update={"id": f"chk-late-{version}"})
        held = held.updated(Stamp(1, version), [*new, *changed], written_chunks)
        every_fact.update((f.id, f) for f in [*new, *changed])
        every_chunk.update((c.id, c) for c in written_chunks)
        whole = UserSnapshot.of(USER, Stamp(1, version), every_fact.values(), every_chunk.values())
        assert held.recent_size > 0 and whole.recent_size == 0
        assert _answers(held, people) == _answers(whole, people)
        merged = held.merged()
        assert merged.recent_size == 0 and merged.stamp == whole.stamp
        assert merged.touching == whole.touching and merged.episodes == whole.episodes
        assert _answers(merged, people) == _answers(whole, people)
    assert merged.merged() is merged  # nothing recent: itself


def test_a_supersession_in_the_overlay_hides_the_base_record_and_leaves_the_base_as_it_was() -> None:
    ana, paris, rome = (make_entity(USER, name) for name in ("Ana", "Paris", "Rome"))
    lives = make_fact(USER, ana, "LIVES_IN", paris, statement="Ana lives in Paris", valid_from=at(1))
    base = UserSnapshot.of(USER, Stamp(1, 1), [lives], [])
    moved = make_fact(USER, ana, "LIVES_IN", rome, statement="Ana lives in Rome", valid_from=at(5))
    ended = lives.model_copy(update={"valid_until": moved.valid_from, "superseded_by": moved.id})
    after = base.updated(Stamp(1, 2), [ended, moved], [])
    step = GraphStepQuery(seeds=[ana.id], max_hops=1, limit=10, per_seed=5, now=at(9))

    assert after.facts[lives.id].valid_until == moved.valid_from  # the overlay's row hides the base's
    assert [h.node_id for h in after.keyword_search(["lives"], 5)] == [moved.id]
    assert [h.node_id for h in after.keyword_search(["paris"], 5)] == []
    assert [h.node_id for h in after.keyword_search(["paris"], 5, as_of=at(2))] == [lives.id]
    assert [fid for fid, _ in after.graph_step(step).hops] == [moved.id]
    # the snapshot a concurrent recall may still hold is untouched
    assert base.facts[lives.id].valid_until is None
    assert [fid for fid, _ in base.graph_step(step).hops] == [lives.id]


def test_removed_records_leave_the_snapshot_as_one_built_whole_without_them() -> None:
    """A write that removed records (a forget, expired chunks) is taken in from the removed ids
    (``removal.without``), in the overlay (the base neither folded nor copied, the keyword positions kept):
    every read answers as a snapshot built whole from the records that remain, a chunk no longer lists a
    removed fact, the keyword statistics are the remaining documents', and its fold is that whole build."""
    rng = random.Random(5)
    people, facts, chunks = _world(rng, 120)
    facts = [f.model_copy(update={"source_ids": [f"ep-{i % 60}"]}) for i, f in enumerate(facts)]
    stated: dict[str, list[str]] = {}
    for f in facts:
        stated.setdefault(f.source_ids[0], []).append(f.id)
    chunks = [c.model_copy(update={"fact_ids": stated.get(c.episode_id, [])}) for c in chunks]
    held = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks)
    every_fact, every_chunk = {f.id: f for f in facts}, {c.id: c for c in chunks}
    for round_ in range(1, 6):
        new = _world(rng, 2)[1]
        new = [f.model_copy(update={"id": f"fact-new-{round_}-{i}", "source_ids": ["ep-3"]}) for i, f in enumerate(new)]
        held = held.updated(Stamp(1, 2 * round_), new, [])  # an addition, held in the overlay
        every_fact.update((f.id, f) for f in new)
        dropped = {*rng.sample(sorted(every_fact), 3), new[0].id}  # one of them in the overlay
        episode = rng.choice(sorted({c.episode_id for c in every_chunk.values()}))
        chunks_gone = {c.id for c in every_chunk.values() if c.episode_id == episode}
        stamp = Stamp(1, 2 * round_ + 1)
        assert held.refreshed(stamp, stamp.version, [], [], max_records=1000) is None  # the ids unknown
        base_rows, base_table = held.facts.base, held.keywords.facts
        held = held.refreshed(
            stamp, stamp.version, [], [], max_records=1000, gone=[*dropped, *chunks_gone, "ent-not-held"]
        )
        assert held is not None and held.stamp == stamp
        # held in the overlay: the base's rows and keyword positions as they were, nothing folded
        assert held.facts.base is base_rows and held.keywords.facts.ids == base_table.ids
        assert held.recent_size >= len(dropped)
        every_fact = {i: f for i, f in every_fact.items() if i not in dropped}
        every_chunk = {
            i: c.model_copy(update={"fact_ids": [f for f in c.fact_ids if f not in dropped]})
            for i, c in every_chunk.items()
            if i not in chunks_gone
        }
        whole = UserSnapshot.of(USER, stamp, every_fact.values(), every_chunk.values())
        folded = held.merged()
        assert folded.touching == whole.touching and folded.episodes == whole.episodes
        assert len(held.facts) == len(whole.facts) and len(held.chunks) == len(whole.chunks)
        assert _answers(held, people) == _answers(whole, people) == _answers(folded, people)
        for words in QUERIES:
            for hit, truth in zip(held.keyword_search(words, 50), whole.keyword_search(words, 50), strict=True):
                assert (hit.node_id, hit.score) == (truth.node_id, truth.score)


def test_erasure_drops_a_held_snapshot_overlay_and_all() -> None:
    rng = random.Random(3)
    _, facts, chunks = _world(rng, 20)
    held = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks).updated(Stamp(1, 2), _world(rng, 2)[1], [])
    assert held.recent_size == 2
    cache = SnapshotCache(max_records=1000, budget_records=10_000)
    assert cache._keep(held, answering=False) and cache.peek(USER) is held
    cache.drop_user(USER)
    assert cache.peek(USER) is None


def test_a_snapshots_terms_memo_is_carried_by_additions_and_begun_anew_by_a_removal() -> None:
    """The terms recall stemmed from a held user's texts (``UserSnapshot.terms``) go with the snapshot: a
    refresh that only added records and the fold keep them, one that removed any does not; a user read without
    a snapshot has a memo per stamp (``reader.terms``), and a snapshot of an ended lifetime is dropped at the
    next recall that finds the user absent or in a newer lifetime."""
    rng = random.Random(6)
    _, facts, chunks = _world(rng, 20)
    held = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks)
    text = facts[0].statement
    assert held.terms[text] == frozenset(stems(text)) and text in held.terms
    grown = held.updated(Stamp(1, 2), _world(rng, 2)[1], [])
    assert grown.terms is held.terms and grown.merged().terms is held.terms
    shrunk = without(grown, [facts[0].id])
    assert text not in shrunk.terms and len(shrunk.terms) == 0

    cache = SnapshotCache(max_records=1000, budget_records=10_000)
    unheld = cache.terms(USER, Stamp(1, 2), None)
    unheld[text]  # stemmed and kept
    assert cache.terms(USER, Stamp(1, 2), None) is unheld and cache.terms(USER, Stamp(1, 2), grown) is held.terms
    assert text not in cache.terms(USER, Stamp(1, 3), None)  # a newer stamp: a new memo, the old one gone
    assert cache.unheld_terms.held(USER) is not unheld
    for ended in (ABSENT, Stamp(2, 1)):
        assert cache._keep(grown, answering=False) and cache.terms(USER, Stamp(1, 2), None) is not None
        assert cache.unheld_terms.held(USER) is not None
        assert cache.get(USER, Stamp(1, 1)) is grown  # a slower reader's older stamp keeps it
        assert cache.get(USER, ended) is None and cache.peek(USER) is None
        assert cache.unheld_terms.held(USER) is None


def test_the_overlay_is_folded_now_and_then_off_the_path() -> None:
    """A share of the user's records (``overlay.merge_due``); ``SnapshotCache.fold_soon`` swaps the folded base
    in only while the snapshot it folded is still the one held."""
    assert not merge_due(10, 100) and merge_due(64, 100) and not merge_due(64, 100_000) and merge_due(3125, 100_000)
    rng = random.Random(4)
    people, facts, chunks = _world(rng, 40)
    held = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks)
    extra = [
        c.model_copy(update={"id": f"chk-x{i}", "event_time": T0 + timedelta(days=90 + i)})
        for i, c in enumerate(chunks)
    ]
    big = held.updated(Stamp(1, 2), _world(rng, 30)[1], extra)  # fmt: skip
    assert big.merge_due
    cache = SnapshotCache(max_records=1000, budget_records=10_000)
    cache._keep(big, answering=False)
    cache.fold_soon(USER, _now)
    folded = cache.peek(USER)
    assert folded is not None and folded is not big and folded.recent_size == 0
    assert _answers(folded, people) == _answers(big, people)
    cache.fold_soon(USER, _now)
    assert cache.peek(USER) is folded  # nothing due: left as it is


def _now(fn: Callable[..., object], *args: object) -> None:
    """A reader thread's ``behind`` that runs the work at once."""
    fn(*args)


def _same_table(got: KeywordTable, want: KeywordTable) -> None:
    """The same ids in order, lengths, id ranks and every term's postings (positions, their dtype, and each
    one's form: its frequency and its document's length, whatever place the form has in ``forms``)."""
    assert got.ids == want.ids and np.array_equal(got.lengths, want.lengths) and got.holes == want.holes
    assert np.array_equal(got.sorted_ids, want.sorted_ids) and np.array_equal(got.rank, want.rank)
    assert got.postings.keys() == want.postings.keys() and dict(got.hole_df) == dict(want.hole_df)
    for term, (places, form) in want.postings.items():
        assert got.postings[term][0].dtype == places.dtype and np.array_equal(got.postings[term][0], places)
        assert np.array_equal(got.forms[:, got.postings[term][1]], want.forms[:, form])


def test_a_removed_keyword_document_leaves_a_hole_and_the_table_answers_as_one_built_from_the_rest() -> None:
    """``table_without`` leaves every document at its position and copies no posting (a hole: never a match,
    out of the statistics, its terms' document frequencies counted down): its search answers exactly as ``KeywordTable.of`` over
    the remaining documents (ids, order, scores), taking the same documents out again changes nothing, and
    ``compacted`` is that table itself, however many the holes (compacting is the fold's)."""
    rng = random.Random(11)
    words = [f"w{i}" for i in range(40)]
    docs = [(f"doc-{i:03d}", " ".join([*rng.choices(words, k=rng.randint(1, 6)), f"only{i}"])) for i in range(200)]
    table = KeywordTable.of(docs)
    queries = [stems(q) for q in ("w1", "w2 w3 only7", "only0 only199 w5", "w0 w1 w2 w3 w4 w5 w6 w7", "nothing")]
    for gone in ([docs[0][0]], [docs[-1][0]], [d for d, _ in rng.sample(docs, 30)], [d for d, _ in docs[50:]]):
        texts = dict(docs)
        got = table_without(table, {**{d: texts[d] for d in gone}, "not-a-doc": "w1"})
        want = KeywordTable.of(d for d in docs if d[0] not in gone)
        assert got.ids == table.ids and got.holes == {table.ids.index(d) for d in gone}
        assert got.live == len(want.ids) and got.lengths.sum() == want.lengths.sum()
        assert got.postings is table.postings  # no posting copied: the removal costs what the text holds
        assert all(got.df(t) == want.df(t) for t in table.postings)
        assert table_without(got, {d: texts[d] for d in gone}) is got
        _same_table(compacted(got, ()), want)
        for terms in queries:
            for k in (1, 5, 500):
                assert got.ranked(terms, k, lambda i: True) == want.ranked(terms, k, lambda i: True)
                odd = got.ranked(terms, k, lambda i: int(i[-1]) % 2 == 1)
                assert odd == want.ranked(terms, k, lambda i: int(i[-1]) % 2 == 1)


def test_a_removals_catch_up_leaves_the_keyword_holes_to_the_fold() -> None:
    """The catch-up of a removal (``removal.without``, on the recall's path) never compacts a keyword table,
    even once its holes reach the fold's share (a 100K-fact table's compaction took ~0.6 s there): the holes
    count towards the fold, removed documents of the recent tables too, and the fold (``SnapshotCache.fold_soon``,
    off the path) drops them; before and after, the snapshot answers as one built whole from what remains."""
    rng = random.Random(21)
    people, facts, chunks = _world(rng, 100)
    held = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks)
    extra = [
        chunks[i].model_copy(update={"id": f"chk-y{i}", "event_time": T0 + timedelta(days=120 + i)}) for i in range(3)
    ]
    held = held.updated(Stamp(1, 2), [], extra)
    gone = [f.id for f in facts[: MERGE_MIN + 5]] + [c.id for c in extra]  # base facts and recent chunks
    for i, record in enumerate(gone):
        held = without(held, [record])
        tables = [held.keywords.facts, held.keywords.chunks]
        tables += [] if held.keywords.recent is None else [held.keywords.recent.facts, held.keywords.recent.chunks]
        assert sum(len(t.holes) for t in tables) == i + 1  # a hole each, none compacted on the path
    assert held.keywords.recent_holes == len(extra) and held.merge_due
    remaining = UserSnapshot.of(
        USER, Stamp(1, 2), [f for f in facts if f.id not in gone], [c for c in [*chunks, *extra] if c.id not in gone]
    )
    assert _answers(held, people) == _answers(remaining, people)
    cache = SnapshotCache(max_records=1000, budget_records=10_000)
    cache._keep(held, answering=False)
    cache.fold_soon(USER, _now)
    folded = cache.peek(USER)
    assert folded is not None and folded.recent_size == 0 and not folded.keywords.recent_holes
    assert not folded.keywords.facts.holes and not folded.keywords.chunks.holes
    _same_table(folded.keywords.facts, remaining.keywords.facts)
    _same_table(folded.keywords.chunks, remaining.keywords.chunks)
    assert _answers(folded, people) == _answers(remaining, people)


def test_a_removal_is_folded_at_once_off_the_path_one_fold_of_a_user_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot that hides a removed record is due for its fold at once (``fold_due``), however small the
    overlay; ``SnapshotCache.fold_soon`` hands one fold of a user to the reader's threads, a second call while
    it is in flight hands none, and a removal caught up during the fold is folded right after it: once the
    fold has run no row, keyword document or posting of a removed record is held."""
    rng = random.Random(31)
    _, facts, chunks = _world(rng, 100)
    held = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks)
    assert not held.fold_due
    first, second = facts[0], facts[1]
    one = without(held, [first.id])
    assert one.recent_size == 1 and not one.merge_due and one.fold_due
    cache = SnapshotCache(max_records=1000, budget_records=10_000)
    cache._keep(one, answering=False)
    handed: list = []
    cache.fold_soon(USER, lambda fn, *args: handed.append((fn, args)))
    cache.fold_soon(USER, lambda fn, *args: handed.append((fn, args)))
    assert len(handed) == 1  # one in flight
    merged = UserSnapshot.merged

    def caught_up_meanwhile(snapshot: UserSnapshot) -> UserSnapshot:
        held_now = cache.peek(USER)
        if held_now is not None and second.id in held_now.facts:  # a catch-up of a second removal, mid-fold
            cache._keep(without(held_now, [second.id]), answering=False)
            cache.fold_soon(USER, lambda fn, *args: handed.append((fn, args)))
        return merged(snapshot)

    monkeypatch.setattr(UserSnapshot, "merged", caught_up_meanwhile)
    fn, args = handed[0]
    fn(*args)
    assert len(handed) == 1  # the fold in flight folded the second removal too
    folded = cache.peek(USER)
    assert folded is not None and not folded.fold_due and folded.recent_size == 0 and not folded.keywords.holes
    for rows in (folded.facts.base, folded.facts.recent):
        assert first.id not in rows and second.id not in rows
    tables = (folded.keywords.facts, folded.keywords.chunks)
    assert all(first.id not in t.ids and second.id not in t.ids for t in tables)
    remaining = [f for f in facts if f.id not in {first.id, second.id}]
    _same_table(folded.keywords.facts, UserSnapshot.of(USER, Stamp(1, 1), remaining, chunks).keywords.facts)
    cache.fold_soon(USER, lambda fn, *args: handed.append((fn, args)))
    assert len(handed) == 1 and cache._folding == set()  # nothing due, none in flight
