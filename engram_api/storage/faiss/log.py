"""The delta log beside a user's index file: append-only records of the changes since the file was written.

Layout: a header (magic ``EGL2``, u64 token) then records. The token pairs the log with one index file:
every full write of the file draws a new token and replaces the log with an empty one carrying it, so a
log left by an earlier file (a crash between the two renames) is recognised and ignored, never replayed
onto a base it does not belong to. A record is magic ``EGR2``, u32 payload length, u32 CRC-32 of the
payload, then the payload: the stamps before and after (u64 epoch, u64 version each), u32 metadata
length, u32 vector count, the JSON metadata (removed node ids, added (node, kind) pairs, the added rows'
token states as (node, length) pairs), the added vectors as little-endian float32, then the token states'
bytes. Layout 2 added the states: a log of layout 1 is not read (its file, ``EGI4``, is rebuilt anyway).

Invariants: records form a chain (each one's ``before`` is the previous one's ``after``, the first one's
is the file's stamp); a reader applies records while the chain holds and stops at the first record that
is incomplete, fails its checksum or breaks the chain, so a torn tail (a writer killed mid-append) is
never applied and the index reads at the last whole record's stamp. A writer truncates the log to the
last whole record before appending (it holds the user's lease, so that tail is nobody's).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engram_api.storage.faiss.index import Kind, UserIndex
from engram_api.versions import Stamp

__all__ = ["LOG_HEADER", "Delta", "encode_record", "log_header", "log_token", "read_records"]

LOG_MAGIC = b"EGL2"
LOG_HEADER = struct.Struct("<4sQ")
_RECORD = struct.Struct("<4sII")
_RECORD_MAGIC = b"EGR2"
_PAYLOAD = struct.Struct("<QQQQII")


@dataclass(frozen=True, slots=True)
class Delta:
    """One write's change to a user's vectors: removals first, then upserts (as ``UserIndex.upsert``)."""

    before: Stamp
    after: Stamp
    removed: tuple[str, ...]
    added: tuple[tuple[str, Kind], ...]
    vectors: np.ndarray  # (len(added), dim) float32
    states: tuple[tuple[str, bytes], ...] = ()  # the added rows' packed token states, those that have them

    def apply(self, index: UserIndex) -> None:
        """Change ``index`` (a copy nobody else holds) from ``before`` to ``after``."""
        index.remove(self.removed)
        index.upsert(
            ((node, kind, vec) for (node, kind), vec in zip(self.added, self.vectors, strict=True)), dict(self.states)
        )
        index.stamp = self.after


def log_header(token: int) -> bytes:
    return LOG_HEADER.pack(LOG_MAGIC, token)


def log_token(head: bytes) -> int | None:
    """The token of a log starting with ``head``, None when it is not a log."""
    if len(head) < LOG_HEADER.size:
        return None
    magic, token = LOG_HEADER.unpack_from(head)
    return int(token) if magic == LOG_MAGIC else None


def encode_record(delta: Delta) -> bytes:
    meta = json.dumps(
        {
            "removed": list(delta.removed),
            "added": [list(a) for a in delta.added],
            "states": [[node, len(blob)] for node, blob in delta.states],
        }
    ).encode()
    vectors = np.ascontiguousarray(delta.vectors, dtype="<f4").tobytes()
    states = b"".join(blob for _, blob in delta.states)
    payload = _PAYLOAD.pack(*delta.before, *delta.after, len(meta), len(delta.added)) + meta + vectors + states
    return _RECORD.pack(_RECORD_MAGIC, len(payload), zlib.crc32(payload)) + payload


def read_records(data: bytes, dim: int) -> Iterator[tuple[int, Delta]]:
    """Whole, checksummed records at the start of ``data``: (end offset, delta), stopping at the first
    torn or damaged one."""
    offset = 0
    while offset + _RECORD.size <= len(data):
        magic, length, crc = _RECORD.unpack_from(data, offset)
        start, end = offset + _RECORD.size, offset + _RECORD.size + length
        if magic != _RECORD_MAGIC or end > len(data) or length < _PAYLOAD.size:
            return
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            return
        be, bv, ae, av, meta_len, count = _PAYLOAD.unpack_from(payload)
        meta = json.loads(payload[_PAYLOAD.size : _PAYLOAD.size + meta_len])
        raw = payload[_PAYLOAD.size + meta_len :]
        sizes = [int(length) for _, length in meta["states"]]
        if len(raw) != count * dim * 4 + sum(sizes):
            return  # written for another dimension: not this index's record
        vectors = np.frombuffer(raw[: count * dim * 4], dtype="<f4").reshape(count, dim)
        at, states = count * dim * 4, []
        for (node, _), size in zip(meta["states"], sizes, strict=True):
            states.append((str(node), raw[at : at + size]))
            at += size
        yield (
            end,
            Delta(
                before=Stamp(be, bv),
                after=Stamp(ae, av),
                removed=tuple(str(n) for n in meta["removed"]),
                added=tuple((str(n), k) for n, k in meta["added"]),
                vectors=vectors,
                states=tuple(states),
            ),
        )
        offset = end
