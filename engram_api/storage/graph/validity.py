"""When a fact holds: the one definition of "valid at" and "current", in Python, Cypher and SQL.

A fact is **valid at** an instant ``at`` when it is not archived and ``valid_from <= at`` and
(``valid_until`` is unset or ``at < valid_until``): its validity is the half-open interval
[valid_from, valid_until). A fact is **current** when it is valid at now: "current" is "valid at" with
the asker's clock (``GraphStepQuery.now``, else the call's own), never a separate rule. So a fact stated
today about a later start ("from next month") is not yet valid today, and a fact closed at a later
instant (a successor dated ahead within the extractor's skew) still holds until then; asking with
``as_of=now`` and asking for the current state give the same answer.

A fact **overlaps** a recall window [since, until) (either side open when None) when
``valid_from < until`` and (``valid_until`` is unset or ``valid_until > since``). Recall's seed facts are
valid at the window's instant and overlap it (``GraphStore.graph_step``, ``fusion.TimeWindow``).

What this is not: whether a fact is *open* (``valid_until`` unset: never superseded nor ended) is a
record's state, not a question about an instant; supersession and ``UserStats.superseded_facts`` ask it.
Negated facts (``NOT_`` predicates) are ordinary facts here: their validity is their own interval.

Invariants:
- ``valid_at``, ``VALID_AT_SQL`` and ``valid_at_cypher`` select the same facts at every instant, and so
  do ``overlaps`` and its fragments (tests/contract/test_validity.py runs all three over one set of facts
  in a real SQLite and a real Neo4j store);
- every site that asks whether a fact holds uses these (the stores' walk, seeds, keyword search and
  stats, the snapshot, ``FactRecord.current_at``, the reader's window): none writes the rule again;
- the fragments only reference the fact variable they are given and the named parameters (an instant
  as the column's type: epoch microseconds in SQLite, a datetime in Neo4j), never text from a caller.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = [
    "OVERLAPS_SQL",
    "VALID_AT_SQL",
    "instant",
    "overlaps",
    "overlaps_cypher",
    "valid_at",
    "valid_at_cypher",
]


def instant(as_of: datetime | None, now: datetime | None = None) -> datetime:
    """The instant a question about validity is asked at: ``as_of``, else now (``now``, else the clock's):
    the current state is the state at now."""
    if as_of is not None:
        return as_of
    return now if now is not None else datetime.now(UTC)


def valid_at(valid_from: datetime, valid_until: datetime | None, archived: bool, at: datetime) -> bool:
    """The fact holds at ``at`` (see the module docstring); "current" is ``at`` = now."""
    return not archived and valid_from <= at and (valid_until is None or at < valid_until)


def overlaps(
    valid_from: datetime, valid_until: datetime | None, since: datetime | None, until: datetime | None
) -> bool:
    """The fact's validity meets the window [since, until) (None: that side is open)."""
    return (until is None or valid_from < until) and (since is None or valid_until is None or valid_until > since)


# SQLite stores instants as INTEGER microseconds and ``archived`` as 0/1; ``f`` is the facts table's alias
# and :at an instant in microseconds (never NULL: the current state is asked at now).
VALID_AT_SQL = "(f.archived = 0 AND f.valid_from <= :at AND (f.valid_until IS NULL OR :at < f.valid_until))"
OVERLAPS_SQL = (
    "((:until IS NULL OR f.valid_from < :until)"
    " AND (:since IS NULL OR f.valid_until IS NULL OR f.valid_until > :since))"
)


def valid_at_cypher(v: str) -> str:
    """``valid_at`` for the fact node variable ``v`` at ``$at`` (a datetime, never null)."""
    return f"({v}.archived = false AND {v}.valid_from <= $at AND ({v}.valid_until IS NULL OR $at < {v}.valid_until))"


def overlaps_cypher(v: str) -> str:
    """``overlaps`` for the fact node variable ``v`` and the window ``$since``, ``$until`` (null: open)."""
    return (
        f"(($until IS NULL OR {v}.valid_from < $until)"
        f" AND ($since IS NULL OR {v}.valid_until IS NULL OR {v}.valid_until > $since))"
    )
