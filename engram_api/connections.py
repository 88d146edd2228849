"""Where the services are, and how every redis-py client is made.

``engram up`` / ``engram demo`` start an embedded Redis and record its URL in
``ENGRAM_DATA_DIR/services.json``; a client with no ``REDIS_URL`` finds it there, so a newcomer's
scripts work against the embedded stack without configuration.

``redis_target`` reads a Redis URL and the ``ENGRAM_REDIS_*`` settings into one ``RedisTarget``: a
``sentinel://`` URL names the Sentinels (the primary is asked of them on every new connection, so a
failover is followed), a ``rediss://`` one TLS. Every client is made from a target: redis-py's here
(``redis_client``: producer, reader, ledger, workers, breaker, rate limiter, metrics, CLI), kombu's and
RedBeat's in ``engram_workers.celery_config``; through Sentinel, TLS (``ENGRAM_REDIS_SENTINEL_TLS``) covers the
Sentinels and the primary alike. Invariant: TLS verifies the server's certificate (against
``ENGRAM_REDIS_TLS_CA_FILE`` or the system's CAs, and its host name) unless ``ENGRAM_REDIS_TLS_INSECURE``
says otherwise, which every process that builds a target then logs as a warning; a URL cannot weaken it
(the settings refuse ``ssl_*`` URL parameters).
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from engram_api.errors import ConfigError
from engram_api.redaction import mask_userinfo
from engram_api.settings import Settings

if TYPE_CHECKING:
    import redis

__all__ = [
    "SERVICES_FILE",
    "RedisTarget",
    "RedisTls",
    "SentinelUrl",
    "check_redis_url",
    "parse_sentinels",
    "redis_client",
    "redis_target",
    "resolve_redis_url",
    "sentinel_tls",
    "write_services_file",
]

log = logging.getLogger(__name__)

SERVICES_FILE = "services.json"


def _services_path(settings: Settings) -> Path:
    return settings.data_dir / SERVICES_FILE


def write_services_file(settings: Settings, **urls: str) -> Path:
    """Written 0600: the embedded Redis's URL carries its password."""
    path = _services_path(settings)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file from before may have other bits
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(urls))
    return path


def resolve_redis_url(settings: Settings) -> str:
    if settings.redis_url:
        return settings.redis_url
    try:
        url = json.loads(_services_path(settings).read_text()).get("redis_url")
    except (OSError, ValueError):
        url = None
    if not url:
        raise ConfigError(
            "REDIS_URL",
            f"not set and no embedded Redis is running for {settings.data_dir} "
            "(start one with `engram up`, or set REDIS_URL=redis://host:port/0)",
        )
    return str(url)


def check_redis_url(url: str) -> SentinelUrl | None:
    """The checks every Redis URL passes (the settings', and ``redis_target``'s for one given in code);
    the Sentinels a ``sentinel://`` URL names. ValueError naming what is wrong."""
    if not url.startswith(("redis://", "rediss://", "unix://", "sentinel://")):
        raise ValueError("expected a URL such as redis://127.0.0.1:6379/0 or sentinel://127.0.0.1:26379/0")
    if re.search(r"[?&]ssl_", url):
        # The only way to weaken TLS is the loud setting, not a URL parameter redis-py would obey quietly.
        raise ValueError("carries ssl_* parameters: TLS is set by the ENGRAM_REDIS_TLS_* settings")
    return parse_sentinels(url) if url.startswith("sentinel://") else None


class SentinelUrl(BaseModel):
    """A ``sentinel://`` URL read: the Sentinels' addresses, and the primary's credentials and database."""

    model_config = ConfigDict(frozen=True)
    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = Field(None, repr=False)
    db: int = 0


def parse_sentinels(url: str) -> SentinelUrl:
    """``sentinel://[user:password@]host[:port][/db]``, several joined by ';' (kombu's form). The first
    credentials and database given are the primary's. ValueError naming the part that is wrong."""
    nodes: list[tuple[str, int]] = []
    username = password = None
    db: int | None = None
    for part in url.split(";"):
        split = urlsplit(part.strip())
        if split.scheme != "sentinel" or not split.hostname:
            raise ValueError(f"each ';'-separated part must be sentinel://host[:port], not {part.strip()[:10]!r}...")
        try:
            nodes.append((split.hostname, split.port or 26379))
        except ValueError:
            raise ValueError("a Sentinel's port is not a number from 1 to 65535") from None
        if split.password is not None and password is None:
            username, password = (unquote(split.username) if split.username else None), unquote(split.password)
        path = split.path.strip("/")
        if path and db is None:
            if not path.isdigit():
                raise ValueError(f"the database must be a number, not {path!r}")
            db = int(path)
        if split.query:
            raise ValueError("a sentinel:// URL takes no parameters (the ENGRAM_REDIS_SENTINEL_* settings do)")
    return SentinelUrl(nodes=tuple(nodes), username=username, password=password, db=db or 0)


class RedisTls(BaseModel):
    """How a TLS connection checks the server: ``verify`` false (ENGRAM_REDIS_TLS_INSECURE) accepts any
    certificate."""

    model_config = ConfigDict(frozen=True)
    verify: bool = True
    check_hostname: bool = True
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def options(self) -> dict[str, Any]:
        """The ``ssl_*`` connection options of redis-py, which kombu's ``broker_use_ssl`` and RedBeat's
        ``redbeat_redis_use_ssl`` take as they are."""
        return {
            "ssl_cert_reqs": ssl.CERT_REQUIRED if self.verify else ssl.CERT_NONE,
            "ssl_check_hostname": self.verify and self.check_hostname,
            "ssl_ca_certs": str(self.ca_file) if self.ca_file else None,
            "ssl_certfile": str(self.cert_file) if self.cert_file else None,
            "ssl_keyfile": str(self.key_file) if self.key_file else None,
        }


class RedisTarget(BaseModel):
    """One Redis as every client reaches it: ``url`` directly, or through ``sentinel`` (the primary named
    ``master``); ``tls`` for a ``rediss://`` URL, or a Sentinel URL with ``ENGRAM_REDIS_SENTINEL_TLS`` (then
    the Sentinels and the primary are both reached over TLS, verified alike)."""

    model_config = ConfigDict(frozen=True)
    url: str = Field(repr=False)  # may carry a password
    sentinel: SentinelUrl | None = None
    master: str = ""
    sentinel_password: str | None = Field(None, repr=False)
    tls: RedisTls | None = None


def redis_target(url: str, settings: Settings) -> RedisTarget:
    """``url`` with the settings' Sentinel and TLS options; ConfigError (naming REDIS_URL) for a URL the
    settings check would refuse (a ``redis_url`` given in code is checked here)."""
    try:
        sentinel = check_redis_url(url)
    except ValueError as exc:
        raise ConfigError("REDIS_URL", f"{exc} (got {mask_userinfo(url)!r})") from None
    tls = None
    if urlsplit(url).scheme == "rediss" or (sentinel is not None and settings.redis_sentinel_tls):
        tls = RedisTls(
            verify=not settings.redis_tls_insecure,
            check_hostname=settings.redis_tls_check_hostname,
            ca_file=settings.redis_tls_ca_file,
            cert_file=settings.redis_tls_cert_file,
            key_file=settings.redis_tls_key_file,
        )
        if not tls.verify:
            _warn_insecure()
    return RedisTarget(
        url=url,
        sentinel=sentinel,
        master=settings.redis_sentinel_master if sentinel else "",
        sentinel_password=settings.redis_sentinel_password if sentinel else None,
        tls=tls,
    )


@cache
def _warn_insecure() -> None:
    log.warning(
        "ENGRAM_REDIS_TLS_INSECURE is set: Redis's TLS certificate is NOT verified, so anyone on the network path "
        "can read and change every message and lock; set ENGRAM_REDIS_TLS_CA_FILE instead"
    )


def redis_client(
    url: str, settings: Settings, *, timeout_s: float = 10.0, decode_responses: bool = True
) -> redis.Redis:
    """Every redis-py client Engram opens (producer, reader, ledger, workers, breaker, rate limiter, metrics, CLI).

    ``decode_responses``: every value Engram keeps in Redis is text (JSON or counters); callers that only
    count or run scripts returning numbers may skip decoding. ``timeout_s`` bounds each command and the
    connect, so a Redis that is away is an error, not a hang. Through Sentinel, each new connection asks
    the Sentinels for the primary, so after a failover the client follows it.
    """
    # Imported here: resolving the URL (a stopped embedded fleet has none) must not cost the redis import.
    import redis

    target = redis_target(url, settings)
    options: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": min(timeout_s, 5.0),
        "health_check_interval": 30,
    }
    if target.sentinel is not None:
        from redis.sentinel import Sentinel

        node = target.sentinel
        sentinels = Sentinel(
            list(node.nodes),
            sentinel_kwargs={
                "password": target.sentinel_password,
                "socket_timeout": options["socket_connect_timeout"],
                "socket_connect_timeout": options["socket_connect_timeout"],
                **sentinel_tls(target),
            },
        )
        return sentinels.master_for(
            target.master, db=node.db, username=node.username, password=node.password, **options, **sentinel_tls(target)
        )
    return redis.Redis.from_url(url, **options, **(target.tls.options() if target.tls else {}))


def sentinel_tls(target: RedisTarget) -> dict[str, Any]:
    """The options that make redis-py reach a Sentinel, or the primary it names, over ``target``'s TLS
    (``ssl`` picks the TLS connection class); empty without TLS. Every Sentinel client takes them: redis-py's
    here, kombu's and RedBeat's in ``engram_workers.celery_config``."""
    return {"ssl": True, **target.tls.options()} if target.tls else {}
