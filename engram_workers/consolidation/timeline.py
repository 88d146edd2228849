"""A one-value slot's timeline, and where a late message's history ends: consolidation's rules of event time.

A slot (one subject, one single-valued predicate) is a chain: its facts ordered by ``valid_from``, each one's
``valid_until`` the next one's start, so the result does not depend on the order messages arrive in (a late
message with an older event time lands in the past, already superseded). Off the one-value list, which new
value replaces which is the model's call (``ends``, ``valid_until``); what is decided here is only when a late
message's stated end falls (``late_ends``): docs/extraction.md, "Bursts and late messages".

Invariants: pure functions over records already read (no I/O); a chain is rebuilt whole from the slot's facts,
so re-planning a message gives the same changes.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from engram_api.models import FactChange, FactRecord
from engram_api.naming import normalize_name

__all__ = ["late_ends", "supersede_single"]


def _chain(slot_facts: list[FactRecord], ended: dict[str, datetime]) -> dict[str, tuple[object, str | None]]:
    """Desired (valid_until, superseded_by) for each fact of one single-valued slot. A fact that was ended
    outright (``ends``, now or by an earlier message) keeps its end unless a successor starts sooner."""
    ordered = sorted(slot_facts, key=lambda f: (f.valid_from, f.created_at, f.id))
    out: dict[str, tuple[object, str | None]] = {}
    for cur, nxt in zip(ordered, [*ordered[1:], None], strict=True):
        end = ended.get(cur.id) or (cur.valid_until if cur.superseded_by is None else None)
        if nxt is not None and (end is None or nxt.valid_from <= end):
            out[cur.id] = (nxt.valid_from, nxt.id)
        else:
            out[cur.id] = (end, None)
    return out


def late_ends(
    drafts: list[FactRecord],
    closes: dict[str, tuple[str, str, str | None, datetime]],
    slotted: list[FactRecord],
    at: datetime,
) -> None:
    """A late message's history draft ends where the fact that replaced it starts. The prompt shows a known
    fact's start as a day ("since 2026-03-10") and asks a message older than it for that date as
    ``valid_until``; an end after the message that falls on the day a stored fact of the same subject and
    predicate (another object) started after the message is that fact's start, to the second, so the result
    equals having seen the messages in event-time order (the newer one's ``ends`` closes at its event time).
    ``closes``: by draft id, what each draft ends and when (``plan.Drafts.closes``), moved with it."""
    for draft in drafts:
        end = draft.valid_until
        if end is None or end <= at:
            continue
        starts = [
            f.valid_from
            for f in slotted
            if (f.subject_id, f.predicate) == (draft.subject_id, draft.predicate)
            and f.object_id != draft.object_id
            and at < f.valid_from
            and end <= f.valid_from < end + timedelta(days=1)
        ]
        if starts:
            draft.valid_until = min(starts)
            if draft.id in closes:  # what the draft ends, it ends then too
                subject, predicate, obj, _ = closes[draft.id]
                closes[draft.id] = (subject, predicate, obj, draft.valid_until)


def supersede_single(
    drafts: list[FactRecord],
    slotted: list[FactRecord],
    ended: dict[str, datetime],
    new_facts: list[FactRecord],
    reinforced: list[str],
    changes: list[FactChange],
) -> None:
    """Single-valued facts: rebuild each (subject, predicate) slot's chain in event-time order (``slotted``:
    the stored facts of the drafts' slots)."""
    slots = sorted({(f.subject_id, f.predicate) for f in drafts})
    existing = [f for f in slotted if not f.archived and f.single_valued]  # undated history is no member
    for slot in slots:
        slot_existing = [f for f in existing if (f.subject_id, f.predicate) == slot]
        slot_new: list[FactRecord] = []
        for draft in (f for f in drafts if (f.subject_id, f.predicate) == slot):
            timeline = sorted([*slot_existing, *slot_new], key=lambda f: (f.valid_from, f.created_at, f.id))
            before = [f for f in timeline if f.valid_from <= draft.valid_from]
            prev = before[-1] if before else None
            if (
                prev is not None
                and prev.object_id == draft.object_id
                and (draft.object_id is not None or normalize_name(prev.statement) == normalize_name(draft.statement))
            ):
                # Restated value: the same interval goes on; no new fact.
                if prev in slot_existing:
                    reinforced.append(prev.id)
                continue
            slot_new.append(draft)
        wanted = _chain([*slot_existing, *slot_new], ended)
        for fact in slot_existing:
            until, by = wanted[fact.id]
            if (fact.valid_until, fact.superseded_by) != (until, by):
                changes.append(FactChange(id=fact.id, valid_until=until, superseded_by=by))  # type: ignore[arg-type]
        for draft in slot_new:
            draft.valid_until, draft.superseded_by = wanted[draft.id]  # type: ignore[assignment]
            new_facts.append(draft)
