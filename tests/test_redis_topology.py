"""Redis topologies (issue 45, item 7), on real servers: Sentinel URLs are accepted by the settings check and
carry a message through the whole pipeline (producer and ledger, Celery's broker, the workers) and RedBeat;
TLS is verified by default by every client Engram makes (redis-py, kombu, RedBeat): a server whose
certificate does not chain to a trusted CA is refused unless ENGRAM_REDIS_TLS_CA_FILE names that CA, and
only ENGRAM_REDIS_TLS_INSECURE, which every process logs, accepts it without one."""

from __future__ import annotations

import logging
import ssl
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from redbeat.schedulers import get_redis

from engram_api import MemoryClient, keys
from engram_api.connections import redis_client
from engram_api.errors import ConfigError, WaitTimeoutError
from engram_api.models import MessageState
from engram_api.settings import Settings, load_settings
from engram_workers.broker import SentinelTransport
from engram_workers.celery_config import beat_config, make_celery
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from engram_workers.services.redis_server import RedisServer, TlsFiles
from tests.support.acl import documented_acl
from tests.support.operator_processes import engram_process, wait_until
from tests.support.stack import SETTLE_S, engram_stack
from tests.support.tls import make_tls_files

PRIMARY_PASSWORD = "primary-secret"


@pytest.mark.parametrize(
    "url",
    [
        "sentinel://127.0.0.1:26379",
        "sentinel://:pw@10.0.0.1:26379/3;sentinel://10.0.0.2:26380;sentinel://10.0.0.3",
        "sentinel://user:p%40ss@sentinel-0.redis:26379/0",
    ],
)
def test_the_settings_accept_sentinel_urls(url: str) -> None:
    assert load_settings(redis_url=url).redis_url == url


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sentinel://h1:99999", "port"),
        ("sentinel://h1/x", "database must be a number"),
        ("sentinel://h1;redis://h2", "must be sentinel://host"),
        ("sentinel://h1?master=x", "takes no parameters"),
        ("rediss://h1:6380/0?ssl_cert_reqs=none", "ssl_. parameters"),
        ("http://h1", "expected a URL"),
    ],
)
def test_the_settings_refuse_a_bad_redis_url_naming_the_problem(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        load_settings(redis_url=url)
    assert caught.value.variable == "REDIS_URL"


# ------------------------------------------------------------------------------ TLS
@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(data_dir=tmp_path_factory.mktemp("tls-redis"), appendonly=False, tls=tls_files) as server:
        yield server


def test_every_client_factory_requires_a_verified_certificate_by_default(tls_files: TlsFiles) -> None:
    url = "rediss://redis.internal:6380/0"
    default, with_ca = Settings(), Settings(redis_tls_ca_file=tls_files.ca)
    for settings, ca in ((default, None), (with_ca, str(tls_files.ca))):
        pool = redis_client(url, settings).connection_pool.connection_kwargs
        assert (pool["ssl_cert_reqs"], pool["ssl_check_hostname"], pool["ssl_ca_certs"]) == (
            ssl.CERT_REQUIRED,
            True,
            ca,
        )
        kombu = make_celery(settings, url).connection_for_write()
        assert kombu.ssl["ssl_cert_reqs"] == ssl.CERT_REQUIRED and kombu.ssl["ssl_ca_certs"] == ca
        beat = beat_config(settings, url)["redbeat_redis_use_ssl"]
        assert beat["ssl_cert_reqs"] == ssl.CERT_REQUIRED and beat["ssl_ca_certs"] == ca
    assert make_celery(default, "redis://redis.internal:6379/0").connection_for_write().ssl is None  # no TLS asked


def test_a_server_signed_by_an_unknown_ca_is_refused_by_default_and_accepted_with_its_ca(
    tls_server: RedisServer, tls_files: TlsFiles
) -> None:
    url = tls_server.url
    assert url.startswith("rediss://")
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        redis_client(url, Settings()).ping()
    trusted = Settings(redis_tls_ca_file=tls_files.ca)
    assert redis_client(url, trusted).ping()

    # Celery's broker (kombu): the same refusal, and a task published once the CA is given.
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        make_celery(Settings(), url).connection_for_write().ensure_connection(max_retries=0)
    queue = f"tls-probe-{uuid.uuid4().hex[:8]}"
    make_celery(trusted, url).send_task("engram.tls_probe", queue=queue, routing_key=queue)
    assert redis_client(url, trusted).llen(queue) == 1

    # RedBeat, from the config Beat loads.
    for settings, accepted in ((Settings(), False), (trusted, True)):
        app = make_celery(settings, url)
        app.conf.update(beat_config(settings, url))
        beat_redis = get_redis(app)
        if accepted:
            assert beat_redis.ping()
        else:
            with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                beat_redis.ping()


def test_only_the_loud_insecure_setting_accepts_an_unverified_server(
    tls_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from engram_api import connections

    connections._warn_insecure.cache_clear()  # once per process: this test's process may have warned before
    insecure = Settings(redis_tls_insecure=True)
    with caplog.at_level(logging.WARNING, logger="engram_api.connections"):
        assert redis_client(tls_server.url, insecure).ping()
    assert "NOT verified" in caplog.text
    assert make_celery(insecure, tls_server.url).connection_for_write().ssl["ssl_cert_reqs"] == ssl.CERT_NONE


def test_a_redis_that_checks_clients_gets_the_configured_client_certificate(
    tls_files: TlsFiles, tmp_path: Path
) -> None:
    trusted = Settings(redis_tls_ca_file=tls_files.ca)
    with RedisServer(
        data_dir=tmp_path / "redis", appendonly=False, tls=tls_files, extra_config=["tls-auth-clients yes"]
    ) as server:
        with pytest.raises(redis.ConnectionError):
            redis_client(server.url, trusted).ping()  # no certificate of its own: the server hangs up
        # The test CA's server certificate has no usage restriction: it serves as a client's too.
        own = trusted.model_copy(update={"redis_tls_cert_file": tls_files.cert, "redis_tls_key_file": tls_files.key})
        assert redis_client(server.url, own).ping()
        queue = f"mtls-probe-{uuid.uuid4().hex[:8]}"
        make_celery(own, server.url).send_task("engram.tls_probe", queue=queue, routing_key=queue)
        assert redis_client(server.url, own).llen(queue) == 1


# ------------------------------------------------------------------------------ Sentinel
@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A password-protected primary and one Sentinel monitoring it (as ``mymaster``)."""
    base = tmp_path_factory.mktemp("sentinel")
    with (
        RedisServer(data_dir=base / "primary", appendonly=False, password=PRIMARY_PASSWORD) as primary,
        RedisServer(data_dir=base / "sentinel", appendonly=False, sentinel_of=primary) as watcher,
    ):
        yield primary, watcher


def test_a_message_goes_through_the_pipeline_and_beat_through_sentinel(
    sentinel: tuple[RedisServer, RedisServer], tmp_path: Path
) -> None:
    primary, watcher = sentinel
    url = watcher.url
    assert url.startswith("sentinel://") and str(primary.port) not in url  # only the Sentinel is named
    with engram_stack(redis_url=url, data_dir=tmp_path / "stack", neo4j_uri=None, llm_url=None, database=2) as stack:
        direct = redis.Redis.from_url(f"redis://:{PRIMARY_PASSWORD}@127.0.0.1:{primary.port}/2", decode_responses=True)
        user = f"sentinel_{uuid.uuid4().hex[:8]}"
        receipt = stack.client.enqueue(user, "I live in Lisbon.", timestamp=datetime(2024, 5, 1, tzinfo=UTC))
        # The producer's script wrote on the primary the Sentinel named: the task waits in its queue there.
        assert direct.hget(keys.status(user, receipt.message_id), "state") == MessageState.QUEUED.value

        # The workers' Celery reaches it through Engram's Sentinel transport (held messages kept alive).
        assert isinstance(make_celery(stack.settings, url).connection_for_write().transport, SentinelTransport)
        result = stack.client.wait(receipt, timeout=SETTLE_S)
        assert result.applied == [receipt.message_id] and result.done
        assert direct.hget(keys.status(user, receipt.message_id), "state") == MessageState.APPLIED.value
        assert "Lisbon" in stack.client.get_context(user, "where do I live?")

        # RedBeat: Beat takes its leader lock and stores the schedule on the primary.
        beat = engram_process("beat", ["beat"], env=stack.env, log_dir=tmp_path)
        with beat:
            beat.wait_for_log("beat: Acquired lock", timeout=90)
            wait_until(lambda: direct.exists(keys.BEAT_LOCK), timeout=30, what="the Beat lock on the primary")


def test_sentinel_over_tls_is_verified_and_carries_a_message_and_beat(tls_files: TlsFiles, tmp_path: Path) -> None:
    """A TLS-only primary and a TLS-only Sentinel (which reaches the primary over TLS too): with
    ENGRAM_REDIS_SENTINEL_TLS every client speaks TLS to both, verifying their certificates by default."""
    with (
        RedisServer(data_dir=tmp_path / "primary", appendonly=False, password=PRIMARY_PASSWORD, tls=tls_files) as primary,
        RedisServer(data_dir=tmp_path / "sentinel", appendonly=False, sentinel_of=primary, tls=tls_files) as watcher,
    ):  # fmt: skip
        url = watcher.url
        unknown_ca = Settings(redis_sentinel_tls=True)
        # No Sentinel answers a client that refuses its certificate (redis-py names each Sentinel's error).
        with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            redis_client(url, unknown_ca).ping()
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            make_celery(unknown_ca, url).connection_for_write().ensure_connection(max_retries=0)
        trusted = Settings(redis_sentinel_tls=True, redis_tls_ca_file=tls_files.ca)
        assert redis_client(url, trusted).ping()
        assert make_celery(trusted, url).connection_for_write().ssl["ssl_cert_reqs"] == ssl.CERT_REQUIRED

        tls_env = {"redis_sentinel_tls": True, "redis_tls_ca_file": tls_files.ca}
        with engram_stack(redis_url=url, data_dir=tmp_path / "stack", neo4j_uri=None, llm_url=None, **tls_env) as stack:
            user = f"sentinel_tls_{uuid.uuid4().hex[:8]}"
            receipt = stack.client.enqueue(user, "I live in Lisbon.", timestamp=datetime(2024, 5, 1, tzinfo=UTC))
            assert stack.client.wait(receipt, timeout=SETTLE_S).applied == [receipt.message_id]
            assert "Lisbon" in stack.client.get_context(user, "where do I live?")
            beat = engram_process("beat", ["beat"], env=stack.env, log_dir=tmp_path)
            with beat:
                beat.wait_for_log("beat: Acquired lock", timeout=90)
                wait_until(lambda: stack.client.redis.exists(keys.BEAT_LOCK), timeout=30, what="the Beat lock")


# ------------------------------------------------------------------------------ access control
def test_the_documented_acl_runs_a_message_a_recall_beat_and_an_erasure(tmp_path: Path) -> None:
    db = 3
    with RedisServer(data_dir=tmp_path / "redis", appendonly=True, password="admin-pw") as server:
        admin = redis.Redis.from_url(f"redis://:admin-pw@127.0.0.1:{server.port}/{db}", decode_responses=True)
        users = documented_acl(db)
        assert set(users) == {"engram-worker", "engram-beat", "engram-client"}
        for rules in users.values():
            admin.execute_command("ACL", "SETUSER", *rules)
        url = {name: f"redis://{name}:{name}-pw@127.0.0.1:{server.port}/{db}" for name in users}
        with engram_stack(
            redis_url=f"redis://:admin-pw@127.0.0.1:{server.port}/{db}", data_dir=tmp_path / "stack", neo4j_uri=None,
            llm_url=None, workers=False, database=db,
        ) as stack:  # fmt: skip
            stack.env["REDIS_URL"] = url["engram-worker"]  # the stack's own client (flushed the database) is admin
            admin.execute_command("ACL", "LOG", "RESET")
            stack.start_worker("extract", EXTRACT_WORKER, concurrency=4)
            stack.start_worker("apply", APPLY_WORKER)
            client = MemoryClient(settings=stack.settings, redis_url=url["engram-client"])
            user = f"acl_{uuid.uuid4().hex[:8]}"
            receipt = client.enqueue(user, "I live in Lisbon.", timestamp=datetime(2024, 5, 1, tzinfo=UTC))
            try:
                assert client.wait(receipt, timeout=SETTLE_S).applied == [receipt.message_id]
            except WaitTimeoutError as exc:  # say what the ACL refused
                raise AssertionError(admin.execute_command("ACL", "LOG")) from exc
            assert "Lisbon" in client.get_context(user, "where do I live?")
            beat = engram_process(
                "beat", ["beat"], env={**stack.env, "REDIS_URL": url["engram-beat"]}, log_dir=tmp_path
            )
            with beat:
                beat.wait_for_log("beat: Acquired lock", timeout=90)
                wait_until(lambda: admin.exists(keys.BEAT_LOCK), timeout=30, what="Beat's lock")
            client.forget_user(user)
            assert not admin.exists(keys.status(user, receipt.message_id))
            client.close()
        assert admin.execute_command("ACL", "LOG") == []  # nothing any process did was refused
