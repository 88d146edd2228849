"""Removals applied to a held snapshot: the records a write removed (a forget of a fact or a message, decay's
expired chunks) taken out of it in memory, so a reader whose snapshot is behind such a write catches it up
from the ids the write removed (the change feed's ``gone``, or the graph's removal records read with
``user_changes`` or, off the recall's path, with ``refresh_snapshot``'s count) instead of loading the user
whole.

How: as an addition, in the snapshot's overlay (``overlay``), so a removal costs what it removed, not
the user's size: the removed rows hidden (``RecordRows.without``), each removed fact skipped in its
entities' orders (``Reranked.gone``), a removed chunk's episode list held whole in the overlay, a chunk
that listed a removed fact held again without it, and each removed document a hole in its keyword table
(``table_without``: the removed text restemmed, its terms' document frequencies counted down, no posting
copied). Folding the overlay and
copying the base's maps without the records, as it was done, cost a 10K-fact reader's catch-up of one
forget ~3-10 ms of CPU on the recall's path; the fold now comes after the catch-up, off it, on a reader
thread (``UserSnapshot.fold_due``: at once after a removal, so the hidden rows and the holes' postings, the
removed texts, leave the reader's memory with it).

Invariants: the snapshot ``without`` returns answers every read exactly as one built whole from the
records that remain (``tests/test_snapshot_overlay.py``): the same rows, each entity's facts in the same
rank order, each episode's chunks in the same order, a chunk's ``fact_ids`` without a removed fact, and
the same keyword hits with the same scores (``table_without`` leaves a hole where a removed document was,
out of the BM25 statistics, and every other document at its position, so the statistics and the id
tie-break are the remaining documents', exactly; the fold drops the holes, ``without_holes``). Ids
the snapshot does not hold (entities, records of another read) are ignored: applying a removal again is
harmless.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from engram_api.storage.snapshot.keywords import KeywordIndex, KeywordTable, TextTerms, dense_of, stems
from engram_api.storage.snapshot.overlay import Overlay
from engram_api.storage.snapshot.rows import CHUNK_FACTS, EPISODE, OBJECT, SOURCES, STATEMENT, SUBJECT

if TYPE_CHECKING:
    from engram_api.storage.snapshot.graph import UserSnapshot

__all__ = ["compacted", "table_without", "without", "without_holes"]


def without(snapshot: UserSnapshot, gone: Collection[str]) -> UserSnapshot:
    """``snapshot`` (at its stamp) with the facts and chunks among ``gone`` removed, in its overlay; itself
    when it holds none of them."""
    held_facts, held_chunks = snapshot.facts.rows(), snapshot.chunks.rows()
    facts_gone = {i for i in gone if i in held_facts}
    chunks_gone = {i for i in gone if i in held_chunks}
    if not facts_gone and not chunks_gone:
        return snapshot
    removed = {i: held_facts[i] for i in facts_gone}
    # A chunk lists the facts its episode stated: those removed leave the lists of their episodes' chunks.
    restated = {}
    for episode in {e for row in removed.values() for e in row[SOURCES]}:
        for cid in snapshot.episode_chunk_ids(episode):
            row = held_chunks.get(cid)
            if row is not None and cid not in chunks_gone and not facts_gone.isdisjoint(row[CHUNK_FACTS]):
                kept = tuple(f for f in row[CHUNK_FACTS] if f not in facts_gone)
                restated[cid] = (*row[:CHUNK_FACTS], kept, *row[CHUNK_FACTS + 1 :])
    by_entity: dict[str, set[str]] = {}
    for fid, row in removed.items():
        for entity in (row[SUBJECT], row[OBJECT]):
            if entity:
                by_entity.setdefault(entity, set()).add(fid)
    episodes = dict(snapshot.recent.episodes)
    for episode in {held_chunks[i][EPISODE] for i in chunks_gone}:
        episodes[episode] = tuple(c for c in snapshot.episode_chunk_ids(episode) if c not in chunks_gone)
    chunk_texts = {i: snapshot.chunks[i].indexed_text for i in chunks_gone}
    fact_texts = {i: held_facts[i][STATEMENT] for i in facts_gone}
    return dataclasses.replace(
        snapshot,
        facts=snapshot.facts.without(facts_gone),
        chunks=snapshot.chunks.without(chunks_gone).with_rows(restated),
        keywords=_index_without(snapshot.keywords, chunk_texts, fact_texts),
        recent=Overlay(touching=snapshot.recent.without_facts(by_entity), episodes=episodes),
        terms=TextTerms(),  # the removed texts' terms are not carried on
    )


def _index_without(index: KeywordIndex, chunks: Mapping[str, str], facts: Mapping[str, str]) -> KeywordIndex:
    """``index`` (its base and recent tables) without the documents among ``chunks`` and ``facts`` (id ->
    the text it was indexed from)."""
    recent = None if index.recent is None else _index_without(index.recent, chunks, facts)
    return KeywordIndex(
        chunks=table_without(index.chunks, chunks), facts=table_without(index.facts, facts), recent=recent
    )


def table_without(table: KeywordTable, gone: Mapping[str, str]) -> KeywordTable:
    """``table`` without the documents among ``gone`` (id -> the text it was indexed from), each left a hole
    (``KeywordTable.holes``): its length zeroed and its terms' document frequencies counted down
    (``hole_df``), every posting and position kept, so a removal costs what the removed text holds, not its
    terms' postings (a copy of them without it cost ~15 ms at 100K facts, the user's "user" in every
    statement; a renumbering of every posting after the first removed ~8 ms at 10K facts, on a reader's
    catch-up). The holes stay until the snapshot's fold drops them (``without_holes``): they count towards
    it, so they are never more than the overlay's fold share."""
    at = {pos: gone[i] for i, pos in _positions(table, list(gone)).items()}
    if not at:
        return table
    terms = {pos: stems(text) for pos, text in at.items()}
    if not all(_indexed(table, pos, t) for pos, t in terms.items()):  # not the text it was indexed from
        return compacted(table, at)
    lengths = table.lengths.copy()
    lengths[np.fromiter(at, dtype=np.int64, count=len(at))] = 0.0
    hole_df = dict(table.hole_df)
    for term in chain.from_iterable(set(t) for t in terms.values()):
        hole_df[term] = hole_df.get(term, 0) + 1
    return dataclasses.replace(table, lengths=lengths, hole_df=hole_df, holes=table.holes | at.keys())


def _indexed(table: KeywordTable, pos: int, terms: list[str]) -> bool:
    """Whether the document at ``pos`` was indexed from a text of ``terms``: as many terms, each of them posted
    at ``pos`` (a posting's positions ascend: a binary search each)."""
    if len(terms) != table.lengths[pos]:
        return False
    for term in set(terms):
        posting = table.postings.get(term)
        if posting is None:
            return False
        where = posting[0]
        i = int(np.searchsorted(where, pos))
        if i == len(where) or where[i] != pos:
            return False
    return True


def _positions(table: KeywordTable, ids: list[str]) -> dict[str, int]:
    """The position of each of ``ids`` the table holds (a hole's id is not held: removed before, it has
    nothing left to take out)."""
    if not table.ids or not ids:
        return {}
    wanted = np.asarray([i.encode() for i in ids], dtype=bytes)
    # An id removed and written again is held twice, once as a hole: the other is its position.
    firsts = np.searchsorted(table.sorted_ids, wanted).tolist()
    lasts = np.searchsorted(table.sorted_ids, wanted, side="right").tolist()
    out = {}
    for i, first, last in zip(ids, firsts, lasts, strict=True):
        held = [p for p in table.by_id[first:last].tolist() if p not in table.holes]
        if held:
            out[i] = held[0]
    return out


def without_holes(index: KeywordIndex) -> KeywordIndex:
    """``index`` (a base: no recent tables) with its tables' holes dropped, on the fold's reader thread (a
    100K-fact table's compaction took ~0.6 s of CPU; in the catch-up that reached the share it was on the
    recall's path)."""
    return KeywordIndex(chunks=compacted(index.chunks, ()), facts=compacted(index.facts, ()))


def compacted(table: KeywordTable, drop: Collection[int]) -> KeywordTable:
    """``table`` without its holes and the documents at positions ``drop``, the others in their order
    (positions shifted down): what ``KeywordTable.of`` builds from the remaining documents, with no text
    stemmed again."""
    n = len(table.ids)
    if not table.holes and not drop:
        return table
    keep = np.ones(n, dtype=bool)
    keep[[*table.holes, *drop]] = False
    position = np.cumsum(keep) - 1  # old position -> new one (for the kept)
    postings = _postings_without(table.postings, keep, position)
    in_order = keep[table.by_id]
    by_id = position[table.by_id[in_order]]
    rank = np.empty(len(by_id), dtype=np.int64)
    rank[by_id] = np.arange(len(by_id))
    cuts = np.flatnonzero(~keep).tolist()
    runs = (table.ids[start + 1 : end] for start, end in zip([-1, *cuts], [*cuts, n], strict=True))
    return KeywordTable(
        ids=tuple(chain.from_iterable(runs)),
        lengths=table.lengths[keep],
        sorted_ids=table.sorted_ids[in_order],
        by_id=by_id,
        rank=rank,
        postings=postings,
        forms=table.forms,
        places=table.places,
        dense=dense_of(postings, len(by_id), table.forms.shape[1]),
    )


def _postings_without(
    postings: Mapping[str, tuple[np.ndarray, np.ndarray]], keep: np.ndarray, position: np.ndarray
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every term's postings without the positions ``keep`` drops, the others renumbered by ``position``;
    a term left with none goes. A term's positions ascend, so one whose last is before the first dropped is
    kept as it is, one that holds none of the dropped keeps its forms (only its positions move), and
    only the removed documents' terms are filtered. The positions are renumbered in one pass of array
    operations over all the postings laid end to end, then cut back into slices: a user's tables hold tens of
    thousands of terms (names, numbers, rare words), and each array call per term costs a microsecond or
    more (the fold after a forget, ~5 ms of a 10K-fact table's compaction went to a second slice, a test and
    a copy per term)."""
    if not postings:
        return {}
    terms, values = list(postings), list(postings.values())
    ats = [at for at, _ in values]
    ends = np.cumsum(np.fromiter(map(len, ats), dtype=np.int64, count=len(ats)))
    starts = np.concatenate([[0], ends[:-1]])
    every = np.concatenate(ats)
    renumbered = position[every].astype(every.dtype)
    dropped = ~keep[every]
    moved = every[ends - 1] >= int(np.argmin(keep))  # a position at or after the first dropped
    losing = np.add.reduceat(dropped, starts) > 0  # a dropped position among its own
    out = dict(postings)
    first, last = starts.tolist(), ends.tolist()
    out.update(
        {terms[i]: (renumbered[first[i] : last[i]], values[i][1]) for i in np.flatnonzero(moved & ~losing).tolist()}
    )
    for i in np.flatnonzero(losing).tolist():
        held = ~dropped[first[i] : last[i]]
        if held.any():
            out[terms[i]] = (renumbered[first[i] : last[i]][held], values[i][1][held])
        else:
            del out[terms[i]]
    return out
