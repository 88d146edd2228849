"""The reader's result and record caches drop what a newer stamp outdates (``drop_outdated``, and a read at
the newer stamp), within their bounds; no store (tests/contract/test_reader_terms.py walks a whole reader)."""

from __future__ import annotations

from engram_api.models import FactRecord
from engram_api.reader.background import ResultCache
from engram_api.reader.facts import ChunkCache, EpisodeChunkIds, FactCache
from engram_api.versions import ABSENT, Stamp, outdated
from tests.support.factories import at

OLD, NEW, LATER = Stamp(7, 1), Stamp(7, 2), Stamp(9, 1)


def _fact(user: str, statement: str) -> FactRecord:
    return FactRecord(id="f1", user_id=user, subject_id="u", predicate="SAYS", statement=statement, valid_from=at(0))


def test_a_stamp_outdates_older_ones_and_all_once_the_user_is_absent() -> None:
    assert outdated(OLD, NEW) and outdated(NEW, LATER) and outdated(LATER, ABSENT)
    assert not outdated(NEW, NEW) and not outdated(NEW, OLD) and not outdated(ABSENT, ABSENT)


def test_results_at_outdated_stamps_go_and_the_others_stay() -> None:
    cache = ResultCache(size=10)
    cache.put(("a", "q1"), OLD, 60, "a's old answer")
    cache.put(("a", "q2"), NEW, 60, "a's answer")
    cache.put(("b", "q1"), OLD, 60, "b's answer")
    cache.drop_outdated("a", NEW)
    assert not cache.holds(("a", "q1")) and cache.get(("a", "q2"), NEW) == "a's answer"
    assert cache.get(("b", "q1"), OLD) == "b's answer"  # another user's stamp is not learned
    cache.drop_outdated("a", ABSENT)  # erased (``forget_user``)
    assert cache.users() == {"b"}


def test_a_result_found_outdated_or_expired_is_dropped_and_the_bounds_hold() -> None:
    cache = ResultCache(size=2)
    cache.put(("a", "q1"), OLD, 60, "old")
    assert cache.get(("a", "q1"), NEW) is None and not cache.holds(("a", "q1"))
    cache.put(("a", "q1"), NEW, -1, "expired")
    assert cache.get(("a", "q1"), NEW) is None and not cache.holds(("a", "q1"))
    cache.put(("a", "q1"), NEW, 60, "newer")
    assert cache.get(("a", "q1"), OLD) is None and cache.holds(("a", "q1"))  # a slower reader's: kept
    for n in range(5):  # the least recently used go, and their index entries with them
        cache.put(("b", f"q{n}"), OLD, 60, n)
    assert cache.users() == {"b"} and not cache.holds(("a", "q1"))
    cache.drop_outdated("b", NEW)
    assert cache.users() == set()


def test_records_at_an_outdated_stamp_go() -> None:
    facts, chunks = FactCache(), ChunkCache()
    facts.put("a", OLD, [_fact("a", "the planter")])
    chunks.episodes.put("a", OLD, [EpisodeChunkIds(id="e", chunk_ids=("c",))])
    facts.drop_outdated("a", OLD)
    assert facts.held("a", OLD)  # not outdated by its own stamp
    facts.drop_outdated("a", NEW)
    chunks.drop_outdated("a", NEW)
    assert facts.held("a", OLD) == {} and chunks.episodes.held("a", OLD) == {}
    facts.put("a", NEW, [_fact("a", "the planter")])
    assert facts.held("a", LATER) == {} and facts.held("a", NEW) == {}  # read at a newer stamp: gone
