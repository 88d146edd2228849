"""One user's vectors in memory: an immutable base (what the index file holds) plus a small overlay.

Layers: ``base`` is one FAISS index per kind as loaded from (or saved to) the user's index file and is
never mutated once built, so any number of ``UserIndex`` copies and concurrent searches share it. The
changes since (the delta log's records) live in the overlay: ``masked`` hides base rows that were
removed or replaced, and small flat indexes hold the added vectors. ``copy`` clones only the overlay,
so a writer's cost per change follows the change, not the user's size. ``compacted`` folds the overlay
into a fresh base (what a full rewrite of the file holds).

Invariants: a vector id is visible in at most one layer (a base row is masked before the overlay takes
the same id); ``masked`` only holds ids of base rows. Base rows keep their exact float32 vectors in
every index kind, so compaction never compounds quantisation error.

Token states (late interaction, ``storage.embedding.states``): a row may carry its record's packed token
states beside its vector, in the same layer and by the same vector id (``base_states``, shared like
``base_rows``; ``states``, the overlay's): a row removed or replaced takes its states with it (an upsert
without states leaves the row none), ``states_for`` reads only visible rows', and the file keeps them
(layout ``EGI5``; a file of an older layout is not read, so it is rebuilt from the graph, never misread).

Index kind per base, chosen when the base is built (rebuild or compaction): exact inner product
(``IndexFlatIP``) up to ``flat_max`` vectors of a kind, above it IVF with 8-bit scalar-quantised codes
re-ranked exactly (``IndexRefineFlat`` over ``IndexIVFScalarQuantizer``, ``2 sqrt(n)`` lists): search scans
``1/8`` of the lists (at least 32) of compact codes and re-ranks ``4k`` candidates on the exact vectors, recall@10 >= 0.98 of flat
(tests/test_vector_kinds.py, ops/bench ``vectors``).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from engram_api.versions import Stamp

__all__ = ["Kind", "UserIndex", "VectorHit", "vector_id"]

Kind = Literal["fact", "entity", "episode"]
# Base file header: magic, epoch, version, token (pairs the file with its delta log), JSON header length.
BASE_HEADER = struct.Struct("<4sQQQQ")
BASE_MAGIC = b"EGI5"
_PROBE_FRACTION = 8  # IVF: lists scanned = nlist / this, at least _MIN_PROBE (recall at a few thousand rows)
_MIN_PROBE = 32
_REFINE = 4  # IVF: candidates re-ranked exactly = this * k
_MIN_PER_LIST = 39  # FAISS k-means wants >= 39 training points per centroid


def load_faiss():  # type: ignore[no-untyped-def]
    import faiss

    # Searches are small and per user; OpenMP threads only contend with torch's and the other workers'.
    faiss.omp_set_num_threads(1)
    return faiss


def vector_id(node_id: str) -> int:
    """Stable positive int64 for a node id (FAISS ids are integers). Not cached: ~1 us a hash, ~0.1 ms a
    recall, while a cache of the ids seen lately (65,536 or 8,192 of them) held 40-60 MiB more of a reader's
    RSS in the quick recall bench (a bulk load's ids, long-lived, scattered over the allocator's arenas)."""
    return int.from_bytes(hashlib.blake2b(node_id.encode(), digest_size=8).digest(), "little") >> 1


def _flat(dim: int) -> object:
    faiss = load_faiss()
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def build_index(dim: int, ids: np.ndarray, vectors: np.ndarray, flat_max: int) -> object:
    """A kind's base index over exact ``vectors``: flat up to ``flat_max`` rows, IVF-SQ8 + exact re-rank above."""
    faiss = load_faiss()
    n = len(ids)
    if n <= flat_max:
        index = _flat(dim)
    else:
        nlist = max(1, min(int(2 * math.sqrt(n)), n // _MIN_PER_LIST))
        ivf = faiss.IndexIVFScalarQuantizer(
            faiss.IndexFlatIP(dim), dim, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
        ivf.cp.niter = 10
        ivf.nprobe = min(nlist, max(_MIN_PROBE, math.ceil(nlist / _PROBE_FRACTION)))
        refine = faiss.IndexRefineFlat(ivf)
        refine.k_factor = _REFINE
        index = faiss.IndexIDMap2(refine)
        index.train(vectors)  # type: ignore[attr-defined]  # deterministic: FAISS k-means seeds with a fixed seed
    if n:
        index.add_with_ids(vectors, ids)  # type: ignore[attr-defined]
    return index


def index_kind(index: object) -> str:
    """``flat`` or ``ivf-sq8`` (for reports and tests)."""
    inner = load_faiss().downcast_index(index.index)  # type: ignore[attr-defined]
    return "flat" if type(inner).__name__ == "IndexFlatIP" else "ivf-sq8"


def _contents(index: object) -> tuple[np.ndarray, np.ndarray]:
    """(ids, exact vectors) of a base index, in insertion order."""
    faiss = load_faiss()
    n = int(index.ntotal)  # type: ignore[attr-defined]
    ids = faiss.vector_to_array(index.id_map).astype(np.int64)  # type: ignore[attr-defined]
    vectors = index.index.reconstruct_n(0, n) if n else np.zeros((0, 0), dtype=np.float32)  # type: ignore[attr-defined]
    return ids, vectors


class VectorHit(NamedTuple):
    """A search hit (a named tuple: made positionally, ~80 a recall, at a quarter of a frozen dataclass's cost)."""

    node_id: str
    kind: Kind
    score: float


@dataclass(slots=True)
class UserIndex:
    """One user's vectors: base + overlay (see the module docstring) and the id -> (node, kind) maps.

    One index per kind, not one filtered index: a user's hundreds of episode chunks would otherwise
    crowd the few facts or entities out of a kind-filtered top-k (consolidation's dedup and entity
    resolution ask for the top 3 facts / entities). ``token`` and ``log_end`` say which index file and
    how far into its delta log this index reflects (0 for one never saved)."""

    dim: int
    version: int = 0
    epoch: int = 0
    base_rows: dict[int, tuple[str, Kind]] = field(default_factory=dict)
    base: dict[str, object] = field(default_factory=dict)
    masked: set[int] = field(default_factory=set)
    rows: dict[int, tuple[str, Kind]] = field(default_factory=dict)
    indexes: dict[str, object] = field(default_factory=dict)
    token: int = 0
    log_end: int = 0
    base_bytes: int = 0
    base_states: dict[int, bytes] = field(default_factory=dict)
    states: dict[int, bytes] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.base_rows) - len(self.masked) + len(self.rows)

    @property
    def overlay_size(self) -> int:
        """Rows the overlay changes (added or hidden): what compaction would fold into the base."""
        return len(self.rows) + len(self.masked)

    def count(self, kind: Kind) -> int:
        base = self.base.get(kind)
        hidden = sum(1 for vid in self.masked if self.base_rows[vid][1] == kind)
        added = self.indexes.get(kind)
        return (0 if base is None else int(base.ntotal)) - hidden + (0 if added is None else int(added.ntotal))  # type: ignore[attr-defined]

    def kinds(self) -> dict[str, str]:
        """Each kind's base index kind (``flat`` / ``ivf-sq8``)."""
        return {kind: index_kind(index) for kind, index in self.base.items()}

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.epoch, self.version)

    @stamp.setter
    def stamp(self, value: Stamp) -> None:
        self.epoch, self.version = value

    @classmethod
    def whole(
        cls, dim: int, items: Iterable[tuple[str, Kind, Sequence[float]]], states: Mapping[str, bytes] | None = None
    ) -> UserIndex:
        """An index of ``items`` (a whole read of the user's vectors, in (kind, id) order) held as its base:
        exact (flat) whatever the size, so it answers exactly as ``upsert`` of the same items into an empty
        overlay, but a ``copy`` shares it and clones only the changes applied since (a copy held in memory
        only, ``IndexKeeper(persist=False)``, costs a catch-up its change, not the user's size; a copy
        saved to a file is compacted, each kind's index kind chosen by its size, as before)."""
        by_kind: dict[Kind, dict[int, tuple[str, Sequence[float]]]] = {}
        for node, kind, vector in items:
            by_kind.setdefault(kind, {})[vector_id(node)] = (node, vector)
        out = cls(dim=dim)
        for kind, members in by_kind.items():
            ids = np.fromiter(members, dtype=np.int64, count=len(members))
            vecs = np.ascontiguousarray(np.array([v for _, v in members.values()], dtype=np.float32))
            out.base[kind] = build_index(dim, ids, vecs.reshape(len(ids), dim), flat_max=len(ids))
            out.base_rows.update((vid, (node, kind)) for vid, (node, _) in members.items())
        out.base_states = {vector_id(node): blob for node, blob in (states or {}).items()}
        return out

    def copy(self) -> UserIndex:
        """An independent copy to change while readers keep searching this one (the base is shared)."""
        faiss = load_faiss()
        return UserIndex(
            dim=self.dim,
            version=self.version,
            epoch=self.epoch,
            base_rows=self.base_rows,
            base=self.base,
            masked=set(self.masked),
            rows=dict(self.rows),
            indexes={kind: faiss.clone_index(index) for kind, index in self.indexes.items()},
            token=self.token,
            log_end=self.log_end,
            base_bytes=self.base_bytes,
            base_states=self.base_states,
            states=dict(self.states),
        )

    def _row(self, vid: int) -> tuple[str, Kind] | None:
        row = self.rows.get(vid)
        if row is None and vid not in self.masked:
            row = self.base_rows.get(vid)
        return row

    def node_ids(self, kind: Kind | None = None) -> set[str]:
        """The visible nodes (of one kind, or of every kind)."""
        base = {n for v, (n, k) in self.base_rows.items() if v not in self.masked and kind in (None, k)}
        return base | {n for n, k in self.rows.values() if kind in (None, k)}

    def upsert(
        self, items: Iterable[tuple[str, Kind, Sequence[float]]], states: Mapping[str, bytes] | None = None
    ) -> None:
        """Add or replace these rows; ``states``: the packed token states of those that have them."""
        items = list(items)
        if not items:
            return
        # remove first: add_with_ids on an existing id would store a second copy (a duplicate hit).
        self.remove(node for node, _, _ in items)
        for node, _, _ in items:
            blob = (states or {}).get(node)
            if blob is not None:
                self.states[vector_id(node)] = blob
        for kind in dict.fromkeys(k for _, k, _ in items):
            batch = [(node, v) for node, k, v in items if k == kind]
            ids = np.array([vector_id(node) for node, _ in batch], dtype=np.int64)
            vecs = np.ascontiguousarray(np.array([v for _, v in batch], dtype=np.float32))
            if kind not in self.indexes:
                self.indexes[kind] = _flat(self.dim)
            self.indexes[kind].add_with_ids(vecs, ids)  # type: ignore[attr-defined]
            for vid, (node, _) in zip(ids.tolist(), batch, strict=True):
                self.rows[vid] = (node, kind)

    def remove(self, node_ids: Iterable[str]) -> int:
        """Hide or drop these nodes' rows; returns how many were visible."""
        removed = 0
        by_kind: dict[str, list[int]] = {}
        for vid in {vector_id(n) for n in node_ids}:
            row = self.rows.pop(vid, None)
            if row is not None:  # an overlay row (a base row of the same id is already masked)
                self.states.pop(vid, None)
                by_kind.setdefault(row[1], []).append(vid)
                removed += 1
            elif vid in self.base_rows and vid not in self.masked:
                self.masked.add(vid)
                removed += 1
        for kind, ids in by_kind.items():
            self.indexes[kind].remove_ids(np.array(ids, dtype=np.int64))  # type: ignore[attr-defined]
        return removed

    def search(self, query: np.ndarray, k: int, kind: Kind | None = None) -> list[VectorHit]:
        """Top ``k`` by inner product, of one kind or of every kind: each layer's index of the kind asked
        (base, then overlay), none that is empty; the layers' lists merged best first, ties in that order.
        A single layer's list is FAISS's, already best first, so it is not sorted again."""
        if k <= 0:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)  # no copy of a float32 vector
        hits: list[VectorHit] = []
        answered = 0
        for overlay, layer, rows in ((False, self.base, self.base_rows), (True, self.indexes, self.rows)):
            for name, index in layer.items():
                if kind is not None and name != kind:
                    continue
                # Masked rows still sit in the base: ask for as many more as could be hidden, drop them below.
                n = min(int(index.ntotal), k if overlay else k + self.count_masked(name))  # type: ignore[attr-defined]
                if n == 0:
                    continue
                scores, ids = index.search(q, n)  # type: ignore[attr-defined]
                masked = () if overlay else self.masked
                for score, vid in zip(scores[0].tolist(), ids[0].tolist(), strict=True):
                    row = rows.get(vid) if vid not in masked else None
                    if row is not None:
                        hits.append(VectorHit(row[0], row[1], score))
                answered += 1
        if answered > 1:
            hits.sort(key=lambda h: -h.score)
        return hits[:k]

    def count_masked(self, kind: str) -> int:
        return sum(1 for vid in self.masked if self.base_rows[vid][1] == kind) if self.masked else 0

    def _gathered(self, node_ids: Iterable[str]) -> Iterator[tuple[list[str], np.ndarray]]:
        """The visible nodes among ``node_ids`` and their exact vectors (one row each), a batch per layer and
        kind: one ``reconstruct_batch`` each, since FAISS's per-call Python wrapper costs ~5 us a vector and
        recall asks for ~70 (0.37 -> 0.02 ms)."""
        groups: dict[tuple[bool, str], tuple[list[str], list[int]]] = {}
        rows, masked, base_rows = self.rows, self.masked, self.base_rows
        for node in node_ids:
            vid = vector_id(node)
            row = rows.get(vid) if rows else None  # ``_row`` inlined: ~80 a recall
            overlay = row is not None
            if not overlay and not (masked and vid in masked):
                row = base_rows.get(vid)
            if row is not None:
                group = groups.get((overlay, row[1]))
                if group is None:
                    group = groups[overlay, row[1]] = ([], [])
                group[0].append(node)
                group[1].append(vid)
        for (overlay, kind), (nodes, vids) in groups.items():
            index = (self.indexes if overlay else self.base)[kind]
            yield nodes, index.reconstruct_batch(np.array(vids, dtype=np.int64))  # type: ignore[attr-defined]

    def states_for(self, node_ids: Iterable[str]) -> dict[str, bytes]:
        """The packed token states of the visible rows among ``node_ids`` that carry them."""
        out: dict[str, bytes] = {}
        for node in node_ids:
            vid = vector_id(node)
            if vid in self.rows:
                blob = self.states.get(vid)
            elif vid in self.masked:
                continue
            else:
                blob = self.base_states.get(vid)
            if blob is not None:
                out[node] = blob
        return out

    def vectors_for(self, node_ids: Iterable[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for nodes, vectors in self._gathered(node_ids):
            out.update(zip(nodes, vectors, strict=True))
        return out

    def similarities(self, node_ids: Iterable[str], query: np.ndarray) -> dict[str, float]:
        """Each visible node's inner product with ``query`` (a vector of the index's dtype), exactly
        ``float(np.dot(vector, query))``: numpy's matmul of a stack of 1 x d rows by ``query`` runs that
        same dot product row by row (a matrix-vector product sums in another order, and its last bits
        differ), in one call per batch instead of one a node."""
        out: dict[str, float] = {}
        for nodes, vectors in self._gathered(node_ids):
            out.update(zip(nodes, np.matmul(vectors[:, None, :], query).ravel().tolist(), strict=True))
        return out

    def compacted(self, flat_max: int) -> UserIndex:
        """The overlay folded into a new base (each kind's index kind chosen by its size); stamp kept."""
        merged: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for name, index in self.base.items():
            ids, vecs = _contents(index)
            keep = np.array([vid not in self.masked for vid in ids.tolist()], dtype=bool)
            merged.setdefault(name, ([], []))[0].append(ids[keep])
            merged[name][1].append(vecs[keep] if len(ids) else vecs.reshape(0, self.dim))
        for name, index in self.indexes.items():
            ids, vecs = _contents(index)
            merged.setdefault(name, ([], []))[0].append(ids)
            merged[name][1].append(vecs.reshape(-1, self.dim))
        out = UserIndex(dim=self.dim, version=self.version, epoch=self.epoch)
        for name, (id_parts, vec_parts) in merged.items():
            ids = np.concatenate(id_parts).astype(np.int64)
            if len(ids) == 0:
                continue
            vecs = np.ascontiguousarray(np.concatenate(vec_parts).astype(np.float32))
            out.base[name] = build_index(self.dim, ids, vecs, flat_max)
            for vid in ids.tolist():
                row = self._row(vid)
                assert row is not None
                out.base_rows[vid] = row
        out.base_states = {v: b for v, b in self.base_states.items() if v not in self.masked and v not in self.rows}
        out.base_states.update(self.states)
        return out

    def to_bytes(self, token: int) -> bytes:
        """The base file's bytes (the overlay must be empty: save a ``compacted`` index)."""
        if self.overlay_size:
            raise ValueError("an index with an overlay is saved compacted")
        faiss = load_faiss()
        bodies = {kind: faiss.serialize_index(index).tobytes() for kind, index in self.base.items()}
        header = json.dumps(
            {
                "dim": self.dim,
                "rows": [[v, n, k] for v, (n, k) in self.base_rows.items()],
                "kinds": [[kind, len(body)] for kind, body in bodies.items()],
                "states": [[v, len(blob)] for v, blob in self.base_states.items()],
            }
        ).encode()
        head = BASE_HEADER.pack(BASE_MAGIC, self.epoch, self.version, token, len(header))
        return head + header + b"".join(bodies.values()) + b"".join(self.base_states.values())

    @classmethod
    def from_bytes(cls, data: bytes) -> UserIndex:
        magic, epoch, version, token, hlen = BASE_HEADER.unpack_from(data)
        if magic != BASE_MAGIC:
            raise ValueError("not an index file of this layout")
        header = json.loads(data[BASE_HEADER.size : BASE_HEADER.size + hlen])
        base: dict[str, object] = {}
        offset = BASE_HEADER.size + hlen
        for kind, length in header["kinds"]:
            if offset + length > len(data):
                raise ValueError("index file truncated")
            body = np.frombuffer(data[offset : offset + length], dtype=np.uint8)
            base[str(kind)] = load_faiss().deserialize_index(body)
            offset += length
        rows = {int(v): (str(n), k) for v, n, k in header["rows"]}
        if sum(int(i.ntotal) for i in base.values()) != len(rows):  # type: ignore[attr-defined]
            raise ValueError("index rows and id map disagree")
        states: dict[int, bytes] = {}
        for vid, length in header["states"]:
            if offset + length > len(data) or int(vid) not in rows:
                raise ValueError("index file's token states truncated or not its rows'")
            states[int(vid)] = data[offset : offset + length]
            offset += length
        return cls(
            dim=int(header["dim"]),
            version=int(version),
            epoch=int(epoch),
            base_rows=rows,
            base=base,
            token=int(token),
            base_bytes=len(data),
            base_states=states,
        )
