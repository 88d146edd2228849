"""Forgetting, decided once above the backends: ``ForgetScope`` (what a backend reads) becomes a
``ForgetPlan`` (what it deletes and repairs), the deletion's counterpart of ``WritePlan``; ``Removed``
(what a delete removed) is the one account of any forget, the vector count included.

Invariants:
- a plan is computed from reads taken after the user's stamp was read, and applied only while the
  stamp is unchanged (``GraphStore`` applies it under a fence), so a write that committed between the
  reads and the delete makes the store plan again instead of deleting from a stale picture;
- applying a plan is idempotent: every delete and repair names its ids, so a second run finds nothing;
- an older fact whose successor is deleted points at the next surviving successor; with none left it
  becomes current again (the deleted value never was);
- only a candidate entity that nothing mentions and no episode keeps after the delete is removed, and
  that is decided inside the applying transaction (the plan names candidates, not orphans);
- a forget's ``vectors`` counts the embeddings the store deleted with the records (removed facts and
  entities that carried one, and every chunk): the store removed them, so the store's account is final.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from engram_api.models import ForgetResult
from engram_api.naming import normalize_name

__all__ = ["ChainRepair", "EntityRevert", "ForgetPlan", "ForgetScope", "Removed", "plan_forget", "revert_edit"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ForgetScope(_Frozen):
    """A backend's reads for one forget, all of one user, taken in one snapshot."""

    doomed_fact_ids: list[str] = Field(description="facts whose last source goes (or the fact forgotten)")
    entity_candidates: list[str] = Field(description="entities the episode or a doomed fact mentions")
    chunk_ids: list[str] = Field(default_factory=list, description="the forgotten episode's chunks")
    vectored: list[str] = Field(default_factory=list, description="doomed facts and candidates with an embedding")
    successor_of: dict[str, str] = Field(default_factory=dict, description="doomed fact -> its superseded_by")
    older: list[tuple[str, str]] = Field(
        default_factory=list, description="(fact, superseded_by) of facts superseded by a doomed one"
    )


class ChainRepair(_Frozen):
    """``fact_id`` now points at ``successor``; ``None`` makes it current again."""

    fact_id: str
    successor: str | None


class ForgetPlan(_Frozen):
    """Everything one forget deletes and repairs, applied by a backend in ONE transaction."""

    user_id: str
    episode_id: str | None = Field(default=None, description="the message forgotten, with its chunks")
    fact_ids: list[str] = Field(default_factory=list, description="facts deleted, sorted")
    repairs: list[ChainRepair] = Field(default_factory=list)
    entity_candidates: list[str] = Field(default_factory=list, description="deleted if left orphaned, sorted")
    chunk_ids: list[str] = Field(default_factory=list, description="the episode's chunks, sorted")
    vectored: frozenset[str] = frozenset()

    def result(self, removed_entity_ids: list[str]) -> ForgetResult:
        """The caller's account of this plan once applied, given the orphans the backend removed."""
        return Removed(
            user_id=self.user_id,
            episodes=int(self.episode_id is not None),
            fact_ids=self.fact_ids,
            entity_ids=removed_entity_ids,
            chunk_ids=self.chunk_ids,
            vectored=self.vectored,
        ).result()


class Removed(_Frozen):
    """What one delete transaction removed, as ids (a backend's answer to ``forget_user``)."""

    user_id: str
    episodes: int = 0
    fact_ids: list[str] = Field(default_factory=list)
    entity_ids: list[str] = Field(default_factory=list)
    chunk_ids: list[str] = Field(default_factory=list)
    vectored: frozenset[str] = Field(frozenset(), description="removed facts and entities that had an embedding")

    def result(self) -> ForgetResult:
        return ForgetResult(
            user_id=self.user_id,
            episodes=self.episodes,
            facts=len(self.fact_ids),
            entities=len(self.entity_ids),
            vectors=sum(node_id in self.vectored for node_id in [*self.fact_ids, *self.entity_ids])
            + len(self.chunk_ids),
            removed_fact_ids=sorted(self.fact_ids),
            removed_entity_ids=sorted(self.entity_ids),
            removed_chunk_ids=sorted(self.chunk_ids),
        )


def _surviving_successor(successor: str | None, successor_of: dict[str, str], gone: set[str]) -> str | None:
    """Follow ``superseded_by`` through facts being deleted to the first one that stays, if any."""
    seen: set[str] = set()
    while successor in gone and successor not in seen:
        seen.add(successor)
        successor = successor_of.get(successor)
    return None if successor in gone else successor


def plan_forget(user_id: str, scope: ForgetScope, *, episode_id: str | None = None) -> ForgetPlan:
    gone = set(scope.doomed_fact_ids)
    repairs = [
        ChainRepair(fact_id=older, successor=_surviving_successor(successor, scope.successor_of, gone))
        for older, successor in sorted(scope.older)
        if older not in gone
    ]
    return ForgetPlan(
        user_id=user_id,
        episode_id=episode_id,
        fact_ids=sorted(gone),
        repairs=repairs,
        entity_candidates=sorted(set(scope.entity_candidates)),
        chunk_ids=sorted(scope.chunk_ids),
        vectored=frozenset(scope.vectored),
    )


class EntityRevert(_Frozen):
    """One entity once a forgotten message's edit of it is undone (the stores' ``*_edits`` modules)."""

    entity_id: str
    aliases: list[str] = Field(description="the entity's aliases without the ones the message added")
    summary: str = Field(description="its summary: the one the message replaced, if the message's was current")
    drop_norms: list[str] = Field(description="normalized aliases no remaining alias has: their index entries go")
    summary_set: str | None = Field(description="the summary the message set (None: it set none)")
    replaced: str = Field(
        description="the summary the message replaced: later edits that recorded the message's as the one they"
        " replaced record this one instead"
    )


def revert_edit(
    entity_id: str, *, added: list[str], summary_set: str | None, replaced: str | None, aliases: list[str], summary: str
) -> EntityRevert:
    """Undo one message's edit (``added`` aliases, ``summary_set`` replacing ``replaced``) of an entity that
    now has ``aliases`` and ``summary``: the aliases it added go, and its summary, if still current, gives
    way to the one it replaced. An alias said again by a later message (which added nothing then) goes too."""
    gone = set(added)
    kept = [a for a in aliases if a not in gone]
    kept_norms = {normalize_name(a) for a in kept}
    current = summary_set is not None and summary == summary_set
    return EntityRevert(
        entity_id=entity_id,
        aliases=kept,
        summary=(replaced or "") if current else summary,
        drop_norms=sorted({normalize_name(a) for a in gone} - kept_norms - {""}),
        summary_set=summary_set,
        replaced=replaced or "",
    )
