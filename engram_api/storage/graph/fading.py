"""How a fact's strength fades with time: the one closed form, read at recall and stored only at archival.

A fact stores ``strength`` as measured at its *reference instant* (``last_decay_at``, else ``created_at``:
the last time anything set the strength). Its **effective strength** at an instant ``at`` is

    strength * per_day ** (days from the reference instant to ``at``)        (never above ``strength``)

which is exactly what the daily decay job used to store: that job multiplied the same factor in and
moved the reference instant to its run, so the value read at ``at`` is the value the old job would have
stored had it run at ``at`` (up to float rounding; the old values were step-wise, one step a day).

A fact is **faded** at ``at`` when its effective strength is below ``threshold``: the decay job archives
it then (the old job's test, ``<``, unchanged). Because the strength only falls, the instant it crosses is
known when the strength is written: ``archive_due_at`` (``due``), stored beside it and indexed, so the job
reads only the facts due, never every fact, and writes only those it archives.

Invariants:
- every write that sets a strength (a new fact, reinforcement by a restated fact or by feedback, archival)
  sets its reference instant and ``archive_due_at`` in the same transaction; an archived fact has none;
- ``due`` is never after the real crossing (it is computed a millisecond early), so a fact the old job
  would have archived at a run is always among the facts due at that run; the job then asks ``faded``,
  the old job's own test, so the facts archived are the old job's;
- a strength write computes from the effective strength at the write's instant, never the stored one;
- the store records the policy its dues were computed with; the decay job, finding another one in its
  settings, recomputes every unarchived fact's due before it reads any (``GraphStore.refresh_dues``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

__all__ = ["Fading"]

_DAY_US = 86_400_000_000
# How much earlier than the computed crossing a fact is due: covers the float error of the logarithms
# (~1e-9 s at a century), so ``due`` is never after the instant ``faded`` turns true.
_EARLY = timedelta(milliseconds=1)
# Crossings past this are "never" (a datetime cannot hold them, and no run will see them).
_NEVER = datetime(9000, 1, 1, tzinfo=UTC)
_TICK = timedelta(microseconds=1)  # the stores' resolution
_DAY = timedelta(days=1)  # made once: a new timedelta was most of ``strength_at``, read per recall candidate


@dataclass(frozen=True)
class Fading:
    """The decay policy: ``per_day`` (strength factor per elapsed day) and ``threshold`` (archived below)."""

    per_day: float = 0.98
    threshold: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.per_day <= 1:
            raise ValueError(f"per_day must be in (0, 1] (got {self.per_day})")
        if not 0 <= self.threshold < 1:
            raise ValueError(f"threshold must be in [0, 1) (got {self.threshold})")

    @staticmethod
    @lru_cache(maxsize=8)
    def of(per_day: float, threshold: float) -> Fading:
        """The policy of these settings' values (``Settings.decay_per_day``, ``archive_threshold``)."""
        return Fading(per_day=per_day, threshold=threshold)

    def strength_at(self, strength: float, since: datetime, at: datetime) -> float:
        """The effective strength at ``at`` of ``strength`` measured at ``since`` (no rise before ``since``)."""
        days = (at - since) / _DAY
        return strength * self.per_day**days if days > 0 else strength

    def faded(self, strength: float, since: datetime, at: datetime) -> bool:
        """Below the threshold at ``at``: what the decay job archives (the old job's test)."""
        return self.strength_at(strength, since, at) < self.threshold

    def due(self, strength: float, since: datetime) -> datetime | None:
        """``archive_due_at``: a millisecond before the effective strength crosses the threshold; ``since``
        when it is below already; None when it never will (no decay, a zero threshold)."""
        if strength < self.threshold:
            return since
        if self.per_day == 1 or self.threshold == 0:
            return None
        # strength * per_day ** d = threshold  <=>  d = ln(threshold / strength) / ln(per_day)
        days = math.log(self.threshold / strength) / math.log(self.per_day)
        if days * _DAY_US > (_NEVER - since) / timedelta(microseconds=1):
            return None
        return since + timedelta(microseconds=math.floor(days * _DAY_US)) - _EARLY

    def archival(self, strength: float, since: datetime, at: datetime) -> tuple[float | None, datetime | None]:
        """The decay job's decision on a fact due at ``at``: (its strength at ``at``, None) when it is faded
        (archive it, with no due), else (None, its due again, always after ``at``, or None for never)."""
        if self.faded(strength, since, at):
            return self.strength_at(strength, since, at), None
        due = self.due(strength, since)
        return None, None if due is None else max(due, at + _TICK)

    def reinforcement(
        self, strength: float, since: datetime, archived: bool, at: datetime, amount: float
    ) -> float | None:
        """The strength feedback's reinforcement stores at ``at``: the effective one (an archived fact's
        stored one: archival stops its fading) plus ``amount``, at most 1, measured at ``at``; None when
        that changes nothing (an unarchived fact at 1 already)."""
        now = strength if archived else self.strength_at(strength, since, at)
        after = min(1.0, now + amount)
        return after if archived or after != now else None
