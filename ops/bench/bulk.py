"""Bulk-loading large synthetic memories: WritePlans applied in batches, then the FAISS index rebuilt.

Used for users too large to ingest message by message on this machine (10K, 100K facts). The plans go
through the real ``GraphStore.apply`` and ``IndexKeeper.rebuild``; only consolidation is skipped (the
facts are distinct by construction). Statement embeddings are cached on disk (under the run's --out) by text, since encoding
100K sentences takes minutes on two cores and the same corpus is reloaded by every run.
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

__all__ = ["bulk_load", "embed_cached", "statements"]

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


def embed_cached(embedder: Any, texts: Sequence[str], out: Path) -> np.ndarray:
    """Embeddings of ``texts`` (model output), cached under ``out``/cache (the run's --out) by content hash."""
    digest = hashlib.sha256(f"{embedder.model_name}\n".encode() + "\n".join(texts).encode()).hexdigest()[:20]
    path = out / "cache" / f"emb-{digest}.npy"
    if path.exists():
        return np.load(path)
    vecs = embedder.encode(list(texts))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vecs)
    return vecs


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
    fact_vecs = embed_cached(embedder, [s for s, _, _ in facts], out)
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
            )
            for i, (text, subject, obj) in enumerate(facts[lo : lo + _BATCH], start=lo)
        ]
        plan = WritePlan(
            user_id=user_id, episode=episode, new_entities=entities if batch == 0 else [], new_facts=new_facts
        )
        version = graph.apply(plan).version
    publish_stamp(redis_client, user_id, keeper.rebuild(user_id).stamp)
    return version
