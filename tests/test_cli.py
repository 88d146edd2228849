"""The `engram` command line: in-process (click's CliRunner) where no service is needed, real processes
(the console script, real Redis, real workers) where one is."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner, Result
from pydantic import AliasChoices

from engram_api import keys
from engram_api.ledger import DeadLetterStore
from engram_api.models import DeadLetter
from engram_api.producer import build_envelope
from engram_api.settings import Settings
from engram_testing.llm_standin import LLMStandin, Reply
from engram_workers import cli
from engram_workers.cli import memory
from engram_workers.cli._output import clip, count
from engram_workers.cli.demo import load_sample
from engram_workers.extraction.rules import extract_rules
from tests.support.gateway import free_port
from tests.support.operator_processes import SERVICE_VARS, clean_env
from tests.support.stack import SETTLE_S, Stack, engram_stack

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
# Recent dates for stored facts: decay measures age from when a fact was said, and a maintenance test
# below runs decay on this user.
LIVED_IN_TAMPA = (datetime.now(UTC) - timedelta(days=60)).replace(microsecond=0)
MOVED_TO_AUSTIN = LIVED_IN_TAMPA + timedelta(days=40)


def runner_env(**extra: str) -> dict[str, str | None]:
    """For CliRunner: unset every Engram variable of this process, then set ``extra``."""
    env: dict[str, str | None] = {k: None for k in os.environ if k in SERVICE_VARS or k.startswith("ENGRAM_")}
    env.update(extra)
    return env


def invoke(args: list[str], env: Mapping[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli.main, args, env=env, catch_exceptions=False)


def engram_threads() -> list[str]:
    """The Engram threads alive in this process: an in-process command must leave none of its own behind."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("engram-") and t.is_alive())


def engram(
    args: list[str], env: Mapping[str, str], *, timeout: float = 180, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The console script's code, as a real process (python -m: no dependence on PATH)."""
    return subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        input=stdin,
    )


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def uid() -> str:
    return f"cli_{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------------------- no services needed


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


ALL_COMMANDS = list(_commands(cli.main))


def test_the_cli_has_every_command_of_the_brief() -> None:
    names = {" ".join(c) for c in ALL_COMMANDS}
    expected = {
        "demo", "worker", "beat", "flower", "up", "enqueue", "recall", "search", "context", "history", "graph",
        "stats", "forget", "forget-user", "health", "dlq list", "dlq replay", "dlq drop", "maintenance decay",
        "maintenance hierarchy", "maintenance weights", "maintenance reconcile", "maintenance reembed", "reindex",
        "export",
    }  # fmt: skip
    assert expected <= names


@pytest.mark.parametrize("command", [(), *ALL_COMMANDS], ids=lambda c: " ".join(c) or "engram")
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    result = invoke([*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout
    assert result.stderr == ""


def test_the_console_script_is_the_cli() -> None:
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "engram"]
    assert script.load() is cli.main


def test_importing_the_cli_loads_nothing_heavy_and_help_answers() -> None:
    heavy = ("celery", "torch", "litellm", "numpy", "faiss", "neo4j", "engram_api", "rich")
    code = f"import sys, engram_workers.cli; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "[]"
    helped = engram(["--help"], clean_env(), timeout=60)
    assert helped.returncode == 0 and "demo" in helped.stdout


def test_counts_agree_with_their_number_and_long_lines_are_cut_between_words() -> None:
    assert [count(n, "fact") for n in (0, 1, 2)] == ["0 facts", "1 fact", "2 facts"]
    assert count(1, "entity", "entities") == "1 entity" and count(3, "entity", "entities") == "3 entities"
    reason = "LLM answer was not valid JSON: Expecting property name enclosed in double quotes at line 1"
    assert clip(reason, 40) == "LLM answer was not valid JSON:…"  # "Expecting" would need 41
    assert clip(reason, 41) == "LLM answer was not valid JSON: Expecting…"
    assert clip(reason, 200) == reason and clip("first\nsecond", 200) == "first…"
    assert clip("x" * 50, 10) == "x" * 9 + "…"  # one long word: cut where the room ends


def test_a_demo_scene_that_contradicts_its_caption_fails_loudly() -> None:
    from engram_workers.cli.demo import SceneError, _claim

    _claim(True, "2", "holds")
    with pytest.raises(SceneError, match="scene 2 does not show what it claims: Alex works at Amazon") as err:
        _claim(False, "2", "Alex works at Amazon")
    assert err.value.exit_code == 1


def test_context_help_says_excerpts_come_too() -> None:
    help_text = " ".join(invoke(["context", "--help"]).stdout.split())
    assert "current facts, then dated conversation excerpts" in help_text
    assert "excerpts" in " ".join(invoke(["--help"]).stdout.split())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["recall", "bad user!", "where"], "invalid user_id"),
        (["recall", "alice", "where", "-k", "0"], "-k"),
        (["recall", "alice", "where", "--as-of", "last tuesday"], "invalid as_of"),
        (["search", "alice", "where", "--detail", "medium"], "--detail"),
        (["enqueue"], "USER_ID TEXT or --file"),
        (["enqueue", "alice", "hi", "--timestamp", "noon"], "invalid timestamp"),
        (["enqueue", "alice", "   "], "invalid messages"),
        (["dlq", "replay", "alice"], "USER_ID MESSAGE_ID"),
        (["maintenance", "decay", "--user", "bad user!"], "invalid user_id"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    # A closed port: any attempt to reach Redis would fail differently from the expected error.
    result = invoke(args, runner_env(REDIS_URL="redis://127.0.0.1:1/0", ENGRAM_DATA_DIR=str(tmp_path)))
    assert result.exit_code == 2, result.output
    assert expected in one_error_line(result.stderr)
    assert result.stdout == ""


def test_a_bad_line_in_an_enqueue_file_enqueues_nothing(tmp_path: Path) -> None:
    lines = [
        {"user_id": "alice", "text": "I live in Tampa."},
        {"user_id": "alice", "messages": [{"role": "user", "content": "I like tea."}]},
        {"text": "no user id here"},
    ]
    path = tmp_path / "messages.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = runner_env(REDIS_URL="redis://127.0.0.1:1/0", ENGRAM_DATA_DIR=str(tmp_path))
    result = invoke(["enqueue", "--file", str(path)], env)
    assert result.exit_code == 2
    assert "line 3.user_id" in one_error_line(result.stderr)


def test_a_bad_setting_names_its_variable(tmp_path: Path) -> None:
    result = invoke(["stats", "alice"], runner_env(ENGRAM_MAX_HOPS="99", ENGRAM_DATA_DIR=str(tmp_path)))
    assert result.exit_code == 2
    assert "ENGRAM_MAX_HOPS" in one_error_line(result.stderr)


@pytest.mark.parametrize("command", [["worker"], ["worker", "--stage", "apply"], ["beat"], ["flower"]])
def test_the_service_commands_refuse_a_bad_setting_before_starting(command: list[str], tmp_path: Path) -> None:
    result = invoke(command, runner_env(ENGRAM_MAX_HOPS="99", ENGRAM_DATA_DIR=str(tmp_path)))
    assert result.exit_code == 2
    assert "ENGRAM_MAX_HOPS" in one_error_line(result.stderr)


def test_worker_needs_a_queue_and_beat_needs_redis(tmp_path: Path) -> None:
    before = engram_threads()
    no_queue = invoke(["worker", "--queues", " , "], runner_env(ENGRAM_DATA_DIR=str(tmp_path)))
    assert no_queue.exit_code == 2 and "--queues" in one_error_line(no_queue.stderr)
    for command in (["beat"], ["worker", "--stage", "apply"]):
        no_redis = invoke(command, runner_env(ENGRAM_DATA_DIR=str(tmp_path)))
        assert no_redis.exit_code == 2 and "REDIS_URL" in one_error_line(no_redis.stderr), command
    # Refused before the liveness heartbeat starts: no probe may read a process that is not going to run.
    assert engram_threads() == before


def test_no_redis_configured_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    result = invoke(["dlq", "list"], runner_env(ENGRAM_DATA_DIR=str(tmp_path)))
    assert result.exit_code == 2
    assert "REDIS_URL" in one_error_line(result.stderr)


def test_an_unexpected_error_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(memory, "open_client", broken)
    result = invoke(["stats", "alice"], runner_env(ENGRAM_DATA_DIR=str(tmp_path)))
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == "error: RuntimeError: disk on fire"


def test_docker_compose_config_passes(tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    assert compose is not None, "docker-compose is not installed (apt-get install docker-compose)"
    shutil.copy(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    done = subprocess.run(
        [compose, "-f", "docker-compose.yml", "config", "-q"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (REPO / "ops" / "Dockerfile").is_file()


def test_env_example_documents_every_setting() -> None:
    text = (REPO / ".env.example").read_text()
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        variable = str(alias.choices[0]) if isinstance(alias, AliasChoices) else f"ENGRAM_{name.upper()}"
        assert f"{variable}=" in text, f"{variable} is missing from .env.example"


def test_the_demo_conversation_is_understood_by_the_offline_extractor() -> None:
    sample = load_sample()
    texts = [m for s in sample["sessions"] for m in s["messages"]]
    assert 20 <= len(texts) <= 30 and len(sample["sessions"]) >= 4
    facts = [f for t in texts for f in extract_rules(t, event_time=T0).facts]
    statements = {f.statement for f in facts}
    for expected in (
        "User lives in Tampa",
        "User lives in Austin",
        "User works at Raymond James",
        "User works at Dell",
        "User has a brother named Alex",
        "Alex works at Amazon",
        "User speaks Spanish",
    ):
        assert expected in statements
    assert len(facts) >= 25


# --------------------------------------------------------------------------------- real services


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Redis (a database of its own), SQLite, offline extractor, an extract and an apply worker."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path_factory.mktemp("cli"), neo4j_uri=None, llm_url=None) as s:
        yield s


@pytest.fixture(scope="module")
def env(stack: Stack) -> dict[str, str]:
    return clean_env(**stack.env)


@pytest.fixture(scope="module")
def moved_user(stack: Stack, env: dict[str, str]) -> str:
    """A user who lived in Tampa, moved to Austin and has a brother at Amazon, fed through `engram enqueue`."""
    user = uid()
    first = engram(
        ["enqueue", user, "I live in Tampa.", "--timestamp", LIVED_IN_TAMPA.isoformat(), "--wait", "--json"], env
    )
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["wait"]["applied"]
    lines = [
        {"user_id": user, "text": "I just moved to Austin.", "timestamp": MOVED_TO_AUSTIN.isoformat()},
        {"user_id": user, "text": "My brother Alex works at Amazon.", "message_id": f"{user}-brother"},
    ]
    rest = engram(
        ["enqueue", "--file", "-", "--wait", "--json"], env, stdin="".join(json.dumps(x) + "\n" for x in lines)
    )
    assert rest.returncode == 0, rest.stderr
    assert len(json.loads(rest.stdout)["wait"]["applied"]) == 2
    return user


def test_health_json_against_real_redis(env: dict[str, str]) -> None:
    done = engram(["health", "--json"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert {"graph_store", "redis", "embedder", "index_dir", "queues"} <= set(report["checks"])


def test_health_exits_1_when_redis_is_down(stack: Stack) -> None:
    result = invoke(
        ["health", "--json"],
        runner_env(REDIS_URL="redis://127.0.0.1:1/0", ENGRAM_DATA_DIR=stack.env["ENGRAM_DATA_DIR"]),
    )
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["checks"]["redis"]["ok"] is False


def test_health_pings_a_configured_llm(stack: Stack) -> None:
    with LLMStandin() as llm:
        llm_env = {"LLM_MODEL": "openai/standin", "LLM_API_BASE": llm.url, "LLM_API_KEY": "test-key"}
        env = runner_env(**{**stack.env, **llm_env, "ENGRAM_LLM_TIMEOUT_S": "5"})
        healthy = invoke(["health", "--json"], env)
        assert healthy.exit_code == 0, healthy.output
        assert json.loads(healthy.stdout)["checks"]["llm"]["ok"] is True
        assert llm.calls == 1

        llm.script(lambda request: Reply.error(500))
        sick = invoke(["health", "--json"], env)
        assert sick.exit_code == 1
        assert json.loads(sick.stdout)["checks"]["llm"]["ok"] is False

        # Issue 44, finding 9: a provider that echoes the configured key (of no known shape) in its error.
        key = "standin-key-Zq8vN2rT5wX1yB4c"
        llm.script(lambda request: Reply.error(401, f"Incorrect API key provided: {key}. Find your key at ..."))
        for args in (["health", "--json"], ["health"]):
            echoed = invoke(args, {**env, "LLM_API_KEY": key})
            assert echoed.exit_code == 1 and key not in echoed.output and "***" in echoed.output, echoed.output


def test_config_errors_never_echo_a_password() -> None:
    """Issue 44, finding 9: a malformed URL is quoted with its user and password masked, a secret not at all."""
    for name, value, shown in (
        ("REDIS_URL", "redis:/default:hunter2-pw@cache:6379/0", "***@cache:6379/0"),
        ("NEO4J_URI", "http://neo4j:hunter2-pw@graph:7474", "http://***@graph:7474"),
        ("ENGRAM_FLOWER_PASSWORD", "change-me", "(value not shown)"),
    ):
        done = engram(["stats", "x"], clean_env(**{name: value}))
        assert done.returncode == 2 and done.stderr.startswith(f"error: {name}: "), done.stderr
        assert shown in done.stderr and value.split("@")[0] not in done.stderr, done.stderr


def test_recall_through_the_console_script_shows_supersession(moved_user: str, env: dict[str, str]) -> None:
    done = engram(["recall", moved_user, "where does the user live?", "--json"], env)
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    assert "Austin" in items[0]["statement"]
    assert not any(i["statement"] == "User lives in Tampa" for i in items)
    before_move = (MOVED_TO_AUSTIN - timedelta(days=1)).date().isoformat()
    past = engram(["recall", moved_user, "where does the user live?", "--as-of", before_move, "--json"], env)
    assert json.loads(past.stdout)["items"][0]["statement"] == "User lives in Tampa"


@pytest.mark.parametrize(
    ("args", "check"),
    [
        (
            ["history", "{u}", "user", "-p", "LIVES_IN"],
            lambda out: [f["valid_until"] is None for f in out] == [False, True],
        ),
        (["graph", "{u}", "--page-size", "2"], lambda out: out["total_facts"] >= 4 and len(out["facts"]) == 2),
        (["stats", "{u}"], lambda out: out["superseded_facts"] == 1 and out["usage"]["prompt_tokens"] == 0),
        (["search", "{u}", "brother", "--detail", "detailed"], lambda out: out["level"] == "detailed" and out["facts"]),
        (["context", "{u}", "where does the user live?"], lambda out: "Austin" in out["context"]),
        (
            ["recall", "{u}", "what company does my brother work for?", "-k", "3"],
            lambda out: any("Amazon" in i["statement"] for i in out["items"]),
        ),
        (["dlq", "list", "--user", "{u}"], lambda out: out == []),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_read_commands_print_json(moved_user: str, stack: Stack, args: list[str], check) -> None:  # type: ignore[no-untyped-def]
    result = invoke([a.format(u=moved_user) for a in args] + ["--json"], runner_env(**stack.env))
    assert result.exit_code == 0, result.output
    assert check(json.loads(result.stdout))


@pytest.mark.parametrize("args", [["recall", "{u}", "where?"], ["stats", "{u}"], ["history", "{u}", "user"]])
def test_reads_with_the_graph_store_down_are_one_error_line(moved_user: str, stack: Stack, args: list[str]) -> None:
    env = runner_env(**{**stack.env, "NEO4J_URI": "bolt://127.0.0.1:1"})
    result = invoke([a.format(u=moved_user) for a in args], env)
    assert result.exit_code == 2, result.output
    assert "Neo4j at bolt://127.0.0.1:1 is unavailable" in one_error_line(result.stderr)
    assert result.stdout == ""


def test_read_commands_print_tables_for_people(moved_user: str, stack: Stack) -> None:
    result = invoke(["history", moved_user, "user", "--predicate", "LIVES_IN"], runner_env(**stack.env))
    assert result.exit_code == 0
    assert "Tampa" in result.stdout and "Austin" in result.stdout and "current" in result.stdout
    latest = invoke(["history", moved_user, "user", "-p", "LIVES_IN", "--limit", "1"], runner_env(**stack.env))
    assert latest.exit_code == 0 and "Austin" in latest.stdout and "Tampa" not in latest.stdout  # the latest one


def test_export_writes_json_lines_of_every_fact(moved_user: str, stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "backup.jsonl"
    result = invoke(["export", moved_user, "-o", str(out)], runner_env(**stack.env))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    header, facts = rows[0], [r for r in rows if r["type"] == "fact"]
    assert header["format"] == "engram-export" and header["facts"] == len(facts)
    assert {"User lives in Tampa", "User lives in Austin"} <= {f["statement"] for f in facts}
    assert all("embedding" not in r for r in rows)


def test_dlq_list_replay_and_drop(stack: Stack) -> None:
    user = uid()
    store = DeadLetterStore(redis_client=stack.client.redis, status_ttl_s=600)
    for mid in ("m-replay", "m-drop"):
        envelope = build_envelope(stack.settings, user, "I live in Lisbon.", message_id=mid, timestamp=T0)
        store.put(DeadLetter(user_id=user, message_id=mid, stage="extract", reason="boom", envelope=envelope))
    env = runner_env(**stack.env)
    listed = invoke(["dlq", "list", "--user", user, "--json"], env)
    assert sorted(d["message_id"] for d in json.loads(listed.stdout)) == ["m-drop", "m-replay"]

    replayed = invoke(["dlq", "replay", user, "m-replay"], env)
    assert replayed.exit_code == 0 and replayed.stdout == "replayed 1 message\n"
    assert stack.client.wait([(user, "m-replay")], timeout=SETTLE_S).applied == ["m-replay"]
    dropped = invoke(["dlq", "drop", user, "m-drop", "--json"], env)
    assert json.loads(dropped.stdout) == {"dropped": [f"{user}:m-drop"]}
    assert json.loads(invoke(["dlq", "list", "--user", user, "--json"], env).stdout) == []
    again = invoke(["dlq", "drop", user, "m-drop"], env)
    assert again.exit_code == 2 and "no dead letter" in one_error_line(again.stderr)


def test_ledger_reindex_moves_old_dead_letters_and_indexes_old_keys(stack: Stack) -> None:
    """After an upgrade: a letter of the old single hash and a status in no index are found once it ran."""
    user, r = uid(), stack.client.redis
    envelope = build_envelope(stack.settings, user, "I live in Lisbon.", message_id="m-old", timestamp=T0)
    letter = DeadLetter(user_id=user, message_id="m-old", stage="extract", reason="boom", envelope=envelope)
    r.hset(keys.legacy_dead_letters(), keys.message_ref(user, "m-old"), letter.model_dump_json())
    r.hset(keys.status(user, "m-gone"), mapping={"state": "applied", "task_id": "t"})
    env = runner_env(**stack.env)
    assert json.loads(invoke(["dlq", "list", "--user", user, "--json"], env).stdout) == []
    done = invoke(["maintenance", "ledger-reindex", "--json"], env)
    report = json.loads(done.stdout)
    assert done.exit_code == 0 and report["dead_letters"] >= 1 and report["messages"] >= 1
    listed = json.loads(invoke(["dlq", "list", "--user", user, "--json"], env).stdout)
    assert [d["message_id"] for d in listed] == ["m-old"]
    assert r.zscore(keys.user_messages(user), "m-gone") is not None


def test_maintenance_jobs_and_reindex_run_in_process(moved_user: str, stack: Stack) -> None:
    env, stack_env = runner_env(**stack.env), clean_env(**stack.env)
    threads = engram_threads()

    def run(job: str) -> dict:
        result = invoke(["maintenance", job, "--user", moved_user, "--json"], env)
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["failed"] == [], report
        return report

    facts = json.loads(invoke(["graph", moved_user, "--json"], env).stdout)["facts"]
    assert facts and all(f["strength"] == 1.0 for f in facts)
    # The facts were said 20 to 60 days ago: recall reads them weaker, but none is due for archival yet
    # (0.98 a day falls below 0.05 after ~148 days), so decay reads and writes none of them.
    decay = run("decay")
    assert (decay["users"], decay["due"], decay["archived"]) == (1, 0, 0), decay
    stored = json.loads(invoke(["graph", moved_user, "--json"], env).stdout)["facts"]
    assert stored == facts, stored

    hierarchy = run("hierarchy")
    (clustered,) = hierarchy["per_user"]
    assert clustered["user_id"] == moved_user and clustered["facts"] >= 2, hierarchy

    weights = run("weights")  # a user run leaves the global scope alone; this user gave no feedback
    assert [(s["scope"], s["status"], s["samples"]) for s in weights["scopes"]] == [(moved_user, "kept", 0)]

    reconcile = run("reconcile")
    assert (reconcile["users"], reconcile["ok"] + reconcile["rebuilt"]) == (1, 1), reconcile
    rebuilt = json.loads(invoke(["reindex", "--user", moved_user, "--json"], env).stdout)
    assert rebuilt[0]["user_id"] == moved_user and rebuilt[0]["vectors"] > 0

    # The workers made the 3 chunks' vectors under the default policy: nothing to do, until it changes (in a
    # process of its own, as an operator would run it with another setting).
    assert (run("reembed")["chunks"], run("reembed")["context"]) == (0, "other_turn")
    args = ["maintenance", "reembed", "--user", moved_user, "--json"]
    dated = engram(args, {**stack_env, "ENGRAM_CHUNK_EMBED_CONTEXT": "dated"})
    assert dated.returncode == 0, dated.stderr
    report = json.loads(dated.stdout)
    assert (report["users"], report["chunks"], report["per_user"][0]["user_id"]) == (1, 3, moved_user), report
    assert run("reembed")["chunks"] == 3 and run("reembed")["chunks"] == 0  # back, then nothing left
    assert engram_threads() == threads  # each job closed its stores and stopped its erasure sweep


def test_forget_and_forget_user(stack: Stack, env: dict[str, str]) -> None:
    user = uid()
    for mid, text in (("m1", "I live in Oslo."), ("m2", "I like chess.")):
        assert engram(["enqueue", user, text, "--message-id", mid, "--wait"], env).returncode == 0
    cli_env = runner_env(**stack.env)
    forgot = json.loads(invoke(["forget", user, "m1", "--json"], cli_env).stdout)
    assert forgot["facts"] == 1
    statements = [f["statement"] for f in json.loads(invoke(["graph", user, "--json"], cli_env).stdout)["facts"]]
    assert statements == ["User likes chess"]
    assert invoke(["forget-user", user], cli_env).exit_code == 1  # asks first; no answer aborts
    erased = json.loads(invoke(["forget-user", user, "--yes", "--json"], cli_env).stdout)
    assert erased["facts"] == 1
    assert json.loads(invoke(["stats", user, "--json"], cli_env).stdout)["facts"] == 0


def _wait_for(path: Path, text: str, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        assert proc.poll() is None, path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} within {timeout}s:\n{path.read_text()}")


@pytest.mark.slow
def test_up_runs_the_embedded_topology_until_sigterm(tmp_path: Path) -> None:
    env = clean_env(ENGRAM_DATA_DIR=str(tmp_path / "data"))
    log = tmp_path / "up.log"
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engram_workers.cli", "up", "--no-beat", "--extract-concurrency", "4",
             "--apply-concurrency", "1", "--gateway", "--gateway-port", str(port)],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        _wait_for(log, "Engram is up", proc, timeout=180)
        services = tmp_path / "data" / "services.json"
        # The embedded Redis wants the password generated for this start; `up` never prints it.
        url = json.loads(services.read_text())["redis_url"]
        assert re.fullmatch(r"redis://:[A-Za-z0-9_-]{32}@127\.0\.0\.1:\d+/0", url), url
        assert url.split("@")[0].split(":")[-1] not in log.read_text()
        user = uid()
        # No REDIS_URL anywhere: the client finds the embedded Redis through services.json.
        assert engram(["enqueue", user, "I live in Austin.", "--wait"], env, timeout=120).returncode == 0
        recalled = engram(["recall", user, "where does the user live?", "--json"], env)
        assert json.loads(recalled.stdout)["items"][0]["statement"] == "User lives in Austin"
        # The gateway of `up --gateway` (local mode: no key configured, loopback only) reads the same memory.
        over_http = httpx.post(
            f"http://127.0.0.1:{port}/v1/users/{user}/recall", json={"query": "where does the user live?"}, timeout=60
        )
        assert over_http.json()["items"][0]["statement"] == "User lives in Austin"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()
        assert "stopped." in log.read_text()
        assert not services.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(900)  # an ONNX export on a loaded machine, then a load
def test_the_first_recall_on_a_machine_says_it_exports_the_model_once(tmp_path: Path) -> None:
    env = clean_env(ENGRAM_DATA_DIR=str(tmp_path / "data"), ENGRAM_MODEL_CACHE_DIR=str(tmp_path / "models"))
    said = []
    for _ in range(2):
        done = engram(["recall", "alice", "where do I live?"], env, timeout=600)
        assert done.returncode == 0, done.stderr
        said.append("exporting it to ONNX once" in done.stderr)
    assert said == [True, False], said  # one line on stderr the first time, none once it is kept


@pytest.mark.slow
@pytest.mark.timeout(900)  # the demo runs twice, each allowed 280 s: a hang guard above both
def test_demo_runs_offline_and_reruns_cleanly(tmp_path: Path) -> None:
    env = clean_env(ENGRAM_DATA_DIR=str(tmp_path / "engram-data"), COLUMNS="160")
    messages = sum(len(s["messages"]) for s in load_sample()["sessions"])
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "engram_workers.cli", "demo"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=280,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out = done.stdout
        assert f"{messages} messages applied, 0 dead-lettered" in out
        assert "-> User lives in Austin" in out
        assert ": User lives in Tampa (recall --as-of" in out
        # The demo checks each scene's claim itself (exit 1 otherwise); these say what a reader sees.
        assert "-> Alex works at Amazon (the question names neither Alex nor Amazon" in out
        dinner = out.partition("3. get_context")[2].partition("4. What it cost")[0]
        assert "User likes sushi" in dinner and "Good morning!" not in dinner and "I live in Tampa." not in dinner
        # 2b: recalled from the conversation itself; the rule extractor made no fact of that message
        # (whitespace folded: the console wraps the long line).
        flat = " ".join(out.split())
        assert "sourdough starter did not make it." in flat
        assert "the extractor made no fact of it; the message itself is a memory" in flat
        assert "0 LLM tokens" in out
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "engram-data" / "services.json").exists()
