"""Cells: two independent stacks (two real Redis servers, two SQLite stores in their own data directories),
users routed by ``cell_of``: a message lands only in its user's cell, recall reads that cell's store,
erasure touches only that cell, and a gateway configured as one cell answers 421 for another cell's user.
Memory is built in-process through the apply stage's own write (``tests.support.memory``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import count
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engram_api import keys
from engram_api.cells import CellClient, CellMap, cell_of
from engram_api.errors import ConfigError, InvalidInputError, WaitTimeoutError
from engram_api.settings import Settings, load_settings
from engram_gateway.app import create_app
from engram_gateway.auth import mint_key
from engram_gateway.service import Gateway
from engram_workers.services import RedisServer
from tests.support.memory import apply_in_process

T0 = datetime(2024, 7, 1, 9, 0, tzinfo=UTC)


def user_in(cell: int, prefix: str = "shop.u", cells: int = 2) -> str:
    """The first user id ``<prefix><n>`` that ``cell_of`` puts in ``cell``."""
    return next(uid for n in count() if cell_of(uid := f"{prefix}{n}", cells) == cell)


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Settings]]:
    servers = [RedisServer(data_dir=tmp_path_factory.mktemp(f"redis{i}"), appendonly=False) for i in range(2)]
    for server in servers:
        server.start()
    try:
        yield [
            Settings(redis_url=s.url, data_dir=tmp_path_factory.mktemp(f"cell{i}"), neo4j_uri=None, llm_model=None)
            for i, s in enumerate(servers)
        ]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def router(cells: list[Settings]) -> Iterator[CellClient]:
    with CellClient(cells) as client:
        for i in range(2):
            client.cell(i).redis.flushdb()
        yield client


def test_a_users_cell_is_the_same_in_every_process() -> None:
    users = [f"shop.user{i}" for i in range(200)]
    here = [cell_of(u, 3) for u in users]
    # Another interpreter, with another hash seed: hash() would differ, the cell must not.
    code = "import json,sys; from engram_api.cells import cell_of; print(json.dumps([cell_of(u, 3) for u in json.load(sys.stdin)]))"
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(users), capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )  # fmt: skip
    assert json.loads(out.stdout) == here
    assert here == [int(hashlib.sha256(u.encode()).hexdigest(), 16) % 3 for u in users]
    assert set(here) == {0, 1, 2}  # every cell gets users
    with pytest.raises(InvalidInputError) as bad:
        cell_of("bad id!", 3)
    assert bad.value.field == "user_id"


def test_a_message_lands_only_in_its_users_cell(router: CellClient) -> None:
    alice, bob = user_in(0), user_in(1)
    a = router.enqueue(alice, "I live in Austin", message_id="m-a")
    b = router.enqueue(bob, "I live in Boston", message_id="m-b")
    zero, one = router.cell(0).producer.ledger, router.cell(1).producer.ledger
    assert zero.status(alice, a.message_id) and not one.status(alice, a.message_id)
    assert one.status(bob, b.message_id) and not zero.status(bob, b.message_id)
    assert [router.cell(i).redis.llen(keys.EXTRACT_QUEUE) for i in range(2)] == [1, 1]


def test_a_batch_spanning_cells_is_refused_before_anything_is_queued(router: CellClient) -> None:
    alice, bob = user_in(0), user_in(1)
    items = [{"user_id": alice, "messages": "hi there, I like tea"}, {"user_id": bob, "messages": "I like coffee"}]
    with pytest.raises(InvalidInputError) as refused:
        router.enqueue_many(items)
    assert refused.value.field == "items[1].user_id"
    assert [router.cell(i).redis.llen(keys.EXTRACT_QUEUE) for i in range(2)] == [0, 0]
    receipts = router.enqueue_many([items[0], {"user_id": user_in(0, "shop.v"), "messages": "I like tea"}])
    assert len(receipts) == 2 and router.cell(0).redis.llen(keys.EXTRACT_QUEUE) == 2
    assert router.cell(1).redis.llen(keys.EXTRACT_QUEUE) == 0
    with pytest.raises(WaitTimeoutError) as late:  # no workers: both cells were waited on, nothing applied
        router.wait([*receipts, router.enqueue(bob, "I like coffee")], timeout=0.5)
    assert "cell 0: 2 of 2" in str(late.value) and "cell 1: 1 of 1" in str(late.value)


def test_recall_and_forget_user_reach_only_the_users_cell(router: CellClient) -> None:
    carol, dave = user_in(0, "shop.carol"), user_in(1, "shop.dave")
    apply_in_process(router.client_for(carol), carol, "c1", "I live in Austin", T0)
    apply_in_process(router.client_for(dave), dave, "d1", "I live in Denver", T0)
    hits = router.recall(carol, "where does the user live?").items
    assert any("Austin" in item.statement for item in hits)
    assert not router.cell(1).recall(carol, "where does the user live?").items  # not in the other store
    assert router.stats(dave).facts >= 1 and router.cell(0).stats(dave).facts == 0

    erased = router.forget_user(carol)
    assert erased.facts >= 1
    assert router.stats(carol).facts == 0
    assert any("Denver" in item.statement for item in router.recall(dave, "where does the user live?").items)


def test_a_cell_map_that_shares_a_server_or_a_directory_is_refused(cells: list[Settings], tmp_path: Path) -> None:
    a, b = cells
    cases = {
        "cells[1].REDIS_URL": [a, b.model_copy(update={"redis_url": a.redis_url})],
        "cells[1].ENGRAM_DATA_DIR": [a, b.model_copy(update={"data_dir": a.data_dir})],
        "cells[0].REDIS_URL": [a.model_copy(update={"redis_url": None}), b],
        "cells[0].ENGRAM_CELL_INDEX": [a.model_copy(update={"cell_count": 2, "cell_index": 1}), b],
    }
    for field, given in cases.items():
        with pytest.raises(ConfigError) as refused:
            CellMap(cells=tuple(given))
        assert refused.value.variable == field
    with pytest.raises(ConfigError) as refused:
        load_settings(cell_index=2, cell_count=2)
    assert refused.value.variable == "ENGRAM_CELL_INDEX"
    with pytest.raises(ConfigError) as refused:
        load_settings(cell_index=0)
    assert refused.value.variable == "ENGRAM_CELL_INDEX"


def test_a_gateway_of_one_cell_answers_421_for_another_cells_user(router: CellClient, cells: list[Settings]) -> None:
    key, spec = mint_key("shop", ["read", "write"], "shop")
    settings = cells[0].model_copy(update={"cell_count": 2, "cell_index": 0, "api_keys": [spec]})
    mine, theirs = user_in(0, "shop.erin"), user_in(1, "shop.frank")
    queue = router.cell(0).redis
    with TestClient(create_app(Gateway(settings))) as http:
        http.headers["Authorization"] = f"Bearer {key}"
        wrong = http.post("/v1/messages", json={"user_id": theirs, "messages": "I live in Paris"})
        assert wrong.status_code == 421 and wrong.headers["Engram-Cell"] == "1"
        assert wrong.json()["type"] == "urn:engram:problem:wrong-cell" and wrong.json()["field"] == "user_id"
        assert "cell 1" in wrong.json()["detail"]
        batch = [{"user_id": mine, "messages": "I like tea"}, {"user_id": theirs, "messages": "I like tea"}]
        refused = http.post("/v1/messages/batch", json={"items": batch})
        assert refused.status_code == 421 and refused.json()["field"] == "items[1].user_id"
        assert http.post(f"/v1/users/{theirs}/recall", json={"query": "where"}).status_code == 421
        assert http.delete(f"/v1/users/{theirs}").status_code == 421
        assert queue.llen(keys.EXTRACT_QUEUE) == 0  # nothing of the refused requests was queued

        assert http.post("/v1/messages", json={"user_id": mine, "messages": "I live in Paris"}).status_code == 202
        assert http.post(f"/v1/users/{mine}/recall", json={"query": "where"}).status_code == 200

        # The API description says so: every operation taking a user id lists the 421 and its header.
        paths = http.get("/openapi.json").json()["paths"]
        listed = {(m, p) for p, ops in paths.items() for m, op in ops.items() if "421" in op["responses"]}
        assert {("post", "/v1/messages"), ("post", "/v1/messages/batch"), ("delete", "/v1/users/{user_id}")} <= listed
        assert not {p for _, p in listed} & {"/v1/health", "/v1/whoami", "/v1/users", "/v1/metrics"}
        recall = paths["/v1/users/{user_id}/recall"]["post"]["responses"]["421"]
        assert "Engram-Cell" in recall["headers"] and "wrong-cell" in recall["description"]
    assert queue.llen(keys.EXTRACT_QUEUE) == 1
    assert router.cell(1).redis.llen(keys.EXTRACT_QUEUE) == 0
