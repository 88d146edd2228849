"""The fitted fusion (``reader.fitted``): weights shipped as data, checked when read, and a candidate's
fusion score their dot product with its features (the recall suites cover the ranking it gives)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_api.errors import ConfigError
from engram_api.reader import fitted
from engram_api.reader.cues import QueryCues
from engram_api.reader.fitted import FEATURES, FittedFusion, fitted_fusion, fitted_scores
from engram_api.reader.items import Candidate
from engram_api.reader.recipe import DEFAULT_RECIPE


def test_the_shipped_weights_name_every_feature_and_say_what_they_were_fitted_on() -> None:
    shipped = fitted_fusion()
    assert set(shipped.weights) == set(FEATURES)
    assert "conv-26" in shipped.fitted_on and "conv-41" in shipped.fitted_on  # the dev split, never held aside
    assert DEFAULT_RECIPE.fusion_mode == "fitted"


def test_weights_missing_a_feature_or_not_finite_are_refused() -> None:
    weights = dict.fromkeys(FEATURES, 1.0)
    with pytest.raises(ValueError, match=r"missing \['word_share'\]"):
        FittedFusion(weights={f: w for f, w in weights.items() if f != "word_share"}, fitted_on="x")
    with pytest.raises(ValueError, match="finite"):
        FittedFusion(weights={**weights, "graph": float("nan")}, fitted_on="x")


def test_a_bad_weights_file_is_a_config_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "fitted_fusion.json"
    bad.write_text(json.dumps({"weights": {"keyword": 1.0}, "fitted_on": "x"}))
    monkeypatch.setattr(fitted, "_FILE", bad)
    fitted_fusion.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"fitted_fusion\.json"):
            fitted_fusion()
    finally:
        fitted_fusion.cache_clear()


def test_a_candidates_score_is_the_weights_times_its_features() -> None:
    """A keyword hit ranked first (share 1 x the recipe's weight added) and a neighbouring turn it brought."""
    recipe = DEFAULT_RECIPE
    hit = Candidate(kind="episode")
    hit.add("keyword", recipe.weights["keyword"] * 1.0)
    hit.add("episode_vector", recipe.weights["episode_vector"] * 0.5)
    near = Candidate(kind="episode")
    near.add("window", recipe.link_share * hit.fusion)
    scores = fitted_scores(
        {"hit": hit, "near": near}, {"hit": 0.4}, QueryCues.of("a question"), frozenset(), recipe, lambda c: False
    )
    w = fitted_fusion().weights
    # No query words: every candidate holds the share 1 of them (``scoring.word_share``); excerpts: fact 0.
    assert scores["hit"] == pytest.approx(
        w["keyword"] + 0.5 * w["episode_vector"] + 0.4 * w["similarity"] + w["word_share"]
    )
    assert scores["near"] == pytest.approx(hit.fusion * w["window"] + w["word_share"])
