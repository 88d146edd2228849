"""Learning the recall scoring weights from feedback.

Each feedback row holds the score components of one recalled fact and whether the user found it useful.
A logistic regression (numpy, full-batch gradient descent with L2) predicts usefulness from the five
components; its coefficients, clipped at zero and rescaled so alpha + beta + gamma keeps its configured
total (the two boosts scaled by the same factor), become the weights. Since the reader's score is linear
in the components, ranking by it matches ranking by the fitted probability.

A fit is saved only when it earns it: enough rows (``settings.min_feedback``), both outcomes present,
and a held-out AUC at least that of the configured weights on the same rows. Otherwise nothing is saved
and the report says why; the reader keeps what it had (``effective_weights``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from engram_api.models import GLOBAL_SCOPE, WEIGHT_FIELDS, FeedbackRow, LearnedWeights, Weights
from engram_api.reader.scoring import effective_weights
from engram_api.settings import Settings
from engram_api.storage.graph.contract import GraphStore
from engram_workers.maintenance._common import Guard, UserFailure, isolate, target_users

__all__ = [
    "GLOBAL_SCOPE",
    "ScopeOutcome",
    "Weights",
    "WeightsReport",
    "auc",
    "effective_weights",
    "fit_logistic",
    "learn_weights",
    "tenant_of",
]

# Newest rows per scope: recent behaviour is what the weights should follow, and it bounds the fit.
MAX_ROWS = 20_000
HELD_OUT_FRACTION = 0.25
L2 = 1e-2
LEARNING_RATE = 0.5
MAX_ITERATIONS = 5_000
TOLERANCE = 1e-6


class ScopeOutcome(BaseModel):
    scope: str
    status: Literal["learned", "kept"]
    samples: int
    detail: str
    weights: Weights = Field(description="the learned weights, or the configured ones when kept")
    quality: float | None = Field(None, description="held-out AUC of the fitted model")
    configured_quality: float | None = Field(None, description="held-out AUC of the configured weights")


class WeightsReport(BaseModel):
    configured: Weights
    learned: int = 0
    kept: int = 0
    scopes: list[ScopeOutcome] = Field(default_factory=list)
    failed: list[UserFailure] = Field(default_factory=list)


def learn_weights(
    *,
    graph: GraphStore,
    settings: Settings,
    guard: Guard,
    user_ids: list[str] | None = None,
) -> WeightsReport:
    """Fit weights per user (from that user's feedback) and globally (from everyone's) and save the fits
    that beat the configured weights on held-out feedback. A run limited to ``user_ids`` leaves the
    global scope alone: it is everyone's data, refit by the full scheduled run."""
    configured = Weights.from_settings(settings)
    report = WeightsReport(configured=configured)
    # The global fit moves every user's ranking, so no tenant may dominate it: each user contributes
    # at most ``weights_rows_per_user`` of their newest rows (gathered from the per-user reads below), and
    # each tenant at most ``weights_rows_per_tenant``, however many user ids it spreads its feedback over.
    pooled: dict[str, list[FeedbackRow]] = {}
    for user_id in target_users(graph, user_ids):
        if user_id == GLOBAL_SCOPE:
            # User ids and "global" share LearnedWeights.scope: this user's fit would replace everyone's.
            _record(report, _kept(user_id, 0, configured, "the user id is the global scope's name"))
            continue
        with isolate("weights", user_id, report.failed):
            rows = graph.feedback(user_id, MAX_ROWS)
            pooled.setdefault(tenant_of(user_id), []).extend(rows[: settings.weights_rows_per_user])
            outcome, fitted = _learn_scope(user_id, rows, configured, settings)
            if fitted is not None:
                with guard(user_id):
                    graph.save_weights(fitted)
            _record(report, outcome)
    if user_ids is not None:
        return report
    # The global row is no user's data, so there is no user lock to take: apply never writes weights.
    with isolate("weights", GLOBAL_SCOPE, report.failed):
        shares = [_newest(rows, settings.weights_rows_per_tenant) for rows in pooled.values()]
        newest_first = _newest([row for share in shares for row in share], MAX_ROWS)
        outcome, fitted = _learn_scope(GLOBAL_SCOPE, newest_first, configured, settings)
        if fitted is not None:
            graph.save_weights(fitted)
        _record(report, outcome)
    return report


def tenant_of(user_id: str) -> str:
    """The namespace a gateway key binds (``shop`` of ``shop.alice``); a user id without a '.' is its own."""
    return user_id.split(".", 1)[0]


def _newest(rows: Sequence[FeedbackRow], limit: int) -> list[FeedbackRow]:
    return sorted(rows, key=lambda r: r.created_at, reverse=True)[:limit]


def _record(report: WeightsReport, outcome: ScopeOutcome) -> None:
    report.scopes.append(outcome)
    if outcome.status == "learned":
        report.learned += 1
    else:
        report.kept += 1


def _learn_scope(
    scope: str, rows: Sequence[FeedbackRow], configured: Weights, settings: Settings
) -> tuple[ScopeOutcome, LearnedWeights | None]:
    def kept(reason: str, **quality: float) -> tuple[ScopeOutcome, None]:
        return _kept(scope, len(rows), configured, reason, **quality), None

    if len(rows) < settings.min_feedback:
        return kept(f"{len(rows)} < {settings.min_feedback} feedback rows")
    features = np.array([r.values() for r in rows], dtype=np.float64)
    labels = np.array([r.useful for r in rows], dtype=np.float64)
    held = _held_out(rows)
    train_y, test_y = labels[~held], labels[held]
    if train_y.min() == train_y.max():
        return kept(f"every training row is {'useful' if train_y[0] else 'not useful'}: nothing to learn")
    if test_y.min() == test_y.max():
        return kept("the held-out rows are all one outcome: the fit cannot be measured")

    coefficients = fit_logistic(features[~held], train_y)
    weights = _to_weights(coefficients, configured)
    if weights is None:
        return kept("no positive similarity, graph or strength coefficient")
    quality = auc(features[held] @ np.array(weights.values()), test_y)
    baseline = auc(features[held] @ np.array(configured.values()), test_y)
    if quality < baseline:
        return kept(
            f"held-out AUC {quality:.3f} < {baseline:.3f} with configured weights",
            quality=quality,
            configured_quality=baseline,
        )
    fitted = LearnedWeights(scope=scope, **weights.model_dump(), samples=len(rows), quality=quality)
    outcome = ScopeOutcome(
        scope=scope,
        status="learned",
        samples=len(rows),
        weights=weights,
        quality=quality,
        configured_quality=baseline,
        detail=f"learned from {len(rows)} rows: held-out AUC {quality:.3f} (configured {baseline:.3f})",
    )
    return outcome, fitted


def _kept(scope: str, samples: int, configured: Weights, reason: str, **quality: float) -> ScopeOutcome:
    return ScopeOutcome(
        scope=scope,
        status="kept",
        samples=samples,
        detail=f"kept configured: {reason}",
        weights=configured,
        **quality,
    )


def _held_out(rows: Sequence[FeedbackRow]) -> np.ndarray:
    """Deterministic ~25 % held-out mask. Whole recalls are held out when there are enough of them (rows
    of one recall share a query, so splitting them would leak it); otherwise single rows are."""
    recalls = sorted({r.recall_id for r in rows}, key=_rank)
    if len(recalls) >= 4:
        held = set(recalls[: math.ceil(len(recalls) * HELD_OUT_FRACTION)])
        return np.array([r.recall_id in held for r in rows])
    order = sorted(range(len(rows)), key=lambda i: _rank(f"{rows[i].recall_id}\x1f{rows[i].fact_id}\x1f{i}"))
    held_rows = set(order[: max(1, math.ceil(len(rows) * HELD_OUT_FRACTION))])
    return np.array([i in held_rows for i in range(len(rows))])


def _rank(key: str) -> str:
    # A hash order is a fixed pseudo-random shuffle: the same rows always give the same split.
    return hashlib.sha256(key.encode()).hexdigest()


def fit_logistic(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """L2-regularised logistic regression by gradient descent; returns the coefficients on the raw
    (unstandardised) features, intercept dropped (it does not change a ranking)."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    # A constant component carries no signal: leave it at zero instead of dividing by zero.
    scale[scale < 1e-9] = 1.0
    z = (features - mean) / scale
    rate = float(np.clip(labels.mean(), 1e-6, 1 - 1e-6))
    w = np.zeros(z.shape[1])
    b = math.log(rate / (1 - rate))
    for _ in range(MAX_ITERATIONS):
        p = 1.0 / (1.0 + np.exp(-(z @ w + b)))
        grad_w = z.T @ (p - labels) / len(labels) + L2 * w
        grad_b = float(np.mean(p - labels))
        w -= LEARNING_RATE * grad_w
        b -= LEARNING_RATE * grad_b
        if max(float(np.abs(grad_w).max()), abs(grad_b)) < TOLERANCE:
            break
    return w / scale


def _to_weights(coefficients: np.ndarray, configured: Weights) -> Weights | None:
    positive = np.clip(coefficients, 0.0, None)
    core = float(positive[:3].sum())
    if core <= 0:
        return None
    factor = (configured.alpha + configured.beta + configured.gamma) / core
    return Weights(**dict(zip(WEIGHT_FIELDS, (positive * factor).tolist(), strict=True)))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability that a useful row outscores a useless one (ties count half): the Mann-Whitney U."""
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    # Tied scores share their average (1-based) rank.
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
