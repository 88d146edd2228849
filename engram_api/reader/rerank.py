"""The second look: the top of a recall's fused ranking re-scored by how well each item fits the query's meaning.

Fusion (``reader.fusion``) ranks candidates mostly by what the keyword channel found (its weight carries
names, places and dates where MiniLM is weak); the composite score's similarity weight is small next to the
fusion score, so among the top hits an item the query's meaning fits best rarely moves past one that only
shares its words. This step adds, to each of the top ``RecallRecipe.rerank_depth`` rows, a weight times its
signal min-max normalized over those rows (the best 1, the worst 0), then orders them again. The signal:
- late interaction (``rerank_signal`` "late_interaction", the default): MaxSim
  between the query's MiniLM token states and the item's stored ones (``storage.embedding.states``: the
  mean over the query's words of each one's best match among the item's words), given by the caller as
  ``late``, when every row re-scored has states; when one lacks them (a chunk whose vector the extract
  stage handed over, a record stored before states were kept) all of them take the cosine step instead, so
  two signals are never mixed in one min-max.
  Its weight is ``rerank_late`` times the spread of the totals it re-scores (the best minus the last of
  the top rows), not a fixed amount: the totals' scale is the recipe's (a recipe without the keyword
  channel, weight 5, fuses totals a few times smaller) and the memory's, and a fixed weight several times
  that spread orders the top by MaxSim alone, overriding what the first look found by other means (a fact
  the graph reached from the one the query names, whose own words do not match the query: "what company
  does my brother work for?" -> "Alex was hired by Amazon"). In the spread's units, ``rerank_late`` 1 lets
  the best MaxSim carry the last row level with the first at worst, whatever the recipe;
- the query similarity (``rerank_similarity``): the cosine, with "similarity", or when
  ``late`` is empty or misses a top row (no query states, a top row without states: an encoder or a memory
  without them behaves as before).
Offline on the dev conversations, late interaction in place of the cosine gave R@10 / MRR 0.844 / 0.611
against 0.820 / 0.571 (docs/benchmarks/history.md, "Late interaction from the packaged MiniLM ...").

Invariants:
- it belongs to the vector channels: a recipe without ``episode_vector`` and ``fact_vector`` skips it
  (it reads the similarity a vector channel's encoder gives), as does a weight or depth of 0;
- it only adds to a row's total and never to a row below the depth, and each row's addition is at most
  the weight (late interaction's: ``rerank_late`` times the rows' spread); the rows below the depth had totals at or under every row above it, so the whole list stays
  best first by total (ties by id), the order docs/api.md states, and an item's ``score`` is the total it
  is ordered by;
- a pure function of the rows and ``late``: the same rows and states give the same order on a held
  snapshot and on the store, and the depth does not depend on the recall's k, so a recall of 10 is the
  first 10 of a recall of 40; with late interaction the order does not change when every total is
  scaled by one positive factor (it is in the totals' own units).
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
    # Late interaction only when every row re-scored has states: MaxSim and the cosine are never mixed in one
    # min-max (a cosine runs higher than a MaxSim of signs, so the rows without states would be lifted).
    if late and recipe.late_interaction and all(node_id in late for _, node_id, _, _ in top):
        # In the totals' own units: the best minus the last of the rows re-scored (best first).
        weight = recipe.rerank_late * (top[0][0] - top[-1][0])
        signal = [late[node_id] for _, node_id, _, _ in top]
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
