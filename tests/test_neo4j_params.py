"""What the Neo4j backend hands the driver as query parameters costs little CPU before it is sent.

The driver formats every RUN's query and parameters for its DEBUG log before the logger checks its level,
so an embedding goes in as ``neo4j_rows.Vector``: the list it is on the wire, a short repr in that log.
These tests pin the driver behaviour that relies on: both packstream codecs (Python, and the Rust one of
neo4j-rust-ext, a dependency) pack a ``Vector`` to the bytes of its list. A written node's times go in as [seconds,
nanoseconds] (``neo4j_rows.instant``), never through the driver's datetime conversion. The round trips
through a real server are the contract suite's (``test_vectors_return_every_fact_and_entity_embedding``,
``test_every_written_time_comes_back_to_the_microsecond_before_1970_too``).
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone

import pytest
from neo4j._codec.packstream import v1 as packstream

from engram_api.errors import InvalidInputError
from engram_api.models import ChunkRecord
from engram_api.storage.graph.neo4j import rows as shape
from tests.support.factories import T0, make_entity, make_fact

EMBEDDING = [0.125 * i - 24.0 for i in range(384)]


def _python_pack(value: object) -> bytes:
    out = io.BytesIO()
    packstream.Packer(out)._py_pack(value, packstream.Packer._inject_hooks(None))
    return out.getvalue()


def test_a_vector_packs_to_the_bytes_of_its_list_in_the_python_codec() -> None:
    params = {"rows": [{"embedding": shape.Vector(EMBEDDING)}]}
    assert _python_pack(params) == _python_pack({"rows": [{"embedding": list(EMBEDDING)}]})


def test_a_vector_packs_to_the_bytes_of_its_list_in_the_rust_codec() -> None:
    # neo4j-rust-ext is a dependency (pyproject.toml): the driver packs with it, so it must be there
    assert packstream._rust_pack is not None, "neo4j-rust-ext is not installed (pip install -e .)"
    hooks = packstream.Packer._inject_hooks(None)
    params = {"rows": [{"embedding": shape.Vector(EMBEDDING)}]}
    assert packstream._rust_pack(params, hooks) == packstream._rust_pack({"rows": [{"embedding": EMBEDDING}]}, hooks)
    assert packstream._rust_pack(params, hooks) == _python_pack(params)


def test_written_rows_show_their_embeddings_in_a_few_characters() -> None:
    entity = make_entity("u1", "Alice").model_copy(update={"embedding": EMBEDDING})
    fact = make_fact("u1", entity, "likes tea").model_copy(update={"embedding": EMBEDDING})
    chunk = ChunkRecord(
        id="c1", user_id="u1", episode_id="m1", seq=0, text="I like tea", speaker="Alice", event_time=T0,
        embedding=EMBEDDING,
    )  # fmt: skip
    rows = [
        shape.entity_props(entity, "u1"),
        shape.fact_props(fact, "u1", None),
        shape.chunk_props(chunk, "u1", "m1", "other_turn"),
    ]
    assert rows[2]["embedded_with"] == "other_turn"  # the policy its vector was made with
    for row in rows:
        assert row["embedding"] == EMBEDDING
        assert repr(row["embedding"]) == "<vector of 384>"
    assert len(repr(rows)) < 2_000  # the three embeddings alone would print as ~20K characters


def test_a_missing_embedding_stays_null() -> None:
    fact = make_fact("u1", make_entity("u1", "Alice"), "likes tea", embedding=False)
    assert shape.fact_props(fact, "u1", None)["embedding"] is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(1970, 1, 1, tzinfo=UTC), [0, 0]),
        (datetime(2024, 1, 1, 0, 0, 0, 5, tzinfo=UTC), [1_704_067_200, 5_000]),
        (datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), [-1, 999_999_000]),  # floored, never < 0 ns
        (datetime(1, 1, 1, tzinfo=UTC), [-62_135_596_800, 0]),
        (datetime(2024, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2))), [1_704_067_200, 0]),  # the instant
        (None, None),
    ],
)
def test_an_instant_is_exact_floored_seconds_and_nanoseconds(
    value: datetime | None, expected: list[int] | None
) -> None:
    assert shape.instant(value) == expected


def test_written_rows_carry_no_datetime_for_the_driver_to_convert() -> None:
    entity = make_entity("u1", "Alice")
    fact = make_fact("u1", entity, "likes tea").model_copy(update={"valid_until": T0 + timedelta(days=1)})
    chunk = ChunkRecord(
        id="c1", user_id="u1", episode_id="m1", seq=0, text="I like tea", speaker="Alice", event_time=T0
    )
    due = T0 + timedelta(days=30)
    for row in (
        shape.entity_props(entity, "u1"),
        shape.fact_props(fact, "u1", due),
        shape.chunk_props(chunk, "u1", "m1", None),
    ):
        assert not [k for k, v in row.items() if isinstance(v, datetime)]
    assert shape.fact_props(fact, "u1", due)["valid_until"] == shape.instant(T0 + timedelta(days=1))
    assert shape.fact_props(fact, "u1", due)["archive_due_at"] == shape.instant(due)


def test_a_naive_time_is_refused_by_name() -> None:
    with pytest.raises(InvalidInputError, match="timezone-aware"):
        shape.instant(datetime(2024, 1, 1))
