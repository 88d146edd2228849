"""The second look: the top of a recall's fused ranking re-scored by how well each item fits the query's meaning.

Fusion (``reader.fusion``) ranks candidates mostly by what the keyword channel found (its weight carries
names, places and dates where MiniLM is weak); the composite score's similarity weight is small next to the
fusion score, so among the top hits an item the query's meaning fits best rarely moves past one that only
shares its words. This step adds, to each of the top ``RecallRecipe.rerank_depth`` rows, a weight times its
signal min-max normalized over those rows (the best 1, the worst 0), then orders them again. The signal:
- late interaction (``rerank_signal`` "late_interaction", weight ``rerank_late``; opt-in, ``reader.recipe``
  says why): MaxSim between the
  query's MiniLM token states and the item's stored ones (``storage.embedding.states``: the mean over the
  query's words of each one's best match among the item's words), given by the caller as ``late``; a row
  ``late`` lacks (a fact, a chunk stored before states were kept) gives its cosine in its place;
- the query similarity (``rerank_similarity``): the cosine, with "similarity" (the default), or when
  ``late`` is empty (no query states, no top row with states: an encoder or a memory without them behaves
  as before).
Offline on the dev conversations, late interaction in place of the cosine gave R@10 / MRR 0.844 / 0.611
against 0.820 / 0.571 (docs/benchmarks/history.md, "Late interaction from the packaged MiniLM ...").

Invariants:
- it belongs to the vector channels: a recipe without ``episode_vector`` and ``fact_vector`` skips it
  (it reads the similarity a vector channel's encoder gives), as does a weight or depth of 0;
- it only adds to a row's total and never to a row below the depth, and each row's addition is at most
  the weight; the rows below the depth had totals at or under every row above it, so the whole list stays
  best first by total (ties by id), the order docs/api.md states, and an item's ``score`` is the total it
  is ordered by;
- a pure function of the rows and ``late``: the same rows and states give the same order on a held
  snapshot and on the store, and the depth does not depend on the recall's k, so a recall of 10 is the
  first 10 of a recall of 40.
"""

from __future__ import annotations

from collections.abc import Mapping

from engram_api.reader.items import Row
from engram_api.reader.recipe import RecallRecipe
from engram_api.reader.scoring import normalized

__all__ = ["similarity_step"]


def similarity_step(rows: list[Row], recipe: RecallRecipe, late: Mapping[str, float] | None = None) -> list[Row]:
    """``rows`` (best first by total) with the top ``rerank_depth`` re-scored and re-ordered (module doc);
    ``late``: MaxSim by node id of the top rows that have token states (empty or None: the cosine step)."""
    depth = recipe.rerank_depth
    if depth == 0 or not (recipe.uses("episode_vector") or recipe.uses("fact_vector")):
        return rows
    top = rows[:depth]
    # The similarity is the composite score's first component (``SCORE_COMPONENTS``), floored at 0.
    if late and recipe.late_interaction:
        weight = recipe.rerank_late
        signal = [late.get(node_id, comp[0]) for _, node_id, _, comp in top]
    else:
        weight = recipe.rerank_similarity
        signal = [comp[0] for _, _, _, comp in top]
    if weight == 0:
        return rows
    shares = normalized(signal, cut=True)
    lifted = [
        (total + weight * share, node_id, cand, comp)
        for (total, node_id, cand, comp), share in zip(top, shares, strict=True)
    ]
    lifted.sort(key=lambda r: (-r[0], r[1]))
    return lifted + rows[depth:]
