"""A snapshotted user's keyword index in memory: BM25 over the snapshot's chunks and fact statements, so
recall of a user a reader holds whole asks the store nothing at all.

Why: with the graph step answered from ``UserSnapshot``, the keyword search was the one store round trip
left in such a recall (~5 ms on Neo4j for a 10K-fact user, docs/benchmarks/history.md, stop 36), and it made
Neo4j's recall slower than SQLite's on the same snapshot. Why our own rather than a BM25 library
(``bm25s``, ``rank_bm25``): a snapshot is refreshed with only what was written since
(``UserSnapshot.updated``), and this index is too (``added``: the touched terms' postings grow, nothing
else is rebuilt); the libraries score a corpus they index whole.

What it computes, so a newcomer can hold it against the stores' full-text indexes:
- analysis as the stores': the words of ``episodes.words`` (runs of letters and digits, lower-cased, the
  stop words dropped) stemmed by the original Porter algorithm, the stemmer of Neo4j's ``english``
  analyzer (Lucene's ``PorterStemFilter``) and of SQLite's ``porter`` tokenizer (PyStemmer, C);
- two tables as in the stores: chunks (``ChunkRecord.indexed_text``: the speaker's name with the words)
  and facts (``statement``), each with its own statistics and each giving its own top k;
- BM25 with k1 = 1.2, b = 0.75 and Lucene's IDF ``ln(1 + (N - n + 0.5) / (n + 0.5))`` (never zero, so
  every document holding a query word scores), over the user's own documents only: the stores compute
  IDF and average length over every user's rows of the index, so their scores, and the order of near
  ties, can differ from these; which documents match is the same (``tests/test_keyword_index.py`` and
  the contract suite hold it against both stores);
- ties are broken by node id, as the stores' answers are sorted, so a refreshed index answers exactly as
  a freshly built one;
- a removed document leaves a hole at its position (``holes``, ``removal.table_without``): its length zero,
  not counted among the documents nor in its terms' document frequencies (``hole_df``), never a match, so
  the statistics are the remaining documents' and the other positions keep theirs (renumbering every
  posting cost a removal ~8 ms at 10K facts); its postings stay until the fold compacts the table (copying
  its terms' postings without it cost a removal ~15 ms at 100K facts, "user" being in all of them);
- a word in a quarter of the documents or more is first added only to the documents a rarer query word
  found, which settles the top k when its k-th outscores every common word together (MaxScore): the same
  answers, a 100K-fact user's search 3.1 -> 1.8 ms with its "user" in 79K statements; the common word is
  looked up for those documents in an array over the table's positions (``dense``, a byte or two a
  document), not by a binary search of its postings;
- a posting holds its form, the place of its (term frequency, document length) among the table's
  distinct pairs (``forms``: 3 for the 10K bulk statements, 64 for a LoCoMo conversation's 369 turns), so
  a search computes BM25's share of a term once a form, with the union's N and average length of that
  moment, and gathers it for the postings (``_weights``): no contribution is precomputed, so a write, which
  changes N and the average, changes nothing held, and the floats are those of the formula on each posting
  (the same operations on the same numbers);
- the best 4k of the matches are selected by (score, id), never by score alone: a common word scores
  thousands of documents alike; the cut is found by a sort of the scores, because numpy's selections
  degenerate on equal floats (``_top``).

What a search costs (``ops/bench/keyword_search.py``, docs/benchmarks/history.md, 2026-12-07): forms, dense
lookups, the cut by a sort and hits validated in one call took the bulk users' searches 0.36-0.37 -> 0.21-0.23
ms at 10K facts and 1.37 -> 0.56 ms at 100K (thread CPU, medians, alternated), with byte-identical recall
answers; one write's catch-up of the index costs ~7 us more (the forms' places copied).

Invariants: immutable once built (a reader thread swaps a new snapshot in; a recall holds the one it
read); a fact's statement never changes, so a refresh that brings a known fact again leaves its entry be.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

import numpy as np
import Stemmer
from pydantic import TypeAdapter

from engram_api.models import KeywordHit
from engram_api.storage.graph.episodes import words

__all__ = ["KeywordIndex", "KeywordTable", "TextTerms", "dense_of", "stems"]

_K1 = 1.2
_B = 0.75
# (document positions int32, forms int32: at each, the term's frequency and the document's length as a place in
# ``KeywordTable.forms``)
_Postings = tuple[np.ndarray, np.ndarray]
_Term = tuple[str, int, list[_Postings | None]]  # a query term, its documents, its postings by table
_DENSE_MIN = 1_024  # a table of fewer documents holds no ``dense`` frequencies: its postings are short


_local = threading.local()
_HITS = TypeAdapter(list[KeywordHit])


def _stemmer() -> Stemmer.Stemmer:
    """This thread's stemmer: a PyStemmer object (the Snowball stemmer's state) is not to be shared between
    threads, and the reader's threads search while another loads a snapshot. Without PyStemmer's cache of
    the words it stemmed (``maxCacheSize`` 0): a memo of the process that kept the words of forgotten texts,
    and slower than stemming them again (10K facts' and chunks' 140K words: 125-131 ms with it, 92-98 without)."""
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = Stemmer.Stemmer("porter", 0)
    return stemmer


def stems(text: str) -> list[str]:
    """The indexed terms of ``text``: its words (``episodes.words``), Porter-stemmed, repeats kept."""
    return _stemmer().stemWords(words(text))


class TextTerms(dict[str, frozenset[str]]):
    """The indexed terms of texts (``stems``, as a set) by text, stemmed on first reading (``terms[text]``):
    recall scores each keyword hit by the share of the query's terms its text holds
    (``reader.scoring.word_share``), a user's hits recur from query to query, and stemming ~80 of them again at
    every recall measured 7.7 ms at load 23. A dict whose ``__missing__`` stems: a held text costs one C dict
    lookup (a Python ``__call__`` cost 2.4x the process-wide ``lru_cache`` it replaces).

    One memo per user's held state, never per process: a held snapshot's (``UserSnapshot.terms``, carried by
    a refresh that only added records and begun anew by one that removed any) or the reader's memo of a user
    it holds no snapshot of (``reader.terms``), so a forgotten text and its terms go with that state. At most
    ``limit`` texts, the older half dropped when full (a snapshot's holds no more texts than it has records, so
    the memos of the snapshots held are bounded by their budget too; 4,096 was below the working set of 150
    recalls of the 100K-fact user, whose hits were then stemmed again at every recall: +0.3 ms). Safe to share
    between threads: a miss stems, then stores under a lock.

    ``read``: another reading of the same texts kept with them (the dates a turn's words name,
    ``reader.cues``), by whatever key holds the text, bounded and dropped alike."""

    __slots__ = ("_lock", "_read", "limit")

    def __init__(self, limit: int = 16_384) -> None:
        super().__init__()
        self.limit = limit
        self._lock = threading.Lock()
        self._read: dict[Hashable, object] = {}

    def read(self, key: Hashable, make: Callable[[], object]) -> object:
        """The reading kept under ``key``, made by ``make`` on first asking."""
        held = self._read.get(key)
        if held is None:
            held = make()
            with self._lock:
                if len(self._read) >= self.limit:
                    for old in list(islice(self._read, self.limit // 2)):
                        self._read.pop(old, None)
                self._read[key] = held
        return held

    def __missing__(self, text: str) -> frozenset[str]:
        terms = frozenset(stems(text))
        with self._lock:
            if len(self) >= self.limit:
                for old in list(islice(self, self.limit // 2)):
                    self.pop(old, None)
            self[text] = terms
        return terms


def dense_of(
    postings: Mapping[str, _Postings], n: int, forms: int, terms: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """``KeywordTable.dense`` of a table of ``n`` positions and ``forms`` forms: each term posted at a quarter
    of them or more (in a table of ``_DENSE_MIN`` or more), its form + 1 at every position (0 where it is not)
    in the least unsigned integers that hold it: 1-2 bytes a document, where its postings take 8 a document
    holding it. ``terms``: the only ones that can be (a grown table's: those of its old ``dense`` and those
    whose postings grew, since a term it did not hold at a quarter of fewer positions does not hold now), or
    None for every term (a user's tables hold tens of thousands: a loop over them all costs the fold ms)."""
    if n < _DENSE_MIN:
        return {}
    out = {}
    for term in postings if terms is None else terms:
        at, form = postings[term]
        if 4 * len(at) >= n:
            freq = np.zeros(n, dtype=np.min_scalar_type(forms))
            freq[at] = form + 1
            out[term] = freq
    return out


@dataclass(frozen=True, slots=True)
class KeywordTable:
    """One table's documents (ids in position order), their lengths in terms, each one's rank by id (the
    tie-break; kept with the ids in sorted order and the positions in that order, so a refresh merges its
    few new ids in rather than sorting them all: 2.7 -> 0.4-1.0 ms for one new fact of a 10K-fact table),
    and each term's postings: a posting's form is the place in ``forms`` of its (term frequency, document
    length), as few as the table's distinct pairs, so a search computes BM25's share of a term once a form
    and gathers it for every posting (``_weights``). A removed document's position is a hole (``holes``):
    its id stays in ``ids`` and ``sorted_ids`` (the others' ranks keep their order), its length is zero,
    its postings stay (a search skips it) and ``hole_df`` counts them out of each of its terms' document
    frequencies."""

    ids: tuple[str, ...]
    lengths: np.ndarray
    # the ids as UTF-8, sorted (bytes order is code point order; a quarter of str's 4 B a character)
    sorted_ids: np.ndarray
    by_id: np.ndarray  # the positions of ``sorted_ids``
    rank: np.ndarray  # position -> its place in ``sorted_ids``
    postings: Mapping[str, _Postings]
    forms: np.ndarray  # (2, forms) float64: each form's term frequency, then its document length
    places: Mapping[tuple[float, float], int]  # each form's place by its (term frequency, document length)
    holes: frozenset[int] = frozenset()
    hole_df: Mapping[str, int] = field(default_factory=dict)  # term -> the holes among its postings
    # term -> its form + 1 at every position (0: not held), for the terms in a quarter of the positions or
    # more (``dense_of``): what a search looks a common word up in for the documents a rarer word found
    dense: Mapping[str, np.ndarray] = field(default_factory=dict)
    # the lengths' sum, once (a search's average length read it at every search: ~0.1 ms at 100K facts); the
    # lengths are whole numbers, so it is exact and the same in any order of summing
    total: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", float(self.lengths.sum()))

    def df(self, term: str) -> int:
        """The documents holding ``term`` (its postings, the holes not counted)."""
        posting = self.postings.get(term)
        return 0 if posting is None else len(posting[0]) - self.hole_df.get(term, 0)

    @property
    def live(self) -> int:
        """The documents held (the holes not counted)."""
        return len(self.ids) - len(self.holes)

    @classmethod
    def of(cls, docs: Iterable[tuple[str, str]]) -> KeywordTable:
        """The table of ``docs``: (node id, text) pairs with distinct ids."""
        none = np.zeros(0, dtype=np.int64)
        empty = cls(
            ids=(),
            lengths=np.zeros(0),
            sorted_ids=np.array([], dtype=bytes),
            by_id=none,
            rank=none,
            postings={},
            forms=np.zeros((2, 0)),
            places={},
        )
        return empty.added(docs)

    def added(self, docs: Iterable[tuple[str, str]]) -> KeywordTable:
        """This table with ``docs`` (distinct ids it does not hold) appended; only their terms are touched."""
        ids, lengths = list(self.ids), []
        places = dict(self.places)
        grown: dict[str, tuple[list[int], list[int]]] = {}
        for node_id, text in docs:
            terms = stems(text)
            size = len(terms)
            for term, tf in Counter(terms).items():
                at, form = grown.setdefault(term, ([], []))
                at.append(len(ids))
                form.append(places.setdefault((tf, size), len(places)))
            ids.append(node_id)
            lengths.append(size)
        if not lengths:
            return self
        postings = dict(self.postings)
        for term, (at, form) in grown.items():
            old = postings.get(term)
            new = (np.asarray(at, dtype=np.int32), np.asarray(form, dtype=np.int32))
            postings[term] = (
                new if old is None else (np.concatenate([old[0], new[0]]), np.concatenate([old[1], new[1]]))
            )
        fresh = np.asarray([i.encode() for i in ids[len(self.ids) :]], dtype=bytes)
        order = np.argsort(fresh) if len(fresh) > 1 else np.zeros(1, dtype=np.int64)
        sorted_ids, by_id, rank = _with_ids(self.sorted_ids, self.by_id, fresh[order], order + len(self.ids))
        return KeywordTable(
            ids=tuple(ids),
            lengths=np.concatenate([self.lengths, np.asarray(lengths, dtype=np.float64)]),
            sorted_ids=sorted_ids,
            by_id=by_id,
            rank=rank,
            postings=postings,
            forms=self._forms(places),
            places=places,
            holes=self.holes,
            hole_df=self.hole_df,
            dense=dense_of(postings, len(ids), len(places), self._dense_terms(grown)),
        )

    def _dense_terms(self, grown: Iterable[str]) -> set[str] | None:
        """The terms that can be ``dense`` once this table's postings of ``grown`` grow (``dense_of``): all of
        them when this table is too small to have laid its common terms out."""
        return None if len(self.ids) < _DENSE_MIN else {*self.dense, *grown}

    def _forms(self, places: Mapping[tuple[float, float], int]) -> np.ndarray:
        """``forms`` of ``places``: this table's and those appended since, each at its place."""
        if len(places) == len(self.places):
            return self.forms
        return np.asarray(list(places), dtype=np.float64).reshape(-1, 2).T

    def joined(self, other: KeywordTable) -> KeywordTable:
        """This table with ``other``'s documents (ids it does not hold) appended, as ``added`` appends
        them, with no text stemmed again (``overlay`` folds its recent documents into a base so)."""
        if not other.ids:
            return self
        shift = len(self.ids)
        places = dict(self.places)
        moved = np.asarray([places.setdefault(pair, len(places)) for pair in other.places], dtype=np.int32)
        postings = dict(self.postings)
        for term, (at, form) in other.postings.items():
            old = postings.get(term)
            postings[term] = (
                (at + shift, moved[form])
                if old is None
                else (np.concatenate([old[0], at + shift]), np.concatenate([old[1], moved[form]]))
            )
        sorted_ids, by_id, rank = _with_ids(self.sorted_ids, self.by_id, other.sorted_ids, other.by_id + shift)
        return KeywordTable(
            ids=self.ids + other.ids,
            lengths=np.concatenate([self.lengths, other.lengths]),
            sorted_ids=sorted_ids,
            by_id=by_id,
            rank=rank,
            postings=postings,
            forms=self._forms(places),
            places=places,
            holes=self.holes | {h + shift for h in other.holes},
            hole_df=dict(Counter(self.hole_df) + Counter(other.hole_df)),
            dense=dense_of(postings, len(rank), len(places), self._dense_terms(other.postings)),
        )

    def ranked(self, terms: Sequence[str], k: int, keep: Callable[[str], bool]) -> list[tuple[str, float]]:
        """The best ``k`` documents ``keep`` accepts holding any of ``terms`` (stemmed query words), as
        (node id, BM25 score), best first, ties by node id."""
        return ranked((self,), terms, k, keep)

    def _weights(self, form: np.ndarray, avg: float, idf: float) -> np.ndarray:
        """The BM25 share of a term of inverse document frequency ``idf`` at postings of forms ``form``:
        computed for each of the table's forms (few: tens for a conversation's turns), then
        gathered, where it was computed for every posting (79K for the 100K-fact user's "user", ~0.8 ms). The
        same operations on the same numbers (a form's length is its document's), so the same floats; a hole's
        length is zero, its forms' are not, but a hole's score is never seen (``_best`` skips it, and
        the order of the others does not depend on it)."""
        tf, length = self.forms
        share = idf * tf * (_K1 + 1.0) / (tf + _K1 * (1.0 - _B + _B * length / avg))
        return share[form]

    def _holding(self, term: str, posting: _Postings, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions among ``cand`` (ascending) whose documents hold ``term`` (``posting`` its postings
        here), and its form at each: read from ``dense`` for a common word (a gather: a binary search of 20K
        candidates in the 79K postings of the 100K-fact user's "user" took ~0.8 ms)."""
        dense = self.dense.get(term)
        if dense is not None:
            form = dense[cand]
            hit = np.flatnonzero(form)
            return cand[hit], form[hit].astype(np.int32) - 1
        at, form = posting
        slot = np.minimum(np.searchsorted(at, cand), len(at) - 1)  # a posting's positions ascend
        hit = at[slot] == cand
        return cand[hit], form[slot[hit]]

    def _best(
        self, matched: np.ndarray, scores: np.ndarray, k: int, keep: Callable[[str], bool]
    ) -> list[tuple[str, float]]:
        """The best ``k`` of ``matched`` (positions, ``scores`` theirs) that ``keep`` accepts, best first,
        ties by id; a hole is never one."""
        kept: list[tuple[str, float]] = []
        holes = self.holes
        # Ordered first are only the 4k best by (score, id) (``keep`` refuses few), then, if ``keep`` refused
        # too many of them, the rest.
        top = _top(scores, self.rank, matched, 4 * k)

        def parts() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            if top is None:
                yield matched, scores
                return
            yield matched[top], scores[top]
            rest = np.ones(len(matched), dtype=bool)
            rest[top] = False
            yield matched[rest], scores[rest]

        for at, sc in parts():
            order = np.lexsort((self.rank[at], -sc))
            for pos, score in zip(at[order].tolist(), sc[order].tolist(), strict=True):
                if pos in holes:
                    continue
                node_id = self.ids[pos]
                if keep(node_id):
                    kept.append((node_id, score))
                    if len(kept) == k:
                        return kept
        return kept


def _with_ids(
    sorted_ids: np.ndarray, by_id: np.ndarray, fresh: np.ndarray, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A table's ``sorted_ids`` and ``by_id`` with ``fresh`` (new ids as UTF-8, sorted) at ``positions`` merged
    in, and every position's ``rank``. One new id (a catch-up's one new fact) is put in by joining slices:
    ``np.insert``'s own checks cost ~10 us a call, twice a refresh on a reader's path."""
    if len(fresh) == 1:
        at = int(np.searchsorted(sorted_ids, fresh[0]))
        # ``concatenate`` widens the bytes to the longer id, as ``insert`` after ``astype`` does: never cut
        sorted_ids = np.concatenate((sorted_ids[:at], fresh, sorted_ids[at:]))
        by_id = np.concatenate((by_id[:at], positions, by_id[at:]))
    else:
        slots = np.searchsorted(sorted_ids, fresh)
        wide = np.result_type(sorted_ids, fresh)  # a longer id widens the bytes array, never cut
        sorted_ids = np.insert(sorted_ids.astype(wide, copy=False), slots, fresh)
        by_id = np.insert(by_id, slots, positions)
    rank = np.empty(len(by_id), dtype=np.int64)
    rank[by_id] = np.arange(len(by_id))
    return sorted_ids, by_id, rank


def _top(scores: np.ndarray, rank: np.ndarray, matched: np.ndarray, m: int) -> np.ndarray | None:
    """The places of the best ``m`` of ``scores`` (those of the positions ``matched``) by (score descending,
    the position's ``rank`` ascending), in no order; None when that is all of them: those above the ``m``-th
    best score and the lowest ranks of those equal to it. A common word alone scores a document by its length
    only, so thousands of scores are equal, and numpy's selections (``partition``, ``argpartition``) degenerate
    on equal floats (the 100K-fact user's "user": 79K scores of three values, 7-9 ms; 2.3 ms on a (-score, rank)
    complex key, the way it was done); a sort of the values does not (~0.15 ms), and the ranks of the equal
    ones are distinct."""
    if len(scores) <= m:
        return None
    cut = np.sort(scores)[len(scores) - m]
    above, tied = np.flatnonzero(scores > cut), np.flatnonzero(scores == cut)
    need = m - len(above)
    if need < len(tied):
        tied = tied[np.argpartition(rank[matched[tied]], need - 1)[:need]]
    return np.concatenate([above, tied])


def ranked(
    tables: Sequence[KeywordTable], terms: Sequence[str], k: int, keep: Callable[[str], bool]
) -> list[tuple[str, float]]:
    """``KeywordTable.ranked`` over the union of ``tables`` (distinct ids: a base and the documents added
    since, ``overlay``) without joining them: the statistics (documents, lengths, each term's documents)
    are the union's, each table scores its own documents with them and the answers are merged by (score,
    id), so the union answers exactly as one table of all its documents (the same sums in the same order)."""
    n = sum(t.live for t in tables)
    if not n or k <= 0:
        return []
    avg = sum(t.total for t in tables) / n or 1.0
    held: list[_Term] = []  # per query term: it, its documents, its postings by table
    for term in dict.fromkeys(terms):
        parts = [t.postings.get(term) for t in tables]
        df = sum(t.df(term) for t, p in zip(tables, parts, strict=True) if p is not None)
        if df:
            held.append((term, df, parts))
    rare = [h for h in held if 4 * h[1] < n]
    common = [h for h in held if 4 * h[1] >= n]

    def idf(df: int) -> float:
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def scores_of(i: int, terms: list[_Term]) -> np.ndarray:
        scores = np.zeros(len(tables[i].ids))
        for _, df, parts in terms:
            p = parts[i]
            if p is not None:
                scores[p[0]] += tables[i]._weights(p[1], avg, idf(df))
        return scores

    # Terms in a quarter of the documents or more (the 100K-fact user's "user": 79K) score little each
    # (IDF <= 1.2) and cost the most: first rank the documents holding a rarer term, adding the common
    # terms' share to those alone; that is the answer when the k-th kept of them outscores all the common
    # terms together (a document holding only those), else score them all (MaxScore, Turtle and Flood 1995).
    # The rare terms' shares are added first on both paths: the same sums. A weight is positive: the
    # documents holding a term are those scored above zero (a float's ``!= 0`` costs 5x a ``> 0``).
    if common and rare:
        ceiling = sum(idf(df) * (_K1 + 1.0) for _, df, _ in common)
        answers = []
        for i, table in enumerate(tables):
            if all(parts[i] is None for _, _, parts in rare):
                continue  # no rare word: no candidate in this table
            scores = scores_of(i, rare)
            cand = np.flatnonzero(scores > 0.0)
            for term, df, parts in common:
                p = parts[i]
                if p is not None and len(cand):
                    at, form = table._holding(term, p, cand)
                    scores[at] += table._weights(form, avg, idf(df))
            answers.append(table._best(cand, scores[cand], k, keep))
        kept = _merged(answers, k)
        if len(kept) == k and kept[-1][1] > ceiling:
            return kept
    answers = []
    for i, table in enumerate(tables):
        found = [(df, p) for _, df, parts in rare + common if (p := parts[i]) is not None]
        if len(found) == 1:  # one word (a common one, often): its postings are the matches (0.0 + w is w)
            df, (at, form) = found[0]
            answers.append(table._best(at, table._weights(form, avg, idf(df)), k, keep))
        elif found:  # a small recent table seldom holds a query word
            scores = scores_of(i, rare + common)
            matched = np.flatnonzero(scores > 0.0)
            answers.append(table._best(matched, scores[matched], k, keep))
    return _merged(answers, k)


def _merged(answers: list[list[tuple[str, float]]], k: int) -> list[tuple[str, float]]:
    """The best ``k`` of several tables' answers (each best first, ties by id): by score, ties by id."""
    if len(answers) <= 1:
        return answers[0] if answers else []
    return sorted((hit for answer in answers for hit in answer), key=lambda h: (-h[1], h[0]))[:k]


@dataclass(frozen=True, slots=True)
class KeywordIndex:
    """A user's chunks and fact statements, each table apart (as the stores keep them), and the documents
    added since the base (``recent``, searched together with it: an overlay's, ``UserSnapshot.updated``)."""

    chunks: KeywordTable
    facts: KeywordTable
    recent: KeywordIndex | None = None

    @classmethod
    def of(cls, chunks: Iterable[tuple[str, str]], facts: Iterable[tuple[str, str]]) -> KeywordIndex:
        return cls(chunks=KeywordTable.of(chunks), facts=KeywordTable.of(facts))

    def added(self, chunks: Iterable[tuple[str, str]], facts: Iterable[tuple[str, str]]) -> KeywordIndex:
        """This index with new chunks and facts (ids it does not hold), kept in ``recent``: only the recent
        tables are copied, never the base's."""
        recent = (self.recent or KeywordIndex.of((), ())).grown(chunks, facts)
        return KeywordIndex(self.chunks, self.facts, recent=recent)

    def grown(self, chunks: Iterable[tuple[str, str]], facts: Iterable[tuple[str, str]]) -> KeywordIndex:
        """This index's tables with new chunks and facts appended (a copy of both tables)."""
        return KeywordIndex(chunks=self.chunks.added(chunks), facts=self.facts.added(facts))

    @property
    def recent_holes(self) -> int:
        """The documents removed from the recent tables since they were added (their holes)."""
        return 0 if self.recent is None else len(self.recent.chunks.holes) + len(self.recent.facts.holes)

    @property
    def holes(self) -> int:
        """The removed documents its tables (the base's and the recent) still hold the postings of."""
        tables = (self.chunks, self.facts) + (() if self.recent is None else (self.recent.chunks, self.recent.facts))
        return sum(len(t.holes) for t in tables)

    def merged(self) -> KeywordIndex:
        """The same documents in one base (``KeywordTable.joined``: what ``added`` defers)."""
        if self.recent is None:
            return self
        return KeywordIndex(chunks=self.chunks.joined(self.recent.chunks), facts=self.facts.joined(self.recent.facts))

    def search(
        self, terms: Sequence[str], k: int, *, chunk_ok: Callable[[str], bool], fact_ok: Callable[[str], bool]
    ) -> list[KeywordHit]:
        """``GraphStore.keyword_search`` over this index: the best ``k`` chunks ``chunk_ok`` accepts and
        the best ``k`` facts ``fact_ok`` accepts holding any of ``terms`` (query words), best first."""
        stemmed = _stemmer().stemWords(list(terms))
        more = () if self.recent is None else (self.recent,)
        chunks = ranked((self.chunks, *(r.chunks for r in more)), stemmed, k, chunk_ok)
        facts = ranked((self.facts, *(r.facts for r in more)), stemmed, k, fact_ok)
        hits = [(i, s, "episode") for i, s in chunks] + [(i, s, "fact") for i, s in facts]
        hits.sort(key=lambda h: (-h[1], h[0]))
        # Validated in one call of pydantic's core: a third of the CPU of a ``model_construct`` each (40 hits:
        # ~0.15 ms of a 10K-fact user's ~0.7 ms search), which is Python
        return _HITS.validate_python([{"node_id": i, "kind": kind, "score": s} for i, s, kind in hits])
