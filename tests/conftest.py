"""Services for the whole test run: a real Redis, a real Neo4j and the LLM stand-in, started once.

Set ``REDIS_URL`` / ``NEO4J_URI`` to use running services instead of starting them. A service that
cannot start fails every test that needs it, with the reason; nothing is skipped. Tests share the
services and isolate themselves with a fresh ``user_id`` (Neo4j Community has one user database).

``slow`` (pyproject.toml) means: needs Neo4j, or runs a multi-process scenario (worker fleets, Beat,
Flower, chaos) that takes tens of seconds. The Neo4j half is not left to hand-marking: every test that
asks for ``neo4j_server``/``neo4j_uri`` or runs a ``"neo4j"`` parameter is marked here, and a test not
marked slow that reaches Neo4j anyway (``getfixturevalue``) fails. So ``pytest -m "not slow"`` (the fast
loop) never starts a JVM and runs every store-parametrized test on SQLite.

Whatever a test opens it closes: an Engram thread still running after the last teardown (a ``MemoryClient``
or ``WorkerResources`` left open, whose erasure sweep goes on calling the stopped Redis) is named in the
summary.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, settings

from engram_testing import LLMStandin, Neo4jServer
from engram_workers.services import RedisServer, ServiceStartError

# Module level, so it happens before any test module imports litellm (which otherwise fetches a price
# list over the network at import) or sentence-transformers (which would try the Hugging Face Hub).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Hypothesis times examples by default (a 200 ms deadline, a "too slow" health check): wall-clock assertions
# in disguise, red on a loaded machine. Off for every property test; pytest-timeout still catches hangs.
settings.register_profile("engram", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("engram")

NEO4J_FIXTURES = frozenset({"neo4j_server", "neo4j_uri"})


def needs_neo4j(item: pytest.Item) -> bool:
    """Asks for the session's Neo4j, or is the ``"neo4j"`` case of a store-parametrized test."""
    if NEO4J_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(value == "neo4j" for value in callspec.params.values())


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark must be there when it looks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_neo4j(item):
            item.add_marker(pytest.mark.slow)


_running: list[pytest.Item] = []  # the test being set up, so the Neo4j fixture can name it


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # After every fixture's teardown: a thread left here is a client or a worker's resources never closed.
    left = sorted(t.name for t in threading.enumerate() if t.name.startswith("engram-") and t.is_alive())
    if left:
        terminalreporter.write_sep("-", "Engram threads left running: a MemoryClient or WorkerResources not closed")
        terminalreporter.write_line(", ".join(left))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    _running[:] = [item]
    yield


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis owned by this test run (AOF on), even when REDIS_URL is set: for tests that restart it."""
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis"), appendonly=True)
    try:
        server.start()
    except ServiceStartError as exc:
        pytest.fail(f"Redis could not start: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """``REDIS_URL`` if set (checked with PING), else the URL of ``redis_server``."""
    url = os.environ.get("REDIS_URL")
    if not url:
        return str(request.getfixturevalue("redis_server").url)
    client = redis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"REDIS_URL={url} does not answer PING: {exc}", pytrace=False)
    finally:
        client.close()
    return url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on ``redis_url`` that decodes replies to str."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


# The session's Neo4j once started: chaos stops and restarts it, and every module checks it is back.
_neo4j_servers: list[Neo4jServer] = []


@pytest.fixture(scope="session")
def neo4j_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Neo4jServer]:
    """A Neo4j owned by this test run (ops/neo4j-launcher), even when NEO4J_URI is set; migrated once. Only a
    slow test may start it: the fast loop must run where no JVM can (see the module docstring)."""
    if _running and _running[0].get_closest_marker("slow") is None:
        pytest.fail(f"{_running[0].nodeid} reaches Neo4j but is not marked slow", pytrace=False)
    # The timeout monitor's default 2 s tick lets a short query outrun a 1 ms timeout by luck; 50 ms makes the
    # transaction-timeout test deterministic (test_limits) at the cost of a thread waking 20 times a second.
    conf = {"db.transaction.monitor.check.interval": "50ms"}
    server = Neo4jServer(data_dir=tmp_path_factory.mktemp("neo4j"), conf=conf)
    try:
        server.start()
    except ServiceStartError as exc:
        pytest.fail(f"Neo4j could not start: {exc}", pytrace=False)
    _migrated(server.uri)
    _neo4j_servers.append(server)
    yield server
    _neo4j_servers.remove(server)
    server.stop()


def _restart_stopped_neo4j() -> None:
    """A scenario that stopped the session's Neo4j and could not bring it back (a timeout mid-outage, a
    failed restart) costs that one test, not every later one: the next module or test restarts it."""
    for server in _neo4j_servers:
        if server.running:
            continue
        try:
            server.start()
        except ServiceStartError as exc:
            pytest.fail(f"the session's Neo4j was down and could not be restarted: {exc}", pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _neo4j_up_for_module() -> None:
    """Runs before the module's own module-scoped fixtures (autouse comes first within a scope)."""
    _restart_stopped_neo4j()


@pytest.fixture(autouse=True)
def _neo4j_up_for_test() -> None:
    _restart_stopped_neo4j()


@pytest.fixture(scope="session")
def neo4j_uri(request: pytest.FixtureRequest) -> str:
    """``NEO4J_URI`` if set (checked with a connection), else the Bolt URI of ``neo4j_server``."""
    uri = os.environ.get("NEO4J_URI")
    if not uri:
        return str(request.getfixturevalue("neo4j_server").uri)
    import neo4j  # here: only this branch needs the driver at fixture time

    try:
        with neo4j.GraphDatabase.driver(uri, auth=None) as driver:
            driver.verify_connectivity()
    except Exception as exc:  # any driver error means the same thing here: not usable
        pytest.fail(f"NEO4J_URI={uri} is not reachable: {exc}", pytrace=False)
    return _migrated(uri)


def _migrated(uri: str) -> str:
    """`engram migrate` once on the session's database, as an operator would: processes only check it."""
    from engram_api.settings import Settings
    from engram_api.storage import migrate_graph_store

    migrate_graph_store(Settings(neo4j_uri=uri))
    return uri


@pytest.fixture(scope="session")
def llm_server() -> Iterator[LLMStandin]:
    """The LLM stand-in for the whole run (for module-scoped stacks that script it themselves)."""
    with LLMStandin() as server:
        yield server


@pytest.fixture
def llm_standin(llm_server: LLMStandin) -> Iterator[LLMStandin]:
    """The shared stand-in, reset before and after the test: no script, latency, failures or records."""
    llm_server.reset()
    yield llm_server
    llm_server.reset()


@pytest.fixture
def user_id() -> str:
    """A user id no other test uses: the unit of isolation in the shared Redis and Neo4j."""
    return f"t_{uuid.uuid4().hex[:12]}"
