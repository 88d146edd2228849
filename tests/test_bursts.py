"""Bursts and late messages through the whole pipeline, on both stores (issue 43, item 11): producer, worker
processes, the LLM stand-in answering as a competent model does for what its prompt shows, the reader.

The stand-in reads the prompt's known facts: a new value of a predicate it sees ends the fact it replaces
(``ends``), and a message older than a known fact of its predicate says when it stopped (``valid_until`` =
that fact's "since" day), as the prompt asks. So the answer depends on what each extraction was shown, and a
burst extracted side by side would leave Java, Kotlin and Rust all current. Ingested at once, or with the
older message arriving last, the memory must equal telling the messages one at a time in event-time order.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram_testing.llm_standin import Reply
from tests.support.extractions import entity, fact, message_text
from tests.support.stack import SETTLE_S, engram_stack

T = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
# What each message says: (predicate, object, label, statement).
SAYS = {
    "My main language is Java.": ("CODES_IN", "Java", "Language", "User's main programming language is Java"),
    "We switched to Kotlin.": ("CODES_IN", "Kotlin", "Language", "User switched to Kotlin"),
    "These days I mostly code in Rust.": ("CODES_IN", "Rust", "Language", "User mostly codes in Rust"),
    "I study marine biology now.": ("STUDIES", "marine biology", "Skill", "User studies marine biology"),
    "I study chemistry.": ("STUDIES", "chemistry", "Skill", "User studies chemistry"),
    "I paint on weekends.": ("HOBBY", "painting", "Activity", "User paints on weekends"),
}
BURST = [
    ("My main language is Java.", T),
    ("We switched to Kotlin.", T + DAY),
    ("These days I mostly code in Rust.", T + 2 * DAY),
    ("I study marine biology now.", T + 3 * DAY),
]
LATE = ("I study chemistry.", datetime(2024, 9, 1, 12, 0, tzinfo=UTC))  # older than marine biology
EXPECTED = [
    ("CODES_IN", "Java", T, T + DAY),
    ("CODES_IN", "Kotlin", T + DAY, T + 2 * DAY),
    ("CODES_IN", "Rust", T + 2 * DAY, None),
    ("STUDIES", "chemistry", LATE[1], T + 3 * DAY),
    ("STUDIES", "marine biology", T + 3 * DAY, None),
]
_KNOWN = re.compile(r"^(F\d+) \[([A-Z_]+)\] .*\(since (\d{4}-\d{2}-\d{2})\)$")
_TIME = re.compile(r"^Message time: (\S+)", re.MULTILINE)
POISON = "My main language is COBOL."  # an answer no attempt can read: the message is dead-lettered


def competent(request: dict[str, Any]) -> Reply:
    """What a competent model answers for the message and the known facts its prompt shows."""
    text = message_text(request)
    if text == POISON:
        return Reply.malformed()
    if text not in SAYS:
        return Reply.json({"entities": [], "facts": []})
    predicate, obj, label, statement = SAYS[text]
    prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
    sent = datetime.fromisoformat(_TIME.search(prompt).group(1)).date()  # type: ignore[union-attr]
    known = [m.groups() for line in prompt.splitlines() if (m := _KNOWN.match(line))]
    said = fact("user", predicate, "N1", statement)
    ends = [handle for handle, p, since in known if p == predicate and since <= sent.isoformat()]
    newer = sorted(since for _, p, since in known if p == predicate and since > sent.isoformat())
    if newer:  # the message is older than a known fact that replaced what it says
        said["valid_until"] = newer[0]
    return Reply.json({"entities": [entity("N1", obj, label)], "facts": [said], "ends": ends})


@pytest.fixture(scope="module", params=["sqlite", "neo4j"])
def stack(request, redis_url, llm_server, tmp_path_factory):
    neo4j_uri = request.getfixturevalue("neo4j_uri") if request.param == "neo4j" else None
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("bursts"), neo4j_uri=neo4j_uri, llm_url=llm_server.url,
        llm_max_attempts=2,
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(autouse=True)
def _script(llm_server):
    llm_server.script(competent)
    # Each call takes a while, so the messages of a burst are in the extract worker's threads at once.
    llm_server.latency_s = 0.3
    yield
    llm_server.latency_s = 0.0


def uid() -> str:
    return f"b_{uuid.uuid4().hex[:10]}"


def one_at_a_time(stack, user: str, turns: list[tuple[str, datetime]]) -> None:
    for i, (text, when) in enumerate(turns):
        stack.client.wait(stack.client.enqueue(user, text, message_id=f"m{i}", timestamp=when), timeout=SETTLE_S)


def at_once(stack, user: str, turns: list[tuple[str, datetime]], first: int = 0) -> Any:
    items = [
        {"user_id": user, "messages": text, "message_id": f"m{first + i}", "timestamp": when}
        for i, (text, when) in enumerate(turns)
    ]
    return stack.client.wait(stack.client.enqueue_many(items), timeout=SETTLE_S)


def facts(stack, user: str) -> list[tuple[str, str | None, datetime, datetime | None]]:
    return sorted(
        ((f.predicate, f.object_name, f.valid_from, f.valid_until) for f in stack.client.history(user, "user")),
        key=lambda row: (row[0], row[2]),
    )


def test_a_burst_and_a_late_message_end_as_told_one_at_a_time_in_event_time_order(stack):
    told, burst, late = uid(), uid(), uid()
    one_at_a_time(stack, told, sorted([*BURST, LATE], key=lambda turn: turn[1]))
    assert facts(stack, told) == EXPECTED

    # The whole burst at once, the older message enqueued last.
    at_once(stack, burst, [*BURST, LATE])
    assert facts(stack, burst) == EXPECTED

    # The older message arrives after the burst is applied: it is shown the newer fact and lands as history.
    at_once(stack, late, BURST)
    at_once(stack, late, [LATE], first=len(BURST))
    assert facts(stack, late) == EXPECTED


def test_a_message_that_dead_letters_does_not_hold_its_users_later_messages(stack):
    user, other = uid(), uid()
    turns = [(POISON, T), *BURST[1:3], ("I paint on weekends.", T + 3 * DAY)]
    result = at_once(stack, user, turns)
    assert result.dead_lettered == ["m0"] and result.applied == ["m1", "m2", "m3"]
    assert facts(stack, user) == [
        ("CODES_IN", "Kotlin", T + DAY, T + 2 * DAY),
        ("CODES_IN", "Rust", T + 2 * DAY, None),
        ("HOBBY", "painting", T + 3 * DAY, None),
    ]
    # Another user's burst meanwhile is not behind this user's turn.
    at_once(stack, other, BURST[:2])
    assert facts(stack, other) == [("CODES_IN", "Java", T, T + DAY), ("CODES_IN", "Kotlin", T + DAY, None)]
