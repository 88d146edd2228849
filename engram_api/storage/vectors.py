"""Per-user FAISS indexes: one file per user, derived from the graph store and rebuildable from it.

A global index filtered after top-k lets one user's results shrink as others add data; one index per
user cannot. Each file carries the graph stamp (epoch, version) it reflects, so a reader or the reconcile
job can tell a stale, missing or other-lifetime index and rebuild it from the graph (the source of
truth). Files are replaced atomically (write to a temp file, fsync, rename): a crash mid-write leaves
the previous index. A ``UserIndex`` another thread may hold is never mutated: ``copy`` first.

File layout: magic ``EGI3``, little-endian u64 epoch, u64 version, u64 header length, JSON header (dim,
rows, kinds with their byte lengths), then one serialized FAISS index per kind; the stamp comes first so a
reader can check freshness by reading 28 bytes. A file without the magic (an older layout) reads as
missing and is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from engram_api.versions import Stamp

__all__ = ["UserIndex", "VectorHit", "VectorStore"]

Kind = Literal["fact", "entity", "episode"]
_MAGIC = b"EGI3"
_HEADER = struct.Struct("<4sQQQ")
_LOCK_STRIPES = 64  # in-process file-lock stripes: ample for 2-8 worker threads, bounded for any user count


def _faiss():  # type: ignore[no-untyped-def]
    import faiss

    # Searches are small and per user; OpenMP threads only contend with torch's and the other workers'.
    faiss.omp_set_num_threads(1)
    return faiss


def vector_id(node_id: str) -> int:
    """Stable positive int64 for a node id (FAISS ids are integers)."""
    return int.from_bytes(hashlib.blake2b(node_id.encode(), digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True, slots=True)
class VectorHit:
    node_id: str
    kind: Kind
    score: float


@dataclass(slots=True)
class UserIndex:
    """One user's vectors: one FAISS inner-product index per kind plus the id -> (node, kind) map.

    One index per kind, not one filtered index: a user's hundreds of episode chunks would otherwise
    crowd the few facts or entities out of a kind-filtered top-k (consolidation's dedup and entity
    resolution ask for the top 3 facts / entities)."""

    dim: int
    version: int = 0
    epoch: int = 0
    rows: dict[int, tuple[str, Kind]] = field(default_factory=dict)
    indexes: dict[str, object] = field(default_factory=dict)

    def _index(self, kind: Kind) -> object:
        if kind not in self.indexes:
            faiss = _faiss()
            self.indexes[kind] = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        return self.indexes[kind]

    def __len__(self) -> int:
        return len(self.rows)

    def count(self, kind: Kind) -> int:
        index = self.indexes.get(kind)
        return 0 if index is None else int(index.ntotal)  # type: ignore[attr-defined]

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.epoch, self.version)

    @stamp.setter
    def stamp(self, value: Stamp) -> None:
        self.epoch, self.version = value

    def copy(self) -> UserIndex:
        """An independent copy (every kind's index cloned) to change while readers keep searching this one."""
        faiss = _faiss()
        return UserIndex(
            dim=self.dim,
            version=self.version,
            epoch=self.epoch,
            rows=dict(self.rows),
            indexes={kind: faiss.clone_index(index) for kind, index in self.indexes.items()},
        )

    def node_ids(self) -> set[str]:
        return {node for node, _ in self.rows.values()}

    def upsert(self, items: Iterable[tuple[str, Kind, Sequence[float]]]) -> None:
        items = list(items)
        if not items:
            return
        # remove first: add_with_ids on an existing id would store a second copy (a duplicate hit).
        self.remove(node for node, _, _ in items)
        for kind in dict.fromkeys(k for _, k, _ in items):
            batch = [(node, v) for node, k, v in items if k == kind]
            ids = np.array([vector_id(node) for node, _ in batch], dtype=np.int64)
            vecs = np.ascontiguousarray(np.array([v for _, v in batch], dtype=np.float32))
            self._index(kind).add_with_ids(vecs, ids)  # type: ignore[attr-defined]
            for vid, (node, _) in zip(ids.tolist(), batch, strict=True):
                self.rows[vid] = (node, kind)

    def remove(self, node_ids: Iterable[str]) -> int:
        by_kind: dict[str, list[int]] = {}
        for vid in {vector_id(n) for n in node_ids}:
            row = self.rows.pop(vid, None)
            if row is not None:
                by_kind.setdefault(row[1], []).append(vid)
        for kind, ids in by_kind.items():
            self.indexes[kind].remove_ids(np.array(ids, dtype=np.int64))  # type: ignore[attr-defined]
        return sum(len(ids) for ids in by_kind.values())

    def search(self, query: np.ndarray, k: int, kind: Kind | None = None) -> list[VectorHit]:
        """Top ``k`` by inner product, of one kind or of every kind."""
        if k <= 0:
            return []
        q = query.reshape(1, -1).astype(np.float32)
        hits = []
        for name, index in self.indexes.items():
            n = min(int(index.ntotal), k)  # type: ignore[attr-defined]
            if (kind is not None and name != kind) or n == 0:
                continue
            scores, ids = index.search(q, n)  # type: ignore[attr-defined]
            for score, vid in zip(scores[0].tolist(), ids[0].tolist(), strict=True):
                row = self.rows.get(vid)
                if row is not None:
                    hits.append(VectorHit(node_id=row[0], kind=row[1], score=float(score)))
        hits.sort(key=lambda h: -h.score)
        return hits[:k]

    def vectors_for(self, node_ids: Iterable[str]) -> dict[str, np.ndarray]:
        out = {}
        for node in node_ids:
            vid = vector_id(node)
            row = self.rows.get(vid)
            if row is not None:
                out[node] = self.indexes[row[1]].reconstruct(vid)  # type: ignore[attr-defined]
        return out

    def to_bytes(self) -> bytes:
        faiss = _faiss()
        bodies = {kind: faiss.serialize_index(index).tobytes() for kind, index in self.indexes.items()}
        header = json.dumps(
            {
                "dim": self.dim,
                "rows": [[v, n, k] for v, (n, k) in self.rows.items()],
                "kinds": [[kind, len(body)] for kind, body in bodies.items()],
            }
        ).encode()
        return _HEADER.pack(_MAGIC, self.epoch, self.version, len(header)) + header + b"".join(bodies.values())

    @classmethod
    def from_bytes(cls, data: bytes) -> UserIndex:
        magic, epoch, version, hlen = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError("not an index file of this layout")
        header = json.loads(data[_HEADER.size : _HEADER.size + hlen])
        indexes: dict[str, object] = {}
        offset = _HEADER.size + hlen
        for kind, length in header["kinds"]:
            body = np.frombuffer(data[offset : offset + length], dtype=np.uint8)
            indexes[str(kind)] = _faiss().deserialize_index(body)
            offset += length
        rows = {int(v): (str(n), k) for v, n, k in header["rows"]}
        if sum(int(i.ntotal) for i in indexes.values()) != len(rows):  # type: ignore[attr-defined]
            raise ValueError("index rows and id map disagree")
        return cls(dim=int(header["dim"]), version=int(version), epoch=int(epoch), rows=rows, indexes=indexes)


class VectorStore:
    """Reads and writes the per-user index files under one directory."""

    def __init__(self, *, root: Path, dim: int) -> None:
        self.root = Path(root)
        self.dim = dim
        # A fixed set of lock stripes, not a lock per user: the set stays bounded however many users one
        # process serves, and a user always maps to the same stripe, so its writers still exclude each
        # other (evicting a per-user lock could hand two writers different locks). Two users sharing a
        # stripe only wait for one short file save; no caller holds two users' locks at once.
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))

    def path_for(self, user_id: str) -> Path:
        # Hashed file names: a user id never becomes a path (no traversal, no odd characters).
        return self.root / f"{hashlib.sha256(user_id.encode()).hexdigest()[:32]}.faiss"

    def lock(self, user_id: str) -> threading.Lock:
        """The in-process lock of the user's file (cross-process writers are serialized by the apply lock)."""
        digest = hashlib.sha256(user_id.encode()).digest()
        return self._locks[int.from_bytes(digest[:8], "big") % _LOCK_STRIPES]

    def file_stamp(self, user_id: str) -> Stamp | None:
        path = self.path_for(user_id)
        try:
            with path.open("rb") as fh:
                magic, epoch, version, _ = _HEADER.unpack(fh.read(_HEADER.size))
        except (OSError, struct.error):
            return None
        return Stamp(int(epoch), int(version)) if magic == _MAGIC else None

    def files(self) -> list[Path]:
        """Every index file under the root (reconcile matches them against the graph's users)."""
        return sorted(self.root.glob("*.faiss")) if self.root.is_dir() else []

    def load(self, user_id: str) -> UserIndex | None:
        """The stored index, or None when it is missing or unreadable (the caller rebuilds)."""
        try:
            index = UserIndex.from_bytes(self.path_for(user_id).read_bytes())
        except (OSError, ValueError, KeyError, struct.error, RuntimeError):
            return None
        return index if index.dim == self.dim else None

    def new(self) -> UserIndex:
        return UserIndex(dim=self.dim)

    def warm_up(self) -> None:
        """Import FAISS now: seconds in a cold process, better spent before a user's write than inside it."""
        _faiss()

    def save(self, user_id: str, index: UserIndex) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(user_id)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with tmp.open("wb") as fh:
            fh.write(index.to_bytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def delete(self, user_id: str) -> bool:
        try:
            self.path_for(user_id).unlink()
        except FileNotFoundError:
            return False
        return True
