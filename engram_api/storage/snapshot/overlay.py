"""What a held snapshot keeps apart from its base: the records written since, so merging one write costs
what the write changed, not the user's size.

Why: a snapshot is immutable (a recall holds the one it read while a reader thread swaps a newer one in),
so merging a change-feed entry into it copied what it changed: the fact rows' dict, the keyword index's
postings and id arrays, and the whole rank order of every entity a new fact mentions. For the ``hosts``
bench's 100K-fact user one new fact cost ~9.8 ms of CPU that way (4.0 the rows, 3.5 the keyword index, 0.9
the user's own node's 79K-fact order), on the recall's path (a recall right after another host's write
waits for its catch-up): 6.7x the floor. Now a snapshot is a base and an overlay:
- the records (``RecordRows``): the base's dict and a small dict of the rows written since (new facts and
  chunks, and new versions of base facts: a supersession, a reinforcement), which hides the base's row;
- the keyword index (``KeywordIndex.recent``): a small index of the documents added since, searched with
  the base under the union's statistics (``keywords.ranked``), so scores are the union's;
- each entity's facts in rank order (``Overlay.touching``): for an entity a write reached, the facts it
  placed (new, or whose importance changed) in rank order and the base's ids whose place is no longer
  theirs; a walk interleaves them with the base's order as it reads (``Overlay.entity_facts``);
- each episode's chunks (``Overlay.episodes``): the whole (short) list of an episode a write added to.
Growing the overlay copies the overlay, never the base. Once it holds ``1 / MERGE_SHARE`` of the user's
records (at least ``MERGE_MIN``), ``UserSnapshot.merged`` folds it into a new base off any recall's path
(``SnapshotCache.fold_soon``, on a reader thread once no recall of the process is in flight:
``ReaderThreads.when_idle``): one copy of the user per that many records written.

Invariants: a snapshot with an overlay answers every read exactly as the snapshot its merge gives, and as
one built whole from the same records (``tests/test_snapshot_overlay.py``): the same records, each
entity's facts in the same order, the same keyword hits with the same scores. Removals are kept in it too
(``removal.without``): a removed base record is hidden (``RecordRows.gone``, ``Reranked.gone``, its
episode's list in ``episodes``, a hole in the keyword tables), and counts towards the fold as a record.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from engram_api.storage.snapshot.rows import IMPORTANCE, Row

__all__ = ["MERGE_MIN", "MERGE_SHARE", "Overlay", "Reranked", "merge_due", "reranked"]

# An overlay is folded into a new base once it holds this share of the user's records: a fold copies the
# user's snapshot (~10 ms of CPU at 100K facts), so one write in every few hundred pays for it, off the path.
MERGE_SHARE = 32
MERGE_MIN = 64  # a small user's overlay is folded at this many records (a fold of it costs little anyway)


def merge_due(recent: int, size: int) -> bool:
    """True when an overlay of ``recent`` records over a snapshot of ``size`` records is to be folded."""
    return recent >= max(MERGE_MIN, size // MERGE_SHARE)


@dataclass(frozen=True, slots=True)
class Reranked:
    """One entity's facts written since the base that the base's order does not place: ``placed`` (new
    facts, or facts whose importance changed) in rank order, and the base's ids to skip (``gone``: a fact
    placed again)."""

    placed: tuple[str, ...] = ()
    gone: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Overlay:
    """A snapshot's entity orders and episode lists written since its base (the module docstring)."""

    touching: Mapping[str, Reranked] = field(default_factory=dict)
    episodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def entity_facts(self, entity: str, base: Mapping[str, tuple[str, ...]], rows: Mapping[str, Row]) -> Iterable[str]:
        """The facts mentioning ``entity`` in the stores' rank order (importance descending, id descending):
        the base's order, or, for an entity a write reached, it and the placed facts interleaved lazily (a
        walk reads an entity's facts only as far as it needs)."""
        order = base.get(entity, ())
        moved = self.touching.get(entity)
        return order if moved is None else _interleaved(order, moved, rows)

    def episode_chunks(self, episode: str, base: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
        """The episode's chunks, in conversation order."""
        held = self.episodes.get(episode)
        return base.get(episode, ()) if held is None else held

    def with_facts(
        self, reached: Mapping[str, list[str]], base_rows: Mapping[str, Row], rows: Mapping[str, Row]
    ) -> dict[str, Reranked]:
        """``touching`` after a write whose new or re-ranked facts are ``reached`` (entity -> those facts),
        ``rows`` the facts as they are now: only the reached entities' overlay entries are touched."""
        touching = dict(self.touching)
        for entity, moving in reached.items():
            was = touching.get(entity, Reranked())
            gone = {i for i in moving if i in base_rows}
            touching[entity] = Reranked(placed=reranked(was.placed, moving, rows, was.placed), gone=was.gone | gone)
        return touching

    def without_facts(self, removed: Mapping[str, Collection[str]]) -> dict[str, Reranked]:
        """``touching`` after a removal of facts (entity -> its facts removed): they leave the placed ones,
        and the base's order skips them."""
        touching = dict(self.touching)
        for entity, gone in removed.items():
            was = touching.get(entity, Reranked())
            placed = tuple(i for i in was.placed if i not in gone)
            touching[entity] = Reranked(placed=placed, gone=was.gone | frozenset(gone))
        return touching

    def merged_touching(
        self, base: Mapping[str, tuple[str, ...]], rows: Mapping[str, Row]
    ) -> dict[str, tuple[str, ...]]:
        """The base's orders with this overlay's folded in (a copy of the base's map: ``UserSnapshot.merged``);
        an entity left with no fact has no entry, as in a snapshot built whole."""
        return _nonempty(base, {e: _folded(base.get(e, ()), moved, rows) for e, moved in self.touching.items()})

    def merged_episodes(self, base: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        """The base's episode lists with this overlay's in their place (an episode left with no chunk has no
        entry)."""
        return _nonempty(base, self.episodes)


def _nonempty(base: Mapping[str, tuple[str, ...]], lists: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """A copy of ``base`` with ``lists`` in their place, an empty one's key dropped."""
    out = {**base, **lists}
    for key, ids in lists.items():
        if not ids:
            del out[key]
    return out


def _folded(order: tuple[str, ...], moved: Reranked, rows: Mapping[str, Row]) -> tuple[str, ...]:
    """``_interleaved`` as one tuple: each placed fact's place found by binary search (its places ascend
    as its ranks descend), the base's runs between them copied as slices (the user's own node's 79K facts:
    a walk of them all, element by element, cost a fold ~0.25 s)."""
    kept = [i for i in order if i not in moved.gone] if moved.gone else order
    out: list[str] = []
    at = 0
    for fid in moved.placed:
        lo = _place(kept, fid, rows, at)
        out += kept[at:lo]
        out.append(fid)
        at = lo
    out += kept[at:]
    return tuple(out)


def _interleaved(order: tuple[str, ...], moved: Reranked, rows: Mapping[str, Row]) -> Iterator[str]:
    """``order`` without ``moved.gone`` and ``moved.placed`` merged in by rank (both ranked, ids distinct)."""
    placed, gone, j = moved.placed, moved.gone, 0
    for fid in order:
        if fid in gone:
            continue
        if j < len(placed):
            rank = (rows[fid][IMPORTANCE], fid)
            while j < len(placed) and (rows[placed[j]][IMPORTANCE], placed[j]) > rank:
                yield placed[j]
                j += 1
        yield fid
    yield from placed[j:]


def reranked(
    order: tuple[str, ...], moving: list[str], facts: Mapping[str, Row], before: Iterable[str] | Mapping[str, Row]
) -> tuple[str, ...]:
    """``order`` (an entity's facts, importance descending, id descending) with ``moving`` (new facts, or
    facts whose importance changed) in their place, each inserted by binary search: a hub entity's tens of
    thousands of facts cost O(log n) rank reads per change, not a sort (4.6 of a 10K-fact refresh's 6 ms).
    Only facts held ``before`` are looked for in ``order``: new ones only are copied past (the 100K-fact
    user's owner, in 80K facts: 6 of a one-fact refresh's 11 ms went to looking)."""
    if not moving:
        return order
    gone = {i for i in moving if i in before}
    out = [i for i in order if i not in gone] if gone else list(order)
    for fid in moving:
        out.insert(_place(out, fid, facts), fid)
    return tuple(out)


def _place(order: Sequence[str], fid: str, rows: Mapping[str, Row], lo: int = 0) -> int:
    """Where ``fid`` goes in ``order`` (ranked: importance descending, id descending), at ``lo`` or after:
    a binary search, O(log n) rank reads."""
    rank, hi = (rows[fid][IMPORTANCE], fid), len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if (rows[order[mid]][IMPORTANCE], order[mid]) > rank:
            lo = mid + 1
        else:
            hi = mid
    return lo
