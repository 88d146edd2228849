"""Linked items: what the top candidates of a recall bring with them (``add_links``).

Invariants:
- a linked item (a fact's source message's chunks, an excerpt's extracted facts, the other speaker's
  turns next to an excerpt within a day: the exchange it is part of) obeys the recall's time window and
  adds ``link_share`` of its parent's fusion score, never more than the parent has;
- a fact ranks at least with the best excerpt of the message it was extracted from: it says what that
  message says, in fewer words and as it holds now;
- at most three record reads (the source messages' chunks, the extracted facts, the neighbouring turns),
  none for a user whose snapshot the reader holds.
"""

from __future__ import annotations

from engram_api.models import Channel as ChannelName
from engram_api.reader.state import RecallRun

__all__ = ["add_links"]


def add_links(run: RecallRun) -> None:
    """Each of the top ``links_from`` candidates brings its linked items with ``link_share`` of its fusion
    score: a fact its source message's chunks, an excerpt the facts extracted from it and the other
    speaker's turns around it; then every fact ranks at least with its source message's best excerpt."""
    recipe = run.recipe
    if recipe.links_from == 0 or recipe.link_share == 0:
        return
    top = sorted(run.cands.items(), key=lambda kv: -kv[1].fusion)[: recipe.links_from]
    sources = {fid: c.fact.source_ids for fid, c in top if c.fact is not None}
    extracted = {cid: c.chunk.fact_ids for cid, c in top if c.chunk is not None}
    with run.timed("records"):
        episode_chunks = run.user_chunks.of_episodes(sorted({e for ids in sources.values() for e in ids}))
    run.chunks.update((c.id, c) for c in episode_chunks)
    run.load_facts(f for ids in extracted.values() for f in ids)
    neighbours: dict[str, list[str]] = {}
    if recipe.window > 0 and extracted:
        anchors = list(extracted)
        with run.timed("records"):
            near = run.user_chunks.neighbours(anchors, recipe.window)
        run.chunks.update((c.id, c) for c in near)
        for cid in anchors:
            anchor = run.chunks[cid]
            # A turn's context is the exchange it is part of: the turn it replies to and the reply
            # ("Where did you move?" / "Austin."), not the same speaker's next statement.
            neighbours[cid] = [
                c.id
                for c in near
                if c.speaker != anchor.speaker and abs((c.event_time - anchor.event_time).total_seconds()) < 86400
            ]
    by_episode: dict[str, list[str]] = {}
    for c in episode_chunks:
        by_episode.setdefault(c.episode_id, []).append(c.id)
    for node_id, parent in top:
        share = recipe.link_share * parent.fusion
        linked: list[tuple[ChannelName, str]] = []
        if parent.fact is not None:
            linked += [("source", cid) for e in sources[node_id] for cid in by_episode.get(e, [])]
        else:
            linked += [("extracted", fid) for fid in extracted[node_id]]
            linked += [("window", cid) for cid in neighbours.get(node_id, [])]
        for channel, other in linked:
            if other == node_id or not run.ok(other):
                continue
            run.candidate(other).add(channel, share)
    # A fact says what the message it was extracted from says, in fewer words and as it holds now: it
    # ranks at least with that message's best excerpt.
    best: dict[str, float] = {}
    for c in run.cands.values():
        if c.chunk is not None:
            best[c.chunk.episode_id] = max(best.get(c.chunk.episode_id, 0.0), c.fusion)
    for c in run.cands.values():
        if c.fact is not None:
            c.fusion = max([c.fusion, *(best.get(e, 0.0) for e in c.fact.source_ids)])
