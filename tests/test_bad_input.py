"""Bad input at every entry point fails with a typed error naming the field, and nothing is enqueued or
written; valid input of any shape is accepted and arrives intact.

Entry points: the producer (``enqueue``, ``enqueue_many``), the reader (``recall``, ``search``,
``get_context``, ``history``, ``get_graph``, ``stats``, ``forget``, ``forget_user``, ``feedback``) and the
CLI (``engram enqueue``, ``engram recall``). No workers run: what the producer accepts stays on the extract
queue, where it can be inspected. The reader runs on the embedded SQLite store holding a victim user's
memory, so a write that should not happen has something to damage.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engram_api import MemoryClient, keys
from engram_api.errors import InvalidInputError
from engram_api.models import GLOBAL_SCOPE, MESSAGE_ID_RE, USER_ID_RE, ChatMessage, Envelope, MessageState, UserStats
from engram_api.settings import Settings
from engram_workers.cli import main as cli
from tests.support.api_calls import API_CALLS
from tests.support.memory import remember
from tests.support.stack import Stack, engram_stack

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
REMEMBERED = datetime(2024, 2, 1, 9, 0, tzinfo=UTC)  # the victim's first message; one a month after
VICTIM = "victim"
NEIGHBOUR = "neighbour"  # a second user with memory of the same kind: a read that leaks has something to show
MAX_CHARS = Settings.model_fields["max_message_chars"].default
MAX_MESSAGES = Settings.model_fields["max_messages_per_call"].default
MAX_BATCH = Settings.model_fields["max_batch"].default
ROLES = ["user", "assistant", "system", "tool"]
# Far enough from year 1 / 9999 that converting it to UTC leaves the representable range.
UNREPRESENTABLE = [
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
    datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
]

# User ids that would mean something to a path, a Redis key pattern, a Cypher or SQL query, or a terminal.
HOSTILE_USER_IDS = [
    "../x",
    "a/b",
    "x' OR 1=1",
    "`) DETACH DELETE n //",
    "",
    " ",
    "a\x00b",
    "\ud800",
    "alice\n",
    "a" * 129,
    "a:b",
    "a*",
    "_x",
    "ａｌｉｃｅ",
    "\x1b[31mred",
    GLOBAL_SCOPE,  # the fleet-wide weights' scope: a user of that name would share their row
]
WRONG_TYPES = [None, 5, b"alice", {"user": "alice"}, ["alice"]]
BAD_USER_IDS = [*HOSTILE_USER_IDS, *WRONG_TYPES]
BAD_TEXTS = ["", "   ", "\n\t", None, 5, b"q", ["q"], "\ud800"]
BAD_MESSAGE_IDS = ["", " ", "../m", "a/b", "x' OR 1=1", "m\x00", "\ud800", "m" * 129, "-m", "m\n", 5, b"m", ["m"]]

BAD_INPUT: dict[str, list[Any]] = {
    "user_id": BAD_USER_IDS,
    "messages": [
        *BAD_TEXTS,
        "a\x00b",
        "x" * (MAX_CHARS + 1),
        {"role": "user", "content": "hi"},
        {"hi"},
        [],
        [None],
        ["hi"],
        [{"role": "admin", "content": "hi"}],
        [{"role": None, "content": "hi"}],
        [{"role": "user", "content": 5}],
        [{"role": "user"}],
        [{"role": "user", "content": "ok"}, {"role": "user", "content": "\ud800"}],
        [{"role": "user", "content": " "}, {"role": "assistant", "content": "\n"}],
        [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1),
        [{"role": "user", "content": "x" * (MAX_CHARS // 2 + 1)}] * 2,
    ],
    "message_id": BAD_MESSAGE_IDS,
    "timestamp": [datetime(2024, 1, 1), "2024-01-01T00:00:00+00:00", 1_700_000_000, date(2024, 1, 1), *UNREPRESENTABLE],
    "metadata": [
        "source=test",
        ["source"],
        5,
        {1: "x"},
        {"k": None},
        {"k": {"nested": 1}},
        {"k": [1]},
        {"k": b"x"},
        {"k": math.nan},
        {"k": math.inf},
        {"k": "\ud800"},
        {"\ud800": "v"},
        # Bigger than any message may be: metadata must not be a way around the size limit.
        {"k": "x" * (10 * MAX_CHARS)},
    ],
}
VALID_CALL: dict[str, Any] = {
    "user_id": "writer",
    "messages": "I live in Austin.",
    "message_id": None,
    "timestamp": T0,
    "metadata": {"source": "test"},
}


def _label(value: Any) -> str:
    return repr(value)[:40]


PRODUCER_CASES = [
    pytest.param(field, value, id=f"{field}={_label(value)}") for field, values in BAD_INPUT.items() for value in values
]


# ------------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Snapshot:
    """Everything a call could have written: Redis keys, the extract queue, the graph store, the indexes."""

    redis_keys: frozenset[str]
    queued: int
    users: tuple[UserStats, ...]
    feedback_rows: int
    index_files: frozenset[tuple[str, int, int]]

    @classmethod
    def take(cls, client: MemoryClient) -> Snapshot:
        client.reader.flush()  # a recall's log is written after it returned: not inside the next snapshot
        graph, root = client.graph, client.settings.index_dir
        files = root.iterdir() if root.exists() else iter(())
        return cls(
            redis_keys=frozenset(client.redis.scan_iter(count=1000)),
            queued=client.redis.llen(keys.EXTRACT_QUEUE),
            users=tuple(graph.stats(u) for u in graph.list_users()),
            feedback_rows=len(graph.feedback(None, 1_000_000)),
            index_files=frozenset((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files),
        )


def names_field(actual: str, field: str) -> bool:
    """``actual`` is ``field`` or a part of it (``messages[1].content`` names ``messages``)."""
    return re.fullmatch(rf"{re.escape(field)}(?:[.\[].*)?", actual, flags=re.DOTALL) is not None


def assert_rejected(client: MemoryClient, call: Callable[[], object], field: str) -> None:
    before = Snapshot.take(client)
    with pytest.raises(InvalidInputError) as info:
        call()
    assert names_field(info.value.field, field), f"field {info.value.field!r} does not name {field!r}"
    assert Snapshot.take(client) == before, "a rejected call wrote something"


@dataclass(frozen=True)
class Reading:
    """A recall of the victim's memory, for the feedback calls to refer to."""

    client: MemoryClient
    recall_id: str


# One bad argument of a reader call on the victim's memory: (api, call, field, bad values).
READER_CASES: list[tuple[str, Callable[[Reading, Any], object], str, list[Any]]] = [
    ("recall", lambda r, x: r.client.recall(VICTIM, x), "query", [*BAD_TEXTS, "q" * 10_001]),
    ("recall", lambda r, x: r.client.recall(VICTIM, "home", k=x), "k", [0, -1, 201, 1.5, "5", True, None]),
    ("recall", lambda r, x: r.client.recall(VICTIM, "home", as_of=x), "as_of", [datetime(2024, 1, 1), "2024", 5, *UNREPRESENTABLE]),
    ("search", lambda r, x: r.client.search(VICTIM, x), "query", BAD_TEXTS),
    ("search", lambda r, x: r.client.search(VICTIM, "home", k=x), "k", [0, 201, 2.0, None]),
    ("search", lambda r, x: r.client.search(VICTIM, "home", detail_level=x), "detail_level", ["", "BROAD", "all", None, 5, ["broad"]]),
    ("get_context", lambda r, x: r.client.get_context(VICTIM, x), "query", BAD_TEXTS),
    ("get_context", lambda r, x: r.client.get_context(VICTIM, "home", x), "max_tokens", [0, -1, 100_001, 1.5, "800", True, None]),
    ("history", lambda r, x: r.client.history(VICTIM, x), "subject", BAD_TEXTS),
    ("history", lambda r, x: r.client.history(VICTIM, "user", x), "predicate", [5, b"LIVES_IN", ["LIVES_IN"], {"p": 1}, "\ud800"]),
    ("history", lambda r, x: r.client.history(VICTIM, "user", limit=x), "limit", [0, -1, 1001, 1.5, "100", True, None]),
    ("get_graph", lambda r, x: r.client.get_graph(VICTIM, page=x), "page", [0, -1, 1.5, "1", True, None]),
    ("get_graph", lambda r, x: r.client.get_graph(VICTIM, page_size=x), "page_size", [0, 1001, 1.5, "50", None]),
    ("forget", lambda r, x: r.client.forget(VICTIM, x), "memory_id", BAD_MESSAGE_IDS),
    ("feedback", lambda r, x: r.client.feedback(VICTIM, x, []), "recall_id", ["", None, 5, ["r"], "\ud800", "no-such-recall"]),
    ("feedback", lambda r, x: r.client.feedback(VICTIM, r.recall_id, x), "useful_ids", [None, 5, "abc", [None], [["x"]], ["fact_not_returned"]]),
]  # fmt: skip


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def stack(redis_url, tmp_path_factory) -> Iterator[Stack]:
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("bad-input"), neo4j_uri=None, llm_url=None, workers=False
    ) as s:
        remember(
            s.client,
            VICTIM,
            ["I live in Austin.", "My brother Alex works at Amazon.", "I moved to Denver."],
            REMEMBERED,
        )
        remember(
            s.client,
            NEIGHBOUR,
            ["I live in Boston.", "My sister Maya works at Google.", "I moved to Austin."],
            REMEMBERED,
        )
        yield s


@pytest.fixture(scope="module")
def reading(stack) -> Reading:
    result = stack.client.recall(VICTIM, "where does the user live?")
    assert result.items, "the victim has no memory to damage"
    return Reading(client=stack.client, recall_id=result.recall_id)


# ------------------------------------------------------------------------------------------ producer


@pytest.mark.parametrize(("field", "value"), PRODUCER_CASES)
def test_enqueue_rejects_bad_input(stack, field, value):
    call = {**VALID_CALL, field: value}
    assert_rejected(stack.client, lambda: stack.client.enqueue(**call), field)


@pytest.mark.parametrize(("field", "value"), PRODUCER_CASES)
def test_enqueue_many_rejects_the_whole_batch_for_one_bad_item(stack, field, value):
    items = [VALID_CALL, {**VALID_CALL, field: value}, VALID_CALL]
    assert_rejected(stack.client, lambda: stack.client.enqueue_many(items), f"items[1].{field}")


@pytest.mark.parametrize(
    ("items", "field"),
    [
        (None, "items"),
        (5, "items"),
        ("abc", "items"),  # a string is not a batch, not a batch of characters
        ([5], "items[0]"),
        ([{"user_id": "writer"}], "items[0]"),
        ([{"messages": "hi"}], "items[0]"),
        ([VALID_CALL] * (MAX_BATCH + 1), "items"),
    ],
    ids=_label,
)
def test_enqueue_many_rejects_bad_batches(stack, items, field):
    assert_rejected(stack.client, lambda: stack.client.enqueue_many(items), field)


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param("x" * MAX_CHARS, id="max-chars"),
        pytest.param([{"content": "hi"}] * MAX_MESSAGES, id="max-messages"),
    ],
)
def test_the_limits_themselves_are_accepted(stack, messages):
    client = stack.client
    queued = client.redis.llen(keys.EXTRACT_QUEUE)
    client.enqueue("writer", messages)
    assert client.redis.llen(keys.EXTRACT_QUEUE) == queued + 1


ANY_TEXT = st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=20)
CONTENT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=300).filter(
    str.strip
)
# Known trouble makers first, so that a hundred examples meet them, then anything.
NASTY = st.sampled_from([math.nan, math.inf, "\ud800", "a\x00b", "\x1b[2J", b"x", "x" * (MAX_CHARS + 1), 2**64])
ANYTHING = st.recursive(
    NASTY | st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT | st.binary(max_size=8) | st.datetimes(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=6,
)
# Valid arguments of every shape (control characters in the text included: only NUL is refused).
VALID = {
    "user_id": st.from_regex(USER_ID_RE, fullmatch=True).filter(lambda u: u != GLOBAL_SCOPE),
    "messages": CONTENT
    | st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": CONTENT}), min_size=1, max_size=5),
    "message_id": st.none() | st.from_regex(MESSAGE_ID_RE, fullmatch=True),
    "timestamp": st.none()
    | st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(2200, 1, 1),
        timezones=st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)).map(timezone),
    ),
    "metadata": st.none()
    | st.dictionaries(
        st.text(min_size=1, max_size=20),  # keys: 1-64 characters (docs/api.md)
        st.text(max_size=50)
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.booleans(),
        max_size=5,
    ),
}
# Anything at all in one argument, shaped like the argument often enough to get past its first check.
JUNK = {
    "user_id": ANYTHING,
    "messages": ANYTHING | st.lists(st.fixed_dictionaries({"role": ANYTHING, "content": ANYTHING}), max_size=3),
    "message_id": ANYTHING,
    "timestamp": ANYTHING,
    # A metadata that is not a mapping at all is refused at once (see BAD_INPUT); look inside mappings.
    "metadata": st.dictionaries(ANY_TEXT | NASTY.filter(lambda v: isinstance(v, str)), NASTY | ANYTHING, min_size=1),
}
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(call=st.fixed_dictionaries(VALID))
def test_valid_input_is_accepted_and_arrives_intact(stack, call):
    client, user_id, message_id = stack.client, call["user_id"], call["message_id"]
    queued = client.redis.llen(keys.EXTRACT_QUEUE)
    known = message_id is not None and bool(client.redis.exists(keys.status(user_id, message_id)))
    receipt = client.enqueue(**call)
    # A message id seen before is the same message again: idempotent, not queued twice.
    assert (receipt.user_id, receipt.duplicate) == (user_id, known)
    assert message_id is None or receipt.message_id == message_id
    assert client.redis.llen(keys.EXTRACT_QUEUE) == queued + (0 if known else 1)
    if known:
        return
    stored = Envelope.model_validate_json(client.redis.get(keys.message_payload(user_id, receipt.message_id)))
    messages = call["messages"]
    sent = [{"content": messages}] if isinstance(messages, str) else messages
    assert stored.messages == [ChatMessage(**m) for m in sent]
    assert stored.metadata == (call["metadata"] or {})
    timestamp = call["timestamp"]
    assert timestamp is None or (stored.timestamp == timestamp and stored.timestamp.tzinfo == UTC)
    assert client.redis.hget(keys.status(user_id, receipt.message_id), "state") == MessageState.QUEUED


@PROPERTY
@given(call=st.fixed_dictionaries(VALID), field=st.sampled_from(list(JUNK)), data=st.data())
def test_any_input_is_either_rejected_cleanly_or_readable_by_the_workers(stack, call, field, data):
    """One argument replaced by junk or, as often, by a valid value drawn directly (junk alone is refused
    at the first check ~9 times in 10, so the "readable" half would hardly ever run)."""
    client = stack.client
    call = {**call, field: data.draw(st.one_of(JUNK[field], VALID[field]), label=field)}
    before = Snapshot.take(client)
    try:
        receipt = client.enqueue(**call)
    except InvalidInputError as exc:
        event("rejected")
        assert names_field(exc.field, field), exc.field
        assert Snapshot.take(client) == before
        return
    event("accepted")
    # The extract stage reads the payload back with this very call: what was accepted must parse.
    Envelope.model_validate_json(client.redis.get(keys.message_payload(receipt.user_id, receipt.message_id)))


# -------------------------------------------------------------------------------------------- reader


@pytest.mark.parametrize("user_id", BAD_USER_IDS, ids=_label)
@pytest.mark.parametrize("api", API_CALLS)
def test_every_api_rejects_bad_user_ids(stack, api, user_id):
    call, field = API_CALLS[api]
    assert_rejected(stack.client, lambda: call(stack.client, user_id), field)


@pytest.mark.parametrize(
    ("call", "field", "value"),
    [
        pytest.param(call, field, value, id=f"{name}.{field}={_label(value)}")
        for name, call, field, values in READER_CASES
        for value in values
    ],
)
def test_reader_rejects_bad_arguments(reading, call, field, value):
    assert_rejected(reading.client, lambda: call(reading, value), field)


@PROPERTY
@given(
    user_id=st.sampled_from([VICTIM, NEIGHBOUR]) | VALID["user_id"],
    query=st.sampled_from(["'; MATCH (n) DETACH DELETE n //", "`) RETURN *", "* OR 1=1", "../.."])
    | st.sampled_from(["where do I live?", "Austin", "who works at Google or Amazon?", "my brother", "sister"])
    | CONTENT,
)
def test_valid_reads_answer_and_only_with_the_users_own_memory(stack, user_id, query):
    """Two users with memory in the store, both of Austin, relatives and employers (queries about those
    included), so a read that mixes users would return the other one's facts or excerpts."""
    client = stack.client
    graph_before = Snapshot.take(client).users
    facts = client.get_graph(user_id, page_size=1000).facts
    owned = {f.id for f in facts}
    assert bool(owned) == (user_id in (VICTIM, NEIGHBOUR))
    chunks = {v.node_id for v in client.graph.vectors(user_id)[0] if v.kind == "episode"}
    recalled = client.recall(user_id, query, k=5)
    assert recalled.user_id == user_id and {i.id for i in recalled.items} <= owned | chunks
    assert {i.id for i in client.search(user_id, query, detail_level="detailed").facts} <= owned | chunks
    assert {f.id for f in client.history(user_id, query)} <= owned
    assert {f.id for f in client.history(user_id, "user")} <= owned
    assert client.stats(user_id).facts == len(owned)
    assert Snapshot.take(client).users == graph_before


# ----------------------------------------------------------------------------------------------- CLI

CLI_CASES = [
    (["enqueue", "../x", "hello"], None, "user_id"),
    (["enqueue", "x' OR 1=1", "hello"], None, "user_id"),
    (["enqueue", "", "hello"], None, "user_id"),
    (["enqueue", "writer", ""], None, "messages"),
    (["enqueue", "writer", "   "], None, "messages"),
    (["enqueue", "writer", "a\x00b"], None, "messages"),
    (["enqueue", "writer", "\ud800"], None, "messages"),
    (["enqueue", "writer", "x" * (MAX_CHARS + 1)], None, "messages"),
    (["enqueue", "writer", "-"], "a\x00b", "messages"),
    (["enqueue", "writer", "hi", "--timestamp", "2024-13-01T00:00:00"], None, "timestamp"),
    (["enqueue", "writer", "hi", "--timestamp", "yesterday"], None, "timestamp"),
    (["enqueue", "writer", "hi", "--message-id", "../m"], None, "message_id"),
    (["enqueue", "--file", "-"], '{"user_id": "writer", "text": "ok"}\n{"user_id": "../x", "text": "hi"}\n', "line 2"),
    (["enqueue", "--file", "-"], "not json\n", "line 1"),
    (["enqueue", "--file", "-"], '{"user_id": "writer", "text": "hi", "metadata": {"k": NaN}}\n', "line 1"),
    (["recall", "../x", "where do I live?"], None, "user_id"),
    (["recall", "`) DETACH DELETE n //", "where do I live?"], None, "user_id"),
    (["recall", VICTIM, ""], None, "query"),
    (["recall", VICTIM, "\ud800"], None, "query"),
    (["recall", VICTIM, "where do I live?", "--as-of", "garbage"], None, "as_of"),
]


def run_cli(stack: Stack, args: list[str], stdin: str | None = None) -> Result:
    return CliRunner(env=stack.env).invoke(cli, args, input=stdin)


@pytest.mark.parametrize(("args", "stdin", "field"), CLI_CASES, ids=[_label(c[0]) for c in CLI_CASES])
def test_cli_rejects_bad_input_with_one_line_naming_the_field(stack, args, stdin, field):
    before = Snapshot.take(stack.client)
    result = run_cli(stack, args, stdin)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    match = re.fullmatch(r"error: invalid (.+?): .*", line, flags=re.DOTALL)
    assert match and names_field(match.group(1), field), line
    assert "\n" not in line and "Traceback" not in result.output
    assert Snapshot.take(stack.client) == before


def test_cli_accepts_valid_input(stack):
    client = stack.client
    queued = client.redis.llen(keys.EXTRACT_QUEUE)
    result = run_cli(stack, ["enqueue", "writer", "I live in Austin.", "--message-id", "cli-1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["receipts"][0]["message_id"] == "cli-1"
    assert client.redis.llen(keys.EXTRACT_QUEUE) == queued + 1
    assert client.redis.exists(keys.message_payload("writer", "cli-1"))

    result = run_cli(stack, ["recall", VICTIM, "where does the user live?", "--json"])
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["items"]
    chunks = {v.node_id for v in client.graph.vectors(VICTIM)[0] if v.kind == "episode"}
    assert items and {i["id"] for i in items} <= {f.id for f in client.get_graph(VICTIM).facts} | chunks
