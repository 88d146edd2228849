"""Per-user FAISS index files: a base file plus an append-only delta log, one process's local copy of the
vectors the graph store holds (``vectorsync``: a warm-start cache that any process may delete at any time,
which no process on another host ever reads).

A global index filtered after top-k lets one user's results shrink as others add data; one index per
user cannot. Each user has ``<hash>.faiss`` (the base: magic ``EGI4``, u64 epoch, u64 version, u64
token, u64 header length, JSON header, one serialized FAISS index per kind; see ``userindex``) and
``<hash>.faiss.log`` (the changes since, see ``vectorlog``). A write appends one checksummed record to
the log and fsyncs it, so its cost follows the change, not the user's size; when the log outgrows
``max(compact_min_bytes, compact_ratio * base size)`` the index is compacted: written whole as a new base
(temp file, fsync, rename) with a new token, then the log is replaced by an empty one of that token.

Invariants:
- The index's stamp is that of the last whole record of the chain (or the base's without one); it is
  the graph stamp the index reflects, so a process can tell a stale index (and catch it up from the graph
  by version) from a missing or other-lifetime one (read from the graph whole).
- Temp files are named by host, process and a random part: writers sharing a directory never collide.
- A crash at any point leaves a readable index at a stamp some write reached: mid-append the torn
  record is ignored; between the base's and the log's rename the old log's token no longer matches and
  the new base alone is complete. A removal (forget, erasure) is in the log before the write returns and
  in every base compacted after it, so a forgotten vector never comes back.
- A ``UserIndex`` another thread may hold is never mutated: ``append`` changes a copy (of the overlay).
- A file without the current magic (an older layout) reads as missing and is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from engram_api.settings import Settings
from engram_api.storage.faiss.index import BASE_HEADER, BASE_MAGIC, Kind, UserIndex, VectorHit, load_faiss, vector_id
from engram_api.storage.faiss.log import LOG_HEADER, Delta, encode_record, log_header, log_token, read_records
from engram_api.versions import Stamp

__all__ = ["Kind", "UserIndex", "VectorHit", "VectorStore", "vector_id"]

_LOCK_STRIPES = 64  # in-process file-lock stripes: ample for 2-8 worker threads, bounded for any user count
_READ_ATTEMPTS = 3  # a compaction can swap base and log between a reader's two opens: read the pair again
_TMP_GRACE_S = 60.0  # a temp file older than this is a crashed writer's (a save takes milliseconds to seconds)
# Overlay rows below which a copy held in memory only is never folded (``moved``): a fold copies the user.
_FOLD_MIN_ROWS = 1024
_NAMES_KEPT = 4096  # users whose file names a store keeps (``VectorStore._names``)
_HOST = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())[:64] or "host"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    # Host, process and a random part: a directory shared by hosts (a network volume) never sees two
    # writers pick the same temp name.
    tmp = path.with_name(f"{path.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class VectorStore:
    """Reads and writes the per-user index files (base + delta log) under one directory."""

    def __init__(
        self,
        *,
        root: Path,
        dim: int,
        flat_max: int = 20_000,
        compact_min_bytes: int = 1 << 20,
        compact_ratio: float = 0.25,
    ) -> None:
        self.root = Path(root)
        self.dim = dim
        self.flat_max = flat_max
        self.compact_min_bytes = compact_min_bytes
        self.compact_ratio = compact_ratio
        # A fixed set of lock stripes, not a lock per user: the set stays bounded however many users one
        # process serves, and a user always maps to the same stripe, so its writers still exclude each
        # other (evicting a per-user lock could hand two writers different locks). Two users sharing a
        # stripe only wait for one short file write; no caller holds two users' locks at once.
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))
        self._recent_names: dict[str, tuple[str, str]] = {}  # ``_names``: user -> (base path, log path)

    @classmethod
    def from_settings(cls, settings: Settings, dim: int) -> VectorStore:
        return cls(
            root=settings.index_dir,
            dim=dim,
            flat_max=settings.index_flat_max,
            compact_min_bytes=settings.index_log_compact_bytes,
            compact_ratio=settings.index_log_compact_ratio,
        )

    @staticmethod
    def stem(user_id: str) -> str:
        """The user's file name without suffix: hashed, so a user id never becomes a path (no traversal,
        no odd characters) and an erasure tombstone names no user."""
        return hashlib.sha256(user_id.encode()).hexdigest()[:32]

    def path_for(self, user_id: str) -> Path:
        return self.root / f"{self.stem(user_id)}.faiss"

    def log_path_for(self, user_id: str) -> Path:
        return self.path_for(user_id).with_suffix(".faiss.log")

    def lock(self, user_id: str) -> threading.Lock:
        """The in-process lock of the user's files (cross-process writers are serialized by the apply lock)."""
        digest = hashlib.sha256(user_id.encode()).digest()
        return self._locks[int.from_bytes(digest[:8], "big") % _LOCK_STRIPES]

    def probe(self, user_id: str) -> tuple[int, int] | None:
        """(token of the base file, size of its log) from one header read and one stat; None without a base.
        A recall asks it once, twice right after another host's write (its catch-up's ``IndexKeeper.held``):
        by plain system calls on string paths (``_names``), no Python file object nor ``Path`` made."""
        base, log = self._names(user_id)
        head = _read_head(base)
        if head is None:
            return None
        try:
            size = os.stat(log).st_size
        except FileNotFoundError:
            size = 0
        return head[2], size

    def _names(self, user_id: str) -> tuple[str, str]:
        """The user's base and log paths as strings (``path_for``, ``log_path_for``), kept for the users
        touched lately: a hash and two ``Path`` joins a call otherwise."""
        names = self._recent_names.get(user_id)
        if names is None:
            base = os.path.join(self.root, f"{self.stem(user_id)}.faiss")
            names = (base, f"{base}.log")
            if len(self._recent_names) >= _NAMES_KEPT:
                self._recent_names.clear()  # a bound, not an order: the next calls fill it again
            self._recent_names[user_id] = names
        return names

    def file_stamp(self, user_id: str) -> Stamp | None:
        """The stamp the stored index (base + log) reflects, None when missing or unreadable."""
        index = self.load(user_id)
        return None if index is None else index.stamp

    def lifetimes(self) -> dict[str, int]:
        """The stem of every index (base file or delta log) under the root, with the epoch its base holds now
        (0: no base, or unreadable): reconcile matches the stems against the graph's users and erases an
        orphan up to the epoch it listed (``erase``), so a new lifetime's files written since stay."""
        if not self.root.is_dir():
            return {}
        stems = {path.name.split(".", 1)[0] for path in (*self.root.glob("*.faiss"), *self.root.glob("*.faiss.log"))}
        lifetimes = {}
        for stem in sorted(stems):
            head = _read_head(self.root / f"{stem}.faiss")
            lifetimes[stem] = 0 if head is None else head[0]
        return lifetimes

    def read(self, user_id: str) -> UserIndex:
        """The stored index at the last whole record of its log; raises OSError / ValueError when unreadable."""
        for _ in range(_READ_ATTEMPTS):
            data = self.path_for(user_id).read_bytes()
            index = UserIndex.from_bytes(data)
            log = _read(self.log_path_for(user_id))
            if log is not None and log_token(log) == index.token:
                index.log_end = LOG_HEADER.size
                return self._replay(index, log[LOG_HEADER.size :], LOG_HEADER.size)
            head = _read_head(self.path_for(user_id))
            if head is not None and head[2] == index.token:
                return index  # no log of this base (crash between the renames): the base is complete
        raise ValueError("index file and delta log keep changing under the reader")

    def load(self, user_id: str) -> UserIndex | None:
        """The stored index, or None when it is missing or unreadable (the caller rebuilds)."""
        try:
            index = self.read(user_id)
        except (OSError, ValueError, KeyError, struct.error, RuntimeError):
            return None
        return index if index.dim == self.dim else None

    def catch_up(self, user_id: str, index: UserIndex) -> UserIndex:
        """``index`` moved on by the log records appended since it was read (same base); a new copy."""
        if index.log_end == 0:
            return index  # its base has no log (only a new base gets a new log): nothing can follow
        try:
            with self.log_path_for(user_id).open("rb") as fh:
                # One open file: the token read is the log the tail comes from (a compaction may swap it).
                if log_token(fh.read(LOG_HEADER.size)) != index.token:
                    return self.load(user_id) or index
                fh.seek(index.log_end)
                tail = fh.read()
        except FileNotFoundError:
            return index
        return self._replay(index, tail, index.log_end)

    def _replay(self, index: UserIndex, tail: bytes, start: int) -> UserIndex:
        """``index`` moved on by the chained records of ``tail`` (the log's bytes from offset ``start``)."""
        out = index
        for end, delta in read_records(tail, self.dim):
            if delta.before != out.stamp:
                break  # the chain breaks: nothing after this record belongs to this index
            if out is index:
                out = index.copy()
            delta.apply(out)
            out.log_end = start + end
        return out

    def new(self) -> UserIndex:
        return UserIndex(dim=self.dim)

    def warm_up(self) -> None:
        """Import FAISS now: seconds in a cold process, better spent before a user's write than inside it."""
        load_faiss()

    def save(self, user_id: str, index: UserIndex) -> UserIndex:
        """Write ``index`` whole (compacted: a new base and an empty log); returns the saved index."""
        saved = index.compacted(self.flat_max) if index.overlay_size or index.token == 0 else index.copy()
        saved.token = secrets.randbits(63) or 1
        self.root.mkdir(parents=True, exist_ok=True)
        data = saved.to_bytes(saved.token)
        _write_atomic(self.path_for(user_id), data)
        _write_atomic(self.log_path_for(user_id), log_header(saved.token))
        saved.log_end, saved.base_bytes = LOG_HEADER.size, len(data)
        return saved

    def append(
        self,
        user_id: str,
        index: UserIndex,
        *,
        to_stamp: Stamp,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]] = (),
        removals: Iterable[str] = (),
        durable: bool = True,
        states: Mapping[str, bytes] | None = None,
    ) -> UserIndex:
        """Record one batch of changes from ``index`` (the stored index, at its stamp) to ``to_stamp``:
        one log record, or a compaction when the log has grown past its threshold. Returns the new index.
        ``durable=False`` skips the fsync: for a change read back from the graph (a catch-up), which a
        lost record only makes the next start of a process read again."""
        delta = self._delta(index.stamp, to_stamp, upserts, removals, states)
        changed = index.copy()
        delta.apply(changed)
        record = encode_record(delta)
        if index.token == 0 or index.log_end == 0 or not self._append(user_id, index, record, durable):
            return self.save(user_id, changed)  # no log of this base to extend: write it whole
        changed.log_end = index.log_end + len(record)
        if changed.log_end - LOG_HEADER.size > max(self.compact_min_bytes, self.compact_ratio * index.base_bytes):
            return self.save(user_id, changed)
        return changed

    def moved(
        self,
        index: UserIndex,
        *,
        to_stamp: Stamp,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]] = (),
        removals: Iterable[str] = (),
        states: Mapping[str, bytes] | None = None,
    ) -> UserIndex:
        """``append``'s change in memory only: a copy of ``index`` at ``to_stamp``, no file touched. The copy
        clones only ``index``'s overlay (the base is shared); once the overlay outgrows what ``append`` lets
        a log grow to (``compact_ratio`` of the base's rows, at least ``_FOLD_MIN_ROWS``) it is folded into a
        new exact base, so each change costs about what it changed, not the user's size."""
        changed = index.copy()
        self._delta(index.stamp, to_stamp, upserts, removals, states).apply(changed)
        if changed.overlay_size > max(_FOLD_MIN_ROWS, self.compact_ratio * len(changed.base_rows)):
            return changed.compacted(flat_max=len(changed))  # flat: it answers as the overlay did
        return changed

    def _delta(
        self,
        before: Stamp,
        after: Stamp,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]],
        removals: Iterable[str],
        states: Mapping[str, bytes] | None,
    ) -> Delta:
        added = list(upserts)
        held = states or {}
        return Delta(
            before=before,
            after=after,
            removed=tuple(removals),
            added=tuple((node, kind) for node, kind, _ in added),
            vectors=np.array([v for _, _, v in added], dtype=np.float32).reshape(len(added), self.dim),
            states=tuple((node, held[node]) for node, _, _ in added if node in held),
        )

    def _append(self, user_id: str, index: UserIndex, record: bytes, durable: bool) -> bool:
        """``record`` written at ``index.log_end`` of the user's log when the log is ``index``'s (its token);
        False when it is not, or gone. Plain system calls: a reader's catch-up appends one on a recall's
        path (a buffered file object cost ~3x these calls)."""
        try:
            fd = os.open(self._names(user_id)[1], os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            if log_token(os.pread(fd, LOG_HEADER.size, 0)) != index.token:
                return False
            # Past the last whole record there can only be a torn one (a killed writer's): cut it.
            os.ftruncate(fd, index.log_end)
            written = 0
            while written < len(record):  # a regular file takes it whole; a short write is only resumed
                written += os.pwrite(fd, record[written:], index.log_end + written)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def erase(self, stem: str, epoch: int) -> bool:
        """Delete the files named ``stem`` when they hold a lifetime up to ``epoch`` (epochs are time-ordered:
        a later lifetime's files stay), and a crashed writer's temp files of that name (older than a save
        takes: a live one may be a new lifetime's); True if any went."""
        base = self.root / f"{stem}.faiss"
        head = _read_head(base)
        temps = self.root.glob(f"{stem}.faiss.*.tmp") if self.root.is_dir() else ()
        doomed = [t for t in temps if _age(t) > _TMP_GRACE_S]
        if head is None or head[0] <= epoch:
            doomed += [base, base.with_suffix(".faiss.log")]  # base first: a log without its base is never read
        gone = False
        for path in doomed:
            try:
                path.unlink()
                gone = True
            except FileNotFoundError:
                pass
        return gone

    def delete(self, user_id: str) -> bool:
        """Remove the user's base and log (the base first: a log without its base is never read)."""
        existed = True
        try:
            self.path_for(user_id).unlink()
        except FileNotFoundError:
            existed = False
        self.log_path_for(user_id).unlink(missing_ok=True)
        return existed


def _read_head(path: str | Path) -> tuple[int, int, int] | None:
    """(epoch, version, token) of a base file's header; None when missing or of another layout."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            head = os.read(fd, BASE_HEADER.size)
        finally:
            os.close(fd)
        magic, epoch, version, token, _ = BASE_HEADER.unpack(head)
    except (OSError, struct.error):
        return None
    return (int(epoch), int(version), int(token)) if magic == BASE_MAGIC else None


def _age(path: Path) -> float:
    """Seconds since ``path`` was last written; 0 when it is gone already."""
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
