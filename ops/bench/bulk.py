"""Bulk-loading large synthetic memories: WritePlans applied in batches, then the FAISS index rebuilt.

Used for users too large to ingest message by message on this machine (10K, 100K facts). The plans go
through the real ``GraphStore.apply`` and ``IndexKeeper.rebuild``; only consolidation is skipped (the
facts are distinct by construction). Each fact carries what apply stores for a statement: its vector and
its packed token states (all its words, ``storage.embedding.states``), so a recall's late-interaction step
pays MaxSim on the bulk-loaded facts as on a real user's, not the cosine that stands in for a record
without states. Statement embeddings and states are cached on disk (under the run's --out) by text, since
encoding 100K sentences takes minutes on two cores and the same corpus is reloaded by every run.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from corpus import T0, vocabulary

__all__ = ["bulk_load", "embed_cached", "encode_cached", "statements"]

_VERBS = (
    "enjoyed",
    "talked about",
    "visited",
    "read about",
    "worked with",
    "argued about",
    "planned around",
    "learned about",
    "cooked with",
    "wrote about",
)
_LINKS = ("knows", "works near", "recommended", "travelled with", "grew up near")
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_BATCH = 1_000
_STATES_BATCH = 2_000  # texts encoded with their token states at once (their float states are held until packed)


def statements(seed: str, n: int) -> list[tuple[str, int, int | None]]:
    """``n`` distinct fact sentences: (statement, subject entity index or -1 for the user, object index)."""
    vocab = [name for names in vocabulary().values() for name in names]
    r = random.Random(f"bulk:{seed}")
    seen: set[str] = set()
    out: list[tuple[str, int, int | None]] = []
    while len(out) < n:
        obj = r.randrange(len(vocab))
        when = f"in {r.choice(_MONTHS)} {r.randrange(1990, 2025)}"
        if r.random() < 0.8:
            text, subject = f"User {r.choice(_VERBS)} {vocab[obj]} {when}", -1
        else:
            subject = r.randrange(len(vocab))
            text = f"{vocab[subject]} {r.choice(_LINKS)} {vocab[obj]} {when}"
        if text not in seen and subject != obj:
            seen.add(text)
            out.append((text, subject, obj))
    return out


def _cache_path(embedder: Any, texts: Sequence[str], out: Path, name: str) -> Path:
    """Where ``texts``' encodings (``name``: emb.npy, states.npz) by ``embedder``'s model are cached under
    ``out``/cache."""
    digest = hashlib.sha256(f"{embedder.model_name}\n".encode() + "\n".join(texts).encode()).hexdigest()[:20]
    stem, suffix = name.split(".")
    return out / "cache" / f"{stem}-{digest}.{suffix}"


def embed_cached(embedder: Any, texts: Sequence[str], out: Path) -> np.ndarray:
    """Embeddings of ``texts`` (model output), cached under ``out``/cache (the run's --out) by content hash."""
    path = _cache_path(embedder, texts, out, "emb.npy")
    if path.exists():
        return np.load(path)
    vecs = embedder.encode(list(texts))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vecs)
    return vecs


def encode_cached(embedder: Any, texts: Sequence[str], out: Path) -> tuple[np.ndarray, list[bytes]]:
    """``embed_cached``'s embeddings of ``texts`` and each one's packed token states (every word, as apply keeps
    a statement's), from the same passes (``Embedder.encode_states``, whose vectors equal ``encode``'s); both
    cached under ``out``/cache, the states as one byte array and each blob's end."""
    from engram_api.storage.embedding.states import pack

    vec_path, states_path = (_cache_path(embedder, texts, out, name) for name in ("emb.npy", "states.npz"))
    if vec_path.exists() and states_path.exists():
        with np.load(states_path) as held:
            raw, ends = held["raw"].tobytes(), held["ends"].tolist()
        return np.load(vec_path), [raw[lo:hi] for lo, hi in zip([0, *ends[:-1]], ends, strict=True)]
    parts, blobs = [], []
    for lo in range(0, len(texts), _STATES_BATCH):
        vecs, kept = embedder.encode_states(list(texts[lo : lo + _STATES_BATCH]))
        parts.append(vecs)
        blobs.extend(pack(k) for k in kept)
    vecs = np.concatenate(parts) if parts else np.zeros((0, embedder.dim), dtype=np.float32)
    vec_path.parent.mkdir(parents=True, exist_ok=True)
    np.save(vec_path, vecs)
    raw = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    np.savez(states_path, raw=raw, ends=np.cumsum([len(b) for b in blobs], dtype=np.int64))
    return vecs, blobs


def bulk_load(
    graph: Any, keeper: Any, embedder: Any, redis_client: Any, user_id: str, n: int, seed: str, *, out: Path
) -> int:
    """Write ``n`` facts about ``user_id`` (and the vocabulary entities) and rebuild the user's index.

    Returns the user's version after the load (also published to Redis, as the apply stage does).
    """
    from engram_api.models import EntityRecord, EpisodeRecord, FactRecord, WritePlan
    from engram_api.naming import normalize_name, self_entity_id
    from engram_api.versions import publish_stamp

    vocab = [(label, name) for label, names in vocabulary().items() for name in names]
    facts = statements(seed, n)
    fact_vecs, fact_states = encode_cached(embedder, [s for s, _, _ in facts], out)
    entity_vecs = embed_cached(embedder, ["User", *[name for _, name in vocab]], out)
    me = self_entity_id(user_id)
    ids = [f"ent_{hashlib.blake2b(f'{user_id}:{name}'.encode(), digest_size=10).hexdigest()}" for _, name in vocab]
    entities = [
        EntityRecord(
            id=me,
            user_id=user_id,
            name="User",
            norm_name=normalize_name("User"),
            label="Person",
            embedding=entity_vecs[0].tolist(),
        ),
        *[
            EntityRecord(
                id=eid, user_id=user_id, name=name, norm_name=normalize_name(name), label=label, embedding=vec.tolist()
            )
            for eid, (label, name), vec in zip(ids, vocab, entity_vecs[1:], strict=True)
        ],
    ]
    version = 0
    for batch, lo in enumerate(range(0, n, _BATCH)):
        when = T0 + timedelta(minutes=lo)
        episode = EpisodeRecord(id=f"bulk-{batch}", user_id=user_id, content=f"bulk load {batch}", event_time=when)
        new_facts = [
            FactRecord(
                id=f"fact_{hashlib.blake2b(f'{user_id}:{i}'.encode(), digest_size=12).hexdigest()}",
                user_id=user_id,
                subject_id=me if subject < 0 else ids[subject],
                predicate="RELATED_TO",
                object_id=ids[obj] if obj is not None else None,
                statement=text,
                valid_from=when,
                created_at=when,
                importance=0.5,
                embedding=fact_vecs[i].tolist(),
                token_states=fact_states[i],
            )
            for i, (text, subject, obj) in enumerate(facts[lo : lo + _BATCH], start=lo)
        ]
        plan = WritePlan(
            user_id=user_id, episode=episode, new_entities=entities if batch == 0 else [], new_facts=new_facts
        )
        version = graph.apply(plan).version
    publish_stamp(redis_client, user_id, keeper.rebuild(user_id).stamp)
    return version
