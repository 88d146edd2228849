"""The dense second look: the top of a recall's fused ranking re-scored by how like the query each item is.

Fusion (``reader.fusion``) ranks candidates mostly by what the keyword channel found (its weight carries
names, places and dates where MiniLM is weak); the composite score's similarity weight is small next to the
fusion score, so among the top hits an item the query's meaning fits best rarely moves past one that only
shares its words. This step adds, to each of the top ``RecallRecipe.rerank_depth`` rows, the recipe's
``rerank_similarity`` times its query similarity min-max normalized over those rows (the most similar 1, the
least 0), then orders them again.

Invariants:
- it belongs to the vector channels: a recipe without ``episode_vector`` and ``fact_vector`` skips it
  (it reads the similarity a vector channel's encoder gives), as does a weight or depth of 0;
- it only adds to a row's total and never to a row below the depth, and each row's addition is at most
  ``rerank_similarity``; the rows below the depth had totals at or under every row above it, so the whole
  list stays best first by total (ties by id), the order docs/api.md states, and an item's ``score`` is
  the total it is ordered by;
- a pure function of the rows: the same rows give the same order on a held snapshot and on the store, and
  the depth does not depend on the recall's k, so a recall of 10 is the first 10 of a recall of 40.
"""

from __future__ import annotations

from engram_api.reader.items import Row
from engram_api.reader.recipe import RecallRecipe
from engram_api.reader.scoring import normalized

__all__ = ["similarity_step"]


def similarity_step(rows: list[Row], recipe: RecallRecipe) -> list[Row]:
    """``rows`` (best first by total) with the top ``rerank_depth`` re-scored and re-ordered (module doc)."""
    weight, depth = recipe.rerank_similarity, recipe.rerank_depth
    if weight == 0 or depth == 0 or not (recipe.uses("episode_vector") or recipe.uses("fact_vector")):
        return rows
    top = rows[:depth]
    # The similarity is the composite score's first component (``SCORE_COMPONENTS``), floored at 0.
    shares = normalized([comp[0] for _, _, _, comp in top], cut=True)
    lifted = [
        (total + weight * share, node_id, cand, comp)
        for (total, node_id, cand, comp), share in zip(top, shares, strict=True)
    ]
    lifted.sort(key=lambda r: (-r[0], r[1]))
    return lifted + rows[depth:]
