"""The memory explorer's test world: a real fleet on SQLite (offline extractor) behind a real ``engram serve``
with minted keys, and users written through the pipeline over HTTP (tests/ui/)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from engram_api.models import DeadLetter, Envelope
from tests.support.gateway import auth, gateway_process, mint_keys, wait_state
from tests.support.stack import engram_stack

T0 = datetime(2024, 1, 10, 12, 0, tzinfo=UTC)
MOVES = ["I live in Tampa.", "I moved to Austin.", "I just moved to Denver."]  # 120 days apart
WHERE = "where does the user live?"
LETTER, REASON = "dl-1", "the model's answer was not JSON"


@dataclass(frozen=True)
class World:
    url: str
    secrets: dict[str, str]
    env: dict[str, str]  # the fleet's environment, without keys (a gateway in local mode)
    user: str  # three moves and a sister: the chain Tampa -> Austin -> Denver
    doomed: str  # the same moves, for the forget test
    erased: str  # Lima and Dell, for forgetting a message and the user
    other: str  # a user of namespace appB


def _write(http: httpx.Client, headers: dict[str, str], uid: str, texts: list[str]) -> None:
    for i, text in enumerate(texts):
        body = {
            "user_id": uid,
            "messages": text,
            "message_id": f"m{i}",
            "timestamp": (T0 + timedelta(days=120 * i)).isoformat(),
        }
        assert http.post("/v1/messages", headers=headers, json=body).status_code == 202
    for i in range(len(texts)):
        wait_state(http, headers, uid, f"m{i}")


@contextmanager
def explorer_world(redis_url: str, data: Path) -> Iterator[World]:
    """Users: ``user`` (the three moves, a sister, a dead letter), ``doomed`` (the moves), ``erased`` (two
    messages), ``other`` (appB)."""
    secrets, entries = mint_keys()
    with engram_stack(redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=None) as stack:
        env = {**stack.env, "ENGRAM_API_KEYS": entries}
        with gateway_process(env, data / "logs") as gw, httpx.Client(base_url=gw.url, timeout=60) as http:
            tag = uuid.uuid4().hex[:6]
            here = World(
                gw.url,
                secrets,
                dict(stack.env),
                f"appA.explorer-{tag}",
                f"appA.doomed-{tag}",
                f"appA.erased-{tag}",
                f"appB.other-{tag}",
            )
            _write(http, auth(secrets, "a_rw"), here.user, [*MOVES, "My sister Ana lives in Braga."])
            _write(http, auth(secrets, "a_rw"), here.doomed, MOVES)
            _write(http, auth(secrets, "a_rw"), here.erased, ["I live in Lima.", "I work at Dell."])
            _write(http, auth(secrets, "b_rw"), here.other, ["I live in Oslo."])
            said = Envelope(user_id=here.user, message_id=LETTER, messages=[{"content": "I like tea"}], timestamp=T0)
            stack.client.producer.ledger.dead_letters.put(
                DeadLetter(
                    user_id=here.user, message_id=LETTER, stage="extract", reason=REASON, attempts=3, envelope=said
                )
            )
            yield here


def lives_in(http: httpx.Client, world: World, uid: str, key: str = "a_rw") -> list[dict]:
    chain = http.get(f"/v1/users/{uid}/history", headers=auth(world.secrets, key), params={"predicate": "LIVES_IN"})
    assert chain.status_code == 200, chain.text
    return chain.json()
