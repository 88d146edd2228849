"""Topic clusters over each user's current facts: the "broad" level of search.

Per user: the current facts' vectors come from the user's FAISS index (already computed, no
re-embedding), spherical k-means groups them into k = clamp(round(sqrt(n / 2)), 1, 12) topics with a
fixed seed and iteration budget (deterministic and bounded), and each topic becomes a ``ClusterRecord``
with a label, an extractive summary and a centroid the reader compares query embeddings with.

Choices:
- fewer than ``MIN_FACTS`` (3) current facts -> no clusters: a summary of one or two facts says nothing the
  facts don't, and ``search(auto)`` falls back to facts when no cluster scores well;
- a cluster's ``signature`` hashes its member ids and statements; a user whose stored clusters cover
  exactly the current facts with matching signatures is skipped, so an idle user costs one read;
- the expensive part runs outside the per-user guard (it must not hold up ingestion); the write re-checks
  the graph version inside the guard and recomputes when an apply slipped in between.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from engram_api.models import ClusterRecord, FactRecord, check_aware, utcnow
from engram_api.naming import normalize_name
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.writer.userwrite import UserWrite
from engram_api.versions import Stamp
from engram_workers.maintenance._common import Guard, UserFailure, guarded, isolate, target_users

__all__ = [
    "HierarchyReport",
    "HierarchyUser",
    "cluster_count",
    "member_signature",
    "rebuild_hierarchy",
]

MIN_FACTS = 3
MAX_CLUSTERS = 12
KMEANS_ITERATIONS = 20
KMEANS_SEED = 1234
MAX_RESTARTS = 50
KMEANS_BUDGET = 200_000  # facts x clusters per k-means run, summed over the restarts
SUMMARY_STATEMENTS = 3
SUMMARY_MAX_CHARS = 500
# An apply that lands while we cluster invalidates the result; after this many tries the user waits
# for the next scheduled run instead of holding the worker.
MAX_ATTEMPTS = 3
# Predicate words that carry no topic ("HAS_SISTER" is about a sister, "WORKS_AT" about work).
_PREDICATE_STOPWORDS = frozenset(
    {
        "has",
        "have",
        "had",
        "is",
        "are",
        "was",
        "be",
        "a",
        "an",
        "the",
        "of",
        "at",
        "as",
        "in",
        "on",
        "to",
        "for",
        "with",
        "by",
        "from",
        "and",
        "or",
        "its",
        "his",
        "her",
        "their",
        "my",
    }
)


class HierarchyUser(BaseModel):
    user_id: str
    status: Literal["rebuilt", "skipped", "deferred"]
    facts: int = Field(description="current facts considered")
    clusters: int = Field(description="clusters stored after the run")
    detail: str = ""


class HierarchyReport(BaseModel):
    users: int = 0
    rebuilt: int = 0
    skipped: int = 0
    deferred: int = 0
    clusters: int = 0
    per_user: list[HierarchyUser] = Field(default_factory=list)
    failed: list[UserFailure] = Field(default_factory=list)


def cluster_count(n: int) -> int:
    """How many topics ``n`` current facts get (0 below ``MIN_FACTS``)."""
    if n < MIN_FACTS:
        return 0
    return max(1, min(MAX_CLUSTERS, round(math.sqrt(n / 2))))


def member_signature(facts: Sequence[FactRecord]) -> str:
    """Hash of the sorted member ids and their statements: changes when a member or its text does."""
    digest = hashlib.sha256()
    for fact in sorted(facts, key=lambda f: f.id):
        digest.update(f"{fact.id}\x1f{fact.statement}\x1e".encode())
    return digest.hexdigest()


def rebuild_hierarchy(
    *,
    graph: GraphStore,
    keeper: IndexKeeper,
    embedder: Embedder,
    settings: Settings,
    guard: Guard,
    user_ids: list[str] | None = None,
    now: datetime | None = None,
) -> HierarchyReport:
    """Recluster every user whose current facts changed since the last run; skip the others."""
    when = check_aware(now, "now") or utcnow()
    report = HierarchyReport()
    for user_id in target_users(graph, user_ids):
        with isolate("hierarchy", user_id, report.failed):
            outcome = _rebuild_user(
                user_id,
                graph=graph,
                keeper=keeper,
                embedder=embedder,
                settings=settings,
                guard=guard,
                now=when,
            )
            report.users += 1
            report.clusters += outcome.clusters
            if outcome.status == "rebuilt":
                report.rebuilt += 1
            elif outcome.status == "skipped":
                report.skipped += 1
            else:
                report.deferred += 1
            report.per_user.append(outcome)
    return report


def _rebuild_user(
    user_id: str,
    *,
    graph: GraphStore,
    keeper: IndexKeeper,
    embedder: Embedder,
    settings: Settings,
    guard: Guard,
    now: datetime,
) -> HierarchyUser:
    facts: list[FactRecord] = []
    for _ in range(MAX_ATTEMPTS):
        stamp = graph.user_stamp(user_id)
        facts, vectors = _current_facts(graph, keeper, user_id, stamp, settings.maintenance_batch)
        stored = graph.clusters(user_id)
        if _unchanged(stored, facts):
            return HierarchyUser(user_id=user_id, status="skipped", facts=len(facts), clusters=len(stored))
        clusters = _build_clusters(user_id, facts, vectors, embedder, now)

        def store(write: UserWrite, clusters: list[ClusterRecord] = clusters, stamp: Stamp = stamp) -> bool:
            if write.before != stamp:
                return False  # an apply or forget landed meanwhile: recluster the new state
            graph.replace_clusters(user_id, clusters)
            # Clusters change no embedding (an empty delta to the new stamp) and call for no other visit.
            write.finish(changed=False)
            return True

        if not guarded(guard, user_id, store):
            continue
        return HierarchyUser(user_id=user_id, status="rebuilt", facts=len(facts), clusters=len(clusters))
    return HierarchyUser(
        user_id=user_id,
        status="deferred",
        facts=len(facts),
        clusters=len(graph.clusters(user_id)),
        detail=f"graph changed during each of {MAX_ATTEMPTS} attempts; next run retries",
    )


def _current_facts(
    graph: GraphStore, keeper: IndexKeeper, user_id: str, stamp: Stamp, batch: int
) -> tuple[list[FactRecord], np.ndarray]:
    """Current (valid, not archived) facts and their index vectors row for row, ordered by statement:
    k-means starts from rows picked by position, so content order (not random ids) makes the same facts
    give the same clusters on every run and every store."""
    index = keeper.peek(user_id, stamp)  # no copy of every user onto this host: ``IndexKeeper.peek``
    fact_ids = sorted(index.node_ids("fact"))
    facts: list[FactRecord] = []
    for start in range(0, len(fact_ids), batch):
        facts.extend(f for f in graph.get_facts(user_id, fact_ids[start : start + batch]) if f.current_at(None))
    facts.sort(key=lambda f: (f.statement, f.id))
    found = index.vectors_for(f.id for f in facts)
    facts = [f for f in facts if f.id in found]
    vectors = np.array([found[f.id] for f in facts], dtype=np.float32).reshape(len(facts), index.dim)
    return facts, vectors


def _unchanged(stored: Sequence[ClusterRecord], facts: Sequence[FactRecord]) -> bool:
    """True when the stored clusters are exactly what the current facts call for."""
    if len(facts) < MIN_FACTS:
        return not stored
    by_id = {f.id: f for f in facts}
    members = [fid for cluster in stored for fid in cluster.member_fact_ids]
    if len(members) != len(by_id) or set(members) != by_id.keys():
        return False
    return all(
        cluster.signature == member_signature([by_id[fid] for fid in cluster.member_fact_ids]) for cluster in stored
    )


def _assign(vectors: np.ndarray, k: int) -> np.ndarray:
    """Cluster index of every row: spherical k-means (cosine) with a fixed seed and a bounded budget."""
    if k == 1:
        return np.zeros(len(vectors), dtype=np.int64)
    import faiss

    # Every fact of a user shares a direction (one subject, one way of phrasing), and on a few dozen
    # facts it outweighs the topics; clustering what is left after removing the mean finds the topics.
    centered = vectors - vectors.mean(axis=0)
    centered /= np.maximum(np.linalg.norm(centered, axis=1, keepdims=True), 1e-12)
    # Random starts find poor partitions of small sets: restart (keeping the best objective) as often
    # as the budget allows, which is many times for a small user and once for a large one.
    restarts = max(1, min(MAX_RESTARTS, KMEANS_BUDGET // (len(vectors) * k)))
    # min_points_per_centroid=1: a handful of facts per topic is the normal case here, not a mistake.
    kmeans = faiss.Kmeans(
        vectors.shape[1],
        k,
        niter=KMEANS_ITERATIONS,
        nredo=restarts,
        seed=KMEANS_SEED,
        spherical=True,
        min_points_per_centroid=1,
        verbose=False,
    )
    data = np.ascontiguousarray(centered, dtype=np.float32)
    kmeans.train(data)
    _, labels = kmeans.index.search(data, 1)
    return labels[:, 0].astype(np.int64)


def _theme(predicate: str) -> str:
    """'WORKS_AT' -> 'Work', 'HAS_HOBBY' -> 'Hobby', 'FAVORITE_FOOD' -> 'Favorite food'."""
    words = [w for w in predicate.lower().split("_") if w and w not in _PREDICATE_STOPWORDS]
    if not words:
        return ""
    last = words[-1]
    if last.endswith("ies") and len(last) > 4:
        last = last[:-3] + "y"
    elif last.endswith("s") and len(last) > 3 and not last.endswith(("ss", "us", "is")):
        last = last[:-1]
    return " ".join([*words[:-1], last]).capitalize()


def _hub_entities(facts: Sequence[FactRecord]) -> set[str]:
    """Entities in at least half of the user's facts (the user themself, mostly): they name no topic."""
    counts = Counter(eid for f in facts for eid in {f.subject_id, f.object_id} if eid)
    return {eid for eid, n in counts.items() if n >= 2 and n * 2 >= len(facts)}


def _terms(fact: FactRecord, hubs: set[str]) -> dict[str, str]:
    """Label candidates of one fact, normalized key -> display text."""
    terms = {}
    for eid, name in ((fact.subject_id, fact.subject_name), (fact.object_id, fact.object_name)):
        if eid and name and eid not in hubs:
            terms[normalize_name(name)] = name
    theme = _theme(fact.predicate)
    if theme:
        terms.setdefault(normalize_name(theme), theme)
    return terms


def _build_clusters(
    user_id: str, facts: Sequence[FactRecord], vectors: np.ndarray, embedder: Embedder, now: datetime
) -> list[ClusterRecord]:
    k = cluster_count(len(facts))
    if k == 0:
        return []
    labels = _assign(vectors, k)
    groups = [np.flatnonzero(labels == c) for c in range(k)]
    groups = sorted((g for g in groups if len(g)), key=lambda g: (-len(g), facts[int(g[0])].id))
    hubs = _hub_entities(facts)
    fact_terms = [_terms(f, hubs) for f in facts]
    # Every candidate label embedded once per user: ties in how often a term occurs are broken by how
    # close the term sits to the cluster's centroid (the most representative name wins).
    displays = sorted({text for terms in fact_terms for text in terms.values()})
    term_vectors = dict(zip(displays, embedder.encode(displays), strict=True))

    clusters = []
    for group in groups:
        members = [facts[int(i)] for i in group]
        mean = vectors[group].mean(axis=0)
        centroid = mean / max(float(np.linalg.norm(mean)), 1e-12)
        nearness = vectors[group] @ centroid
        ranked = [members[int(i)] for i in np.argsort(-nearness, kind="stable")]
        label = _label([fact_terms[int(i)] for i in group], term_vectors, centroid) or ranked[0].predicate
        signature = member_signature(members)
        clusters.append(
            ClusterRecord(
                id="cl_" + hashlib.sha256(f"{user_id}\x1f{signature}".encode()).hexdigest()[:32],
                user_id=user_id,
                label=label,
                summary=_summary(label, ranked),
                member_fact_ids=[f.id for f in ranked],
                member_entity_ids=sorted({eid for f in members for eid in (f.subject_id, f.object_id) if eid}),
                centroid=centroid.astype(float).tolist(),
                signature=signature,
                created_at=now,
                updated_at=now,
            )
        )
    return clusters


def _label(member_terms: Sequence[dict[str, str]], term_vectors: dict[str, np.ndarray], centroid: np.ndarray) -> str:
    """The entity name or predicate theme most members share; the nearest to the centroid on a tie."""
    counts: Counter[str] = Counter(key for terms in member_terms for key in terms)
    display = {key: text for terms in member_terms for key, text in terms.items()}
    if not counts:
        return ""
    best = max(counts, key=lambda key: (counts[key], float(term_vectors[display[key]] @ centroid), key))
    return display[best]


def _summary(label: str, ranked: Sequence[FactRecord]) -> str:
    """Extractive: the label and the member statements nearest the centroid."""
    shown = "; ".join(f.statement.strip().rstrip(".") for f in ranked[:SUMMARY_STATEMENTS])
    more = len(ranked) - SUMMARY_STATEMENTS
    text = f"{label}: {shown}" + (f" (+{more} more)" if more > 0 else "")
    return text if len(text) <= SUMMARY_MAX_CHARS else text[: SUMMARY_MAX_CHARS - 1] + "…"
