"""Abuse limits and the operators' surface (issue 12: findings 8, 9, 12, 14 and part of 13).

Real Redis for the back-pressure check, real Neo4j for the maintenance guards; the rest reads the
configuration every process loads (settings, Celery config, docker-compose.yml).
"""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from engram_api import keys
from engram_api.errors import BackPressureError, ConfigError, InvalidInputError, StoreUnavailableError
from engram_api.models import Extraction, utcnow
from engram_api.naming import normalize_name
from engram_api.redaction import RedactingFilter, redact
from engram_api.settings import EXAMPLE_PASSWORDS, Settings, load_settings
from engram_api.storage import GraphStepQuery, open_graph_store
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.neo4j import connection as neo4j_connection
from engram_api.storage.graph.neo4j import cypher as cy
from engram_api.storage.writer.userwrite import UserWrites
from engram_workers.celery_config import celery_config
from engram_workers.maintenance import redeliver_stuck, run_decay
from tests.support.builders import DIM, UserGraph, new_user
from tests.support.stack import engram_stack

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ finding 8
def test_every_task_has_a_soft_and_a_hard_time_limit(redis_url, monkeypatch) -> None:
    """A task may run longer than the visibility timeout: its worker keeps it (``engram_workers.broker``'s
    keep-alive, ``tests/test_kill_bound.py``), so the limits are bounded by nothing but themselves."""
    monkeypatch.setenv("REDIS_URL", redis_url)  # the app reads its configuration when first used
    from engram_workers.app import app
    from engram_workers.tasks import extract  # noqa: F401  (registers every task on the app)

    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    config = celery_config(settings, "redis://127.0.0.1:1/0")
    names = sorted(n for n in app.tasks if n.startswith("engram."))
    assert set(keys.MAINTENANCE_TASKS) < set(names) and {keys.EXTRACT_TASK, keys.APPLY_TASK} < set(names)
    for name in names:
        limits = config["task_annotations"].get(name, {})
        soft = limits.get("soft_time_limit", config["task_soft_time_limit"])
        hard = limits.get("time_limit", config["task_time_limit"])
        assert 0 < soft < hard, name


# ------------------------------------------------------------------------------------------ finding 9
def test_a_full_backlog_refuses_more_messages_and_enqueues_nothing(redis_url, tmp_path) -> None:
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False, max_pending_per_user=3
    ) as stack:
        client, user = stack.client, new_user()
        for i in range(3):
            client.enqueue(user, f"I live in town {i}", message_id=f"m{i}")
        queued = client.redis.llen(keys.EXTRACT_QUEUE)

        with pytest.raises(BackPressureError) as err:
            client.enqueue(user, "one too many", message_id="m3")
        with pytest.raises(BackPressureError):
            client.enqueue_many([{"user_id": user, "messages": "batch", "message_id": "m4"}])

        assert err.value.field == "user_id" and err.value.pending == 3 and err.value.limit == 3
        assert client.redis.llen(keys.EXTRACT_QUEUE) == queued
        assert not client.redis.exists(keys.message_payload(user, "m3"), keys.status(user, "m3"))
        client.enqueue(new_user(), "another tenant is not affected")
        client.forget(user, "m0")  # a finished (here: forgotten) message frees its slot
        client.enqueue(user, "fits again", message_id="m5")


def test_model_output_has_bounded_refs_aliases_and_updates() -> None:
    huge = "x" * 10_000
    for bad in (
        {"entities": [{"ref": huge, "name": "Alex"}]},
        {"entities": [{"ref": "e1", "name": "Alex", "aliases": [huge]}]},
        {"facts": [{"subject": huge, "predicate": "LIKES", "statement": "s"}]},
        {"facts": [{"subject": "user", "object": huge, "predicate": "LIKES", "statement": "s"}]},
        {"facts": [{"subject": "user", "predicate": "LIKES", "statement": "s", "updates": huge}]},
    ):
        with pytest.raises(ValidationError):
            Extraction.model_validate(bad)
    with pytest.raises(ValidationError, match="llm_max_output_tokens"):  # the completion bound is bounded too
        Settings(llm_max_output_tokens=1_000_000)


# ----------------------------------------------------------------------------------------- finding 12
def test_flower_and_every_other_port_is_published_on_loopback_only() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    published = {name: svc.get("ports", []) for name, svc in compose["services"].items()}
    assert published["flower"], "Flower is still reachable from the host (through the tunnel)"
    for name, ports in published.items():
        for port in ports:
            by_default = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(port))  # ${VAR:-default} -> default
            assert by_default.startswith("127.0.0.1:"), f"{name} publishes {port} beyond the host"


def test_the_example_passwords_are_refused_at_start_up() -> None:
    example = dict(
        line.split("=", 1)
        for line in (REPO / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    for variable in ("NEO4J_PASSWORD", "ENGRAM_FLOWER_PASSWORD"):
        assert example[variable].casefold() in EXAMPLE_PASSWORDS
        with pytest.raises(ConfigError) as err:
            load_settings(**{variable.lower().removeprefix("engram_"): example[variable]})
        assert err.value.variable == variable
    assert load_settings(neo4j_password="a-real-one-42").neo4j_password == "a-real-one-42"


def test_maintenance_refuses_a_future_now_and_out_of_range_arguments(neo4j_uri, tmp_path) -> None:
    settings = Settings(neo4j_uri=neo4j_uri, data_dir=tmp_path)
    graph = open_graph_store(settings)
    graph.ensure_schema()
    user = new_user()
    try:
        UserGraph(graph, user).say([("Alex", "WORKS_AT", "Dell", "Alex works at Dell")])
        writes = UserWrites(
            graph=graph, keeper=IndexKeeper(graph=graph, vectors=VectorStore(root=settings.index_dir, dim=DIM)),
            redis_client=None, lease_ttl_s=30,
        )  # fmt: skip
        before = graph.stats(user)

        def decay(**overrides: object) -> object:
            args = {"now": utcnow(), "user_ids": [user], **overrides}
            return run_decay(graph=graph, settings=settings, guard=lambda u: writes.open(u, wait=30.0), **args)

        for field, overrides in (
            ("now", {"now": utcnow() + timedelta(days=365 * 900)}),
            ("user_ids", {"user_ids": user}),  # a string, not a list: would visit one user per character
            ("user_ids", {"user_ids": ["bad id"]}),
        ):
            with pytest.raises(InvalidInputError) as err:
                decay(**overrides)
            assert err.value.field == field
        for older_than_s in (-1, 10**9):
            with pytest.raises(InvalidInputError) as err:
                redeliver_stuck(client=None, send=lambda *a: None, older_than_s=older_than_s)  # type: ignore[arg-type]
            assert err.value.field == "older_than_s"
        assert graph.stats(user) == before  # nothing decayed, nothing archived
        assert decay().failed == []  # the present is fine
    finally:
        graph.forget_user(user)
        graph.close()


def test_the_index_cache_keeps_the_most_recent_users_and_answers_the_same(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path)
    graph = open_graph_store(settings)
    graph.ensure_schema()
    users = [new_user() for _ in range(5)]
    for user in users:
        UserGraph(graph, user).say([("Alex", "WORKS_AT", "Dell", "Alex works at Dell")])
    vectors = VectorStore(root=settings.index_dir, dim=DIM)
    capped = IndexKeeper(graph=graph, vectors=vectors, cache_size=2)
    stamps = {user: graph.stamped_vectors(user)[1] for user in users}
    query = np.ones(DIM, dtype=np.float32)
    try:
        first = {user: capped.current(user, stamps[user]).search(query, 5) for user in users}
        assert list(capped._cache) == users[-2:]  # the bound holds: least recently used dropped first
        capped.current(users[3], stamps[users[3]])
        capped.current(users[0], stamps[users[0]])
        assert list(capped._cache) == [users[3], users[0]]
        # A dropped index is only a miss: it is read back from its file, not rebuilt, and answers the same.
        again = {user: capped.current(user, stamps[user]).search(query, 5) for user in users}
        assert again == first
        assert capped.rebuilds == len(users)
        assert all(hits for hits in first.values())
    finally:
        graph.close()


def test_the_graph_steps_lists_of_up_to_99_ids_fall_in_one_neo4j_planning_bucket() -> None:
    """Neo4j plans a query again when a list parameter's size crosses a power of ten (measured on 5.26):
    padded, a recall's lists (a few ids to a few dozen) never cost a new plan."""
    assert [cy.plan_bucket(n) for n in (1, 2, 10, 11, 100, 101, 1000, 1001)] == [0, 1, 1, 2, 2, 3, 3, 4]
    assert {cy.plan_bucket(len(cy.plan_list(f"id-{i}" for i in range(n)))) for n in range(100)} == {2}
    assert cy.plan_list(["a", "b", "a"])[:3] == [cy.NO_ID, "a", "b"]  # once each, after the id that is none


def test_a_runaway_graph_expansion_on_neo4j_ends_at_the_transaction_timeout(neo4j_server, tmp_path) -> None:
    # Our own server (not NEO4J_URI): its timeout monitor ticks every 50 ms (conftest), so the 1 ms deadline is
    # enforced long before the six-hop expansion (about 2 s on this machine) could finish by luck.
    neo4j_uri = neo4j_server.uri
    user = new_user()
    names = [f"P{i}" for i in range(40)]
    facts = [(a, "KNOWS", b, f"{a} knows {b}") for i, a in enumerate(names) for b in names[i + 1 :]]
    graph = open_graph_store(Settings(neo4j_uri=neo4j_uri, data_dir=tmp_path))
    # 1 ms (the driver's smallest) against a clique of 780 facts explored from every node six hops deep.
    hasty = open_graph_store(Settings(neo4j_uri=neo4j_uri, data_dir=tmp_path, neo4j_query_timeout_s=0.001))
    try:
        graph.ensure_schema()
        people = UserGraph(graph, user)
        people.say(facts)
        seeds = [people.entities[normalize_name(n)].id for n in names]
        expand = GraphStepQuery(seeds=seeds, max_hops=4, limit=10_000, per_seed=10_000)
        assert len(graph.graph_step(user, expand).hops) == len(facts)  # the default timeout lets it finish
        runaway = expand.model_copy(update={"max_hops": 6})
        # A store's first run of a query shape (length bound, list sizes) has a planning allowance: spend it
        # on as many seeds that reach nothing.
        missing = [f"ent-missing-{i}" for i in range(len(seeds))]
        assert hasty.graph_step(user, runaway.model_copy(update={"seeds": missing})).hops == []
        with pytest.raises(StoreUnavailableError, match="transaction timeout"):
            hasty.graph_step(user, runaway)
    finally:
        graph.forget_user(user)
        graph.close()
        hasty.close()


def test_neo4j_reads_retry_through_a_restart_and_fail_typed_while_it_is_down(
    neo4j_server, monkeypatch, tmp_path
) -> None:
    # Single-query reads are auto-commit transactions with a retry of our own (the managed retry's job): the
    # pooled connections die with the server, and the first reads after it is back must still answer.
    monkeypatch.setattr(neo4j_connection, "MAX_RETRY_TIME_S", 2.0)  # the down part retries for 2 s, not 10
    graph = open_graph_store(Settings(neo4j_uri=neo4j_server.uri, data_dir=tmp_path))
    user = new_user()
    try:
        graph.ensure_schema()
        (fact,) = UserGraph(graph, user).say([("Ann", "KNOWS", "Bob", "Ann knows Bob")])
        stamp = graph.user_stamp(user)
        neo4j_server.stop()
        with pytest.raises(StoreUnavailableError):
            graph.user_stamp(user)
        neo4j_server.start()
        assert graph.user_stamp(user) == stamp
        assert [f.id for f in graph.get_facts(user, [fact.id])] == [fact.id]
        assert [h.node_id for h in graph.keyword_search(user, ["ann"], 5)] == [fact.id]
    finally:
        graph.forget_user(user)
        graph.close()


def test_index_file_locks_are_a_fixed_set_and_one_per_user(tmp_path) -> None:
    vectors = VectorStore(root=tmp_path, dim=DIM)
    users = [f"user-{i}" for i in range(5000)]
    locks = {id(vectors.lock(user)) for user in users}
    assert len(locks) <= 64  # bounded however many users one process serves
    assert all(vectors.lock(user) is vectors.lock(user) for user in users[:100])  # a user's writers still exclude


# ----------------------------------------------------------------------------------------- finding 13
def test_log_lines_are_redacted(caplog) -> None:
    log = logging.getLogger("engram.test.redaction")
    redacting = RedactingFilter(["configured-secret-value"])
    log.addFilter(redacting)
    try:
        with caplog.at_level(logging.INFO, logger=log.name):
            log.info("connecting to %s", "redis://default:pw-in-url-123@redis:6379/0")
            log.info("provider said: Incorrect API key provided: sk-abcdefghijklmnopqrstuv")
            log.info("the key is configured-secret-value")
    finally:
        log.removeFilter(redacting)
    text = caplog.text
    for secret in ("pw-in-url-123", "sk-abcdefghijklmnopqrstuv", "configured-secret-value"):
        assert secret not in text
    assert text.count("***") == 3


def test_redaction_is_linear_on_hostile_text() -> None:
    """Issue 44, finding 7: long runs of URL-scheme characters made the URL pattern rescan the run from every
    position (20,000 characters: seconds of a held GIL). The answer must still be exact."""
    runs = ["a" * 5000, "sk-" * 1500, "ab.c-d+e" * 500, "x://u:" + "y" * 3500, "token" + " " * 2000]
    credentials = "redis://default:pw-in-url-123@redis:6379/0 Bearer abcdefgh12345678 sk-abcdefghijklmnop"
    text = " ".join([*runs, credentials])
    assert 19_000 < len(text) <= 20_000
    start = time.perf_counter()
    cleaned = redact(text, ["configured-secret"])
    print(f"\nredact of {len(text):,} hostile characters: {time.perf_counter() - start:.4f} s")
    # The run of "sk-" is one key shape (masked whole); the "://" run without an '@' keeps its text.
    kept = ["a" * 5000, "***", "ab.c-d+e" * 500, "x://u:" + "y" * 3500, "token" + " " * 2000]
    assert cleaned == " ".join([*kept, "redis://default:***@redis:6379/0 Bearer *** ***"])
