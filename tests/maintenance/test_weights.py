"""Weight learning: feedback that rewards the graph component moves weight to beta and ranks better;
too little feedback keeps the configured weights and says so."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from engram_api.models import FeedbackRow
from engram_api.settings import Settings
from engram_api.storage.graph.contract import GraphStore
from engram_workers.maintenance import Weights, effective_weights, learn_weights
from engram_workers.maintenance.weights import GLOBAL_SCOPE, auc, tenant_of
from tests.support.builders import GuardSpy, UserGraph, new_user

SETTINGS = Settings(alpha=0.6, beta=0.25, gamma=0.15, recency_weight=0.1, importance_weight=0.1, min_feedback=30)
CONFIGURED = Weights.from_settings(SETTINGS)
ITEMS = 8  # candidates per recall


def _recalls(seed: int, count: int) -> np.ndarray:
    """(count, ITEMS, 6): similarity, graph, strength, recency, importance, useful. Usefulness follows
    the graph component (plus noise); similarity is high for everything, as for real recall candidates."""
    rng = np.random.default_rng(seed)
    comps = np.stack(
        [
            rng.uniform(0.35, 0.9, (count, ITEMS)),  # similarity
            rng.uniform(0.0, 1.0, (count, ITEMS)),  # graph
            rng.uniform(0.2, 1.0, (count, ITEMS)),  # strength
            rng.uniform(0.0, 1.0, (count, ITEMS)),  # recency
            rng.uniform(0.0, 1.0, (count, ITEMS)),  # importance
        ],
        axis=-1,
    )
    useful = comps[..., 1] + rng.normal(0, 0.12, (count, ITEMS)) > 0.65
    return np.concatenate([comps, useful[..., None]], axis=-1)


def _rows(user: str, recalls: np.ndarray, tag: str) -> list[FeedbackRow]:
    """Feedback rows; recall ids are fixed by ``tag`` so the held-out split (by recall) is repeatable."""
    rows = []
    for r, items in enumerate(recalls):
        for i, (sim, graph, strength, recency, importance, useful) in enumerate(items.tolist()):
            rows.append(
                FeedbackRow(
                    user_id=user,
                    recall_id=f"recall-{tag}-{r}",
                    fact_id=f"fact-{tag}-{r}-{i}",
                    useful=bool(useful),
                    similarity=sim,
                    graph=graph,
                    strength=strength,
                    recency=recency,
                    importance=importance,
                )
            )
    return rows


def _precision_at_3(weights: Weights, recalls: np.ndarray) -> float:
    scores = recalls[..., :5] @ np.array(weights.values())
    top = np.argsort(-scores, axis=1, kind="stable")[:, :3]
    return float(np.take_along_axis(recalls[..., 5], top, axis=1).mean())


def test_feedback_that_rewards_the_graph_raises_beta_and_ranks_held_out_recalls_better(
    store: GraphStore, graph: GraphStore, guard: GuardSpy, user: str
) -> None:
    store.add_feedback(_rows(user, _recalls(seed=1, count=40), "a"))  # 320 rows

    report = learn_weights(graph=graph, settings=SETTINGS, guard=guard, user_ids=[user])

    assert not report.failed and [s.scope for s in report.scopes] == [user]
    outcome = report.scopes[0]
    assert outcome.status == "learned" and outcome.samples == 320, outcome.detail
    learned = outcome.weights
    core = learned.alpha + learned.beta + learned.gamma
    configured_core = CONFIGURED.alpha + CONFIGURED.beta + CONFIGURED.gamma
    assert core == pytest.approx(configured_core)
    assert learned.beta / core > CONFIGURED.beta / configured_core
    assert outcome.quality is not None and outcome.configured_quality is not None
    assert outcome.quality > outcome.configured_quality
    stored = store.load_weights(user)
    assert stored is not None and Weights.of(stored) == learned
    assert stored.samples == 320 and stored.quality == pytest.approx(outcome.quality)
    assert effective_weights(store, SETTINGS, user) == (learned, "learned:user")
    assert guard.entered == [user]

    held_out = _recalls(seed=2, count=300)  # recalls the fit never saw
    before, after = _precision_at_3(CONFIGURED, held_out), _precision_at_3(learned, held_out)
    print(
        f"\nconfigured {CONFIGURED.model_dump()}\nlearned    {learned.model_dump(mode='json')}"
        f"\nheld-out AUC {outcome.configured_quality:.3f} -> {outcome.quality:.3f}"
        f"\nheld-out mean precision@3: configured {before:.3f}, learned {after:.3f}"
    )
    assert after > before + 0.1


def test_no_feedback_keeps_the_configured_weights(
    store: GraphStore, graph: GraphStore, guard: GuardSpy, user: str
) -> None:
    report = learn_weights(graph=graph, settings=SETTINGS, guard=guard, user_ids=[user])

    assert [(s.scope, s.status, s.detail) for s in report.scopes] == [
        (user, "kept", "kept configured: 0 < 30 feedback rows")
    ]
    assert report.scopes[0].weights == CONFIGURED and (report.learned, report.kept) == (0, 1)
    assert store.load_weights(user) is None
    assert effective_weights(store, SETTINGS, user)[1] != "learned:user"


# Runs on SQLite only: on the shared Neo4j database every test's users and feedback are visible.
@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_full_run_with_too_little_feedback_saves_nothing_anywhere(
    backend: str, store: GraphStore, graph: GraphStore, guard: GuardSpy, user: str
) -> None:
    UserGraph(store, user).say([("Alex", "WORKS_AT", "Dell", "Alex works at Dell")])
    store.add_feedback(_rows(user, _recalls(seed=3, count=3), "b")[:12])

    report = learn_weights(graph=graph, settings=SETTINGS, guard=guard)

    assert [(s.scope, s.detail) for s in report.scopes] == [
        (user, "kept configured: 12 < 30 feedback rows"),
        (GLOBAL_SCOPE, "kept configured: 12 < 30 feedback rows"),
    ]
    assert store.load_weights(user) is None and store.load_weights(GLOBAL_SCOPE) is None
    assert effective_weights(store, SETTINGS, user) == (CONFIGURED, "configured")


# Runs on SQLite only: on the shared Neo4j database every test's users and feedback are visible.
@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_global_scope_learns_from_every_users_feedback(
    backend: str, store: GraphStore, graph: GraphStore, guard: GuardSpy
) -> None:
    users = [new_user(), new_user(), new_user()]
    for seed, user in enumerate(users):
        UserGraph(store, user).say([("Alex", "PLAYS", "chess", "Alex plays chess")])
        store.add_feedback(_rows(user, _recalls(seed=10 + seed, count=3), f"c{seed}"))  # 24 rows: < 30

    report = learn_weights(graph=graph, settings=SETTINGS, guard=guard)

    statuses = {s.scope: s.status for s in report.scopes}
    assert statuses == {**dict.fromkeys(users, "kept"), GLOBAL_SCOPE: "learned"}
    stored = store.load_weights(GLOBAL_SCOPE)
    assert stored is not None and stored.samples == 72
    weights, source = effective_weights(store, SETTINGS, users[0])
    assert source == "learned:global" and weights.beta > CONFIGURED.beta


# SQLite only, like the test above: the global scope sees every user of the database.
@pytest.mark.parametrize("backend", ["sqlite"])
def test_one_tenant_contributes_at_most_its_share_to_the_global_fit(
    backend: str, store: GraphStore, graph: GraphStore, guard: GuardSpy
) -> None:
    settings = SETTINGS.model_copy(update={"weights_rows_per_user": 40})
    flooder, quiet = new_user(), [new_user(), new_user()]
    for seed, user in enumerate([flooder, *quiet]):
        UserGraph(store, user).say([("Alex", "PLAYS", "chess", "Alex plays chess")])
        count = 50 if user == flooder else 3  # 400 rows against 24 + 24
        store.add_feedback(_rows(user, _recalls(seed=20 + seed, count=count), f"d{seed}"))

    report = learn_weights(graph=graph, settings=settings, guard=guard)

    [global_outcome] = [s for s in report.scopes if s.scope == GLOBAL_SCOPE]
    assert global_outcome.samples == 40 + 24 + 24
    assert Settings().weights_rows_per_user == 500


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_tenant_spreading_feedback_over_many_user_ids_contributes_at_most_its_cap(
    backend: str, store: GraphStore, graph: GraphStore, guard: GuardSpy
) -> None:
    """Issue 44, finding 12: the per-user cap alone let one tenant (one key's namespace) steer the global
    weights by spreading its feedback over many user ids."""
    settings = SETTINGS.model_copy(update={"weights_rows_per_user": 40, "weights_rows_per_tenant": 60})
    tenant = f"t{uuid.uuid4().hex[:8]}"
    flooders, quiet = [f"{tenant}.{new_user()}" for _ in range(5)], [new_user(), new_user()]
    for seed, user in enumerate([*flooders, *quiet]):
        UserGraph(store, user).say([("Alex", "PLAYS", "chess", "Alex plays chess")])
        count = 50 if user in flooders else 3  # 5 x 400 rows (5 x 40 after the per-user cap) against 24 + 24
        store.add_feedback(_rows(user, _recalls(seed=30 + seed, count=count), f"t{seed}"))

    report = learn_weights(graph=graph, settings=settings, guard=guard)

    [global_outcome] = [s for s in report.scopes if s.scope == GLOBAL_SCOPE]
    assert global_outcome.samples == 60 + 24 + 24
    assert Settings().weights_rows_per_tenant == 2_000
    assert tenant_of(flooders[0]) == tenant and tenant_of(quiet[0]) == quiet[0]


def test_feedback_with_one_outcome_only_teaches_nothing(
    store: GraphStore, graph: GraphStore, guard: GuardSpy, user: str
) -> None:
    rows = [r.model_copy(update={"useful": True}) for r in _rows(user, _recalls(seed=4, count=5), "d")]
    store.add_feedback(rows)

    report = learn_weights(graph=graph, settings=SETTINGS, guard=guard, user_ids=[user])

    assert report.scopes[0].detail == "kept configured: every training row is useful: nothing to learn"
    assert store.load_weights(user) is None


def test_auc_counts_pairs_and_ties() -> None:
    labels = np.array([1.0, 1.0, 0.0, 0.0])
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 1.0
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 0.0
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), labels) == 0.5
    assert auc(np.array([0.9, 0.3, 0.3, 0.1]), labels) == pytest.approx(0.875)
