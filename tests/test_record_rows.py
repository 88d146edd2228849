"""A snapshot's records held as rows (``engram_api.storage.snapshot.rows``): views that read as the records
held (every field by name, the models' own methods), built back into the very records, their repeated
strings one object, far smaller than the models, immutable."""

from __future__ import annotations

import gc
import tracemalloc
from datetime import UTC, datetime, timedelta

from engram_api.models import ChunkRecord, FactRecord
from engram_api.storage.snapshot.rows import (
    CHUNK_ROWS,
    FACT_ROWS,
    SUBJECT,
    ChunkView,
    FactView,
    RecordRows,
    valid_at,
)

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _copy(text: str) -> str:
    """An equal string that is another object, as each row a store returns carries its own."""
    return (text + "!")[:-1]


def _fact(i: int, **fields: object) -> FactRecord:
    values: dict[str, object] = {
        "id": f"fact-{i}", "user_id": _copy("user-1"), "subject_id": _copy("ent-ana"), "subject_name": _copy("Ana"),
        "predicate": _copy("LIVES_IN"), "object_id": _copy("ent-paris"), "object_name": _copy("Paris"),
        "statement": f"Ana lives in Paris ({i})", "importance": 0.25 + i / 1e4, "valid_from": T0 + timedelta(days=i),
        "source_ids": [f"m{i}", f"m{i + 1}"], "created_at": T0, "updated_at": T0 + timedelta(seconds=i),
    }  # fmt: skip
    return FactRecord.model_validate({**values, **fields})


def test_a_held_record_reads_back_as_the_record_held_every_field_alike() -> None:
    facts = [
        _fact(1),
        _fact(2, object_id=None, object_name=None, archived=True, memory_type="episodic", single_valued=True),
        _fact(3, valid_until=T0 + timedelta(days=9), superseded_by="fact-4", last_decay_at=T0, embedding=[0.5, -1.0]),
        _fact(4, source_ids=[]),
    ]
    rows = RecordRows.of(FACT_ROWS, facts)
    assert list(rows) == [f.id for f in facts] and len(rows) == 4 and "fact-9" not in rows
    for fact in facts:
        back = FACT_ROWS.record(rows[fact.id])
        assert back == fact and back.model_dump() == fact.model_dump()
        assert isinstance(back.source_ids, list)  # held as a tuple, built as the field's list
        view = rows[fact.id]
        assert isinstance(view, FactView)
        for name, value in fact:
            assert getattr(view, name) == (tuple(value) if isinstance(value, list) else value), name
        for at in (None, T0, T0 + timedelta(days=3), T0 + timedelta(days=20)):
            assert view.current_at(at) == fact.current_at(at)
    chunk = ChunkRecord(
        id="c1", user_id="user-1", episode_id="m1", seq=2, text="I moved to Paris.", speaker="Ana",
        event_time=T0, fact_ids=["fact-1", "fact-2"],
    )  # fmt: skip
    held = RecordRows.of(CHUNK_ROWS, [chunk])
    view = held["c1"]
    assert CHUNK_ROWS.record(view) == chunk and isinstance(view, ChunkView)
    assert view.conversation_order == chunk.conversation_order and view.indexed_text == "Ana: I moved to Paris."
    assert view.fact_ids == ("fact-1", "fact-2") and view.text == chunk.text


def test_the_rows_answer_validity_as_the_record_does() -> None:
    facts = [
        _fact(1),
        _fact(2, archived=True),
        _fact(3, valid_until=T0 + timedelta(days=9)),
    ]
    rows = RecordRows.of(FACT_ROWS, facts).rows()
    for at in (None, T0, T0 + timedelta(days=2), T0 + timedelta(days=9), T0 + timedelta(days=30)):
        for fact in facts:
            assert valid_at(rows[fact.id], at) == (
                not fact.archived
                and (fact.valid_until is None if at is None else fact.valid_from <= at)
                and (at is None or fact.valid_until is None or at < fact.valid_until)
            ), (fact.id, at)


def test_strings_many_facts_repeat_are_held_once() -> None:
    rows = RecordRows.of(FACT_ROWS, [_fact(i) for i in range(5)]).rows()
    first, owner = rows["fact-0"], FACT_ROWS.at("user_id")
    for row in rows.values():
        assert row[SUBJECT] is first[SUBJECT] and row[owner] is first[owner]


def test_a_fact_held_as_a_row_takes_far_less_memory_than_its_model() -> None:
    """What lets a reader hold a 100K-fact user whole (``ENGRAM_SNAPSHOT_MAX_RECORDS``)."""
    n = 2_000
    tracemalloc.start()
    try:
        facts = [_fact(i) for i in range(n)]
        as_models = tracemalloc.get_traced_memory()[0]
        rows = RecordRows.of(FACT_ROWS, facts)
        del facts
        gc.collect()
        as_rows = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(rows) == n
    assert as_rows < as_models / 2, (as_rows / n, as_models / n)


def test_a_record_added_or_replaced_leaves_the_rows_it_came_from_as_they_were() -> None:
    rows = RecordRows.of(FACT_ROWS, [_fact(1), _fact(2)])
    moved = _fact(2, importance=0.9)
    grown = rows.with_records([moved, _fact(3)])
    assert list(grown) == ["fact-1", "fact-2", "fact-3"] and FACT_ROWS.record(grown["fact-2"]) == moved
    assert list(rows) == ["fact-1", "fact-2"] and FACT_ROWS.record(rows["fact-2"]) == _fact(2)
    assert grown["fact-2"].importance == 0.9 and rows["fact-2"].importance == _fact(2).importance
