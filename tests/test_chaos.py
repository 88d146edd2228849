"""Chaos scenarios at test size: worker processes SIGKILLed, Redis and Neo4j taken down, a flaky LLM, a poison
message, per-user leases expiring mid-apply. The scenarios live in ops/chaos (``run_all.py`` runs them at full size); these tests run the same
code on the session's services and assert what each scenario guarantees.

Slow by nature (visibility timeouts, restarts, model loads in respawned pool children): a few minutes in all.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops" / "chaos"))

import accounting
import flaky_llm
import fleet
import lease_expiry
import neo4j_outage
import poison
import redis_restart
import worker_kill

from engram_testing import LLMStandin, Neo4jServer

# Each scenario takes one to three minutes; a lost message shows as a settle timeout of 150 s, not a hang.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def services(
    redis_url: str, neo4j_server: Neo4jServer, llm_server: LLMStandin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[fleet.Services]:
    # neo4j_server, not neo4j_uri: the outage scenario stops and restarts the server it is given.
    yield fleet.Services(
        work_dir=tmp_path_factory.mktemp("chaos"),
        redis_url=redis_url,
        neo4j_uri=neo4j_server.uri,
        llm=llm_server,
        neo4j=neo4j_server,
    )
    llm_server.reset()


def held(result: accounting.ScenarioResult) -> str:
    """The table row, as the assertion message: what was counted and which checks failed."""
    return "\n" + accounting.format_table([result])


# Every scenario checks each message it sent against the graph, and what the harness's own redelivery sweep
# re-sent against what its fault could strand (ops/chaos/README.md, "How the table counts").
EVERY_SCENARIO = {"every message's episode and facts in the graph", "sweep re-sent only what the faults could strand"}


def assert_held(result: accounting.ScenarioResult) -> None:
    failed = [name for name, passed in result.checks.items() if not passed]
    assert result.error is None, held(result)
    assert result.sent > 0 and result.checks.keys() >= EVERY_SCENARIO, held(result)
    assert (result.lost, result.duplicated, failed) == (0, 0, []), held(result)


def test_worker_sigkill_loses_nothing_duplicates_nothing_and_keeps_order(services: fleet.Services) -> None:
    result = worker_kill.run(services, worker_kill.QUICK)
    assert_held(result)
    assert result.applied == result.sent, held(result)
    targets = {k["target"] for k in result.details["kills"]}
    assert targets == {"main", "child"}, held(result)
    assert result.checks["per-user LIVES_IN order"]


def test_redis_restart_loses_nothing_and_producers_get_store_unavailable(services: fleet.Services) -> None:
    result = redis_restart.run(services, redis_restart.QUICK)
    assert_held(result)
    assert result.applied == result.sent, held(result)
    assert set(result.details["producer_errors"]) == {"StoreUnavailableError: Redis unavailable, nothing enqueued"}


def test_neo4j_outage_dead_letters_nothing_and_everything_lands(services: fleet.Services) -> None:
    result = neo4j_outage.run(services, neo4j_outage.QUICK)
    assert_held(result)
    assert (result.dead_lettered, result.applied) == (0, result.sent), held(result)


def test_flaky_llm_ends_every_message_and_breaker_and_rate_limit_hold(services: fleet.Services) -> None:
    result = flaky_llm.run(services, flaky_llm.QUICK)
    assert_held(result)
    assert result.applied + result.dead_lettered == result.sent, held(result)
    assert result.metrics["failures_injected_phase1"] > 0, held(result)
    # Counted by the breaker itself: every call the stand-in received was admitted, some were refused.
    metrics = result.metrics
    assert metrics["llm_calls"] == metrics["breaker_admitted"] + metrics["breaker_trials"], held(result)
    assert metrics["breaker_opened"] >= 1 and metrics["breaker_rejected"] > 0, held(result)


def test_poison_message_is_dead_lettered_after_bounded_deaths(services: fleet.Services) -> None:
    params = poison.QUICK
    result = poison.run(services, params)
    assert_held(result)
    assert result.dead_lettered == params.users, held(result)
    assert result.applied == result.sent - params.users, held(result)
    assert result.metrics["apply_child_deaths"] == params.max_deliveries * params.users, held(result)


def test_lease_expiry_under_load_loses_nothing_duplicates_nothing_and_keeps_order(services: fleet.Services) -> None:
    result = lease_expiry.run(services, lease_expiry.QUICK)
    assert_held(result)
    assert result.applied == result.sent, held(result)
    assert result.checks["leases were stolen mid-apply"] and result.checks["every index equals its graph"]
