"""What a newcomer meets on the embedded default: reads and export with the fleet stopped, calls that never
load the embedding model, health rows that each name their own cause, honest wait timeouts, one date rule.
Real Redis and SQLite; no workers (nothing here needs them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from engram_api import keys
from engram_api.models import Envelope
from engram_workers import cli
from tests.support.memory import apply_in_process
from tests.support.stack import engram_stack

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def stack(redis_url, tmp_path_factory):
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("local"), neo4j_uri=None, llm_url=None, workers=False
    ) as s:
        user = f"l_{uuid.uuid4().hex[:10]}"
        for i, text in enumerate(["I live in Tampa.", "I like hiking."]):
            apply_in_process(s.client, user, f"{user}-m{i}", text, T0 + timedelta(days=i))
        s.user = user  # type: ignore[attr-defined]
        yield s


def stopped_fleet_env(stack) -> dict[str, str | None]:
    """The embedded default with `engram up` not running: no REDIS_URL, no services.json."""
    return {"REDIS_URL": None, "ENGRAM_DATA_DIR": str(stack.data_dir), "NEO4J_URI": None, "LLM_MODEL": None}


def test_reads_and_export_work_on_a_stopped_embedded_fleet(stack):
    env, runner = stopped_fleet_env(stack), CliRunner()
    assert not (stack.data_dir / "services.json").exists()
    stats = runner.invoke(cli.main, ["stats", stack.user, "--json"], env=env)
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["facts"] == 2
    recall = runner.invoke(cli.main, ["recall", stack.user, "where does the user live?", "--json"], env=env)
    assert recall.exit_code == 0 and json.loads(recall.stdout)["items"][0]["statement"] == "User lives in Tampa"
    export = runner.invoke(cli.main, ["export", stack.user], env=env)
    assert export.exit_code == 0 and json.loads(export.stdout.splitlines()[0])["episodes"] == 2


def test_calls_that_do_not_embed_never_load_the_embedding_model(stack):
    code = f"""
import json, sys
from click.testing import CliRunner
from engram_api import MemoryClient
from engram_workers import cli
c = MemoryClient()
c.stats({stack.user!r}); c.history({stack.user!r}, "user"); c.get_graph({stack.user!r}); list(c.export_memory({stack.user!r}))
report = c.health()
done = CliRunner().invoke(cli.main, ["reindex", "--user", {stack.user!r}, "--json"])
print(json.dumps({{"reindex": done.exit_code, "embedder": report.checks["embedder"].model_dump(),
                   "mods": sorted(m for m in ("torch", "sentence_transformers", "onnxruntime") if m in sys.modules)}}))
"""
    env = {k: v for k, v in stack.env.items() if v}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO, env={**_base_env(), **env}
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["reindex"] == 0 and report["embedder"]["ok"], report
    assert report["mods"] == [], "a call that embeds nothing loaded the model"


@pytest.mark.parametrize(
    ("args", "not_imported"),
    [
        # Counts and fact rows: one SQLite query each; no reader, no vectors, no Redis, no model.
        (["stats", "{user}"], ("engram_api.reader", "numpy", "faiss", "onnxruntime", "redis")),
        (["history", "{user}"], ("engram_api.reader", "numpy", "faiss", "onnxruntime", "redis")),
        # Recall embeds (ONNX, exported already) and searches FAISS; the stopped fleet has no Redis to ask.
        (["recall", "{user}", "where does the user live?"], ("redis", "engram_api.producer")),
    ],
    ids=["stats", "history", "recall"],
)
def test_reads_on_a_stopped_fleet_import_only_what_they_use(stack, args, not_imported):
    argv = [a.format(user=stack.user) for a in args]
    never = ("torch", "sentence_transformers", "celery", "kombu", "litellm", "neo4j", "engram_workers.tasks")
    code = f"""
import json, sys
from click.testing import CliRunner
from engram_workers import cli
done = CliRunner().invoke(cli.main, [*{argv!r}, "--json"])
print(json.dumps({{"exit": done.exit_code, "mods": sorted(m for m in {(*never, *not_imported)!r} if m in sys.modules)}}))
"""
    env = {**_base_env(), **{k: v for k, v in stopped_fleet_env(stack).items() if v}}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"exit": 0, "mods": []}


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k not in ("REDIS_URL", "NEO4J_URI")}


def test_health_rows_each_name_their_own_cause(stack):
    result = CliRunner().invoke(cli.main, ["health", "--json"], env=stopped_fleet_env(stack))
    assert result.exit_code == 1
    checks = json.loads(result.stdout)["checks"]
    assert not checks["redis"]["ok"] and "REDIS_URL" in checks["redis"]["detail"]
    assert not checks["queues"]["ok"]
    # The embedder, the graph store and the index directory do not depend on Redis.
    for name in ("embedder", "graph_store", "index_dir"):
        assert checks[name]["ok"], (name, checks[name])
        assert "REDIS_URL" not in checks[name]["detail"]
    assert "dim=384" in checks["embedder"]["detail"]


def test_enqueue_wait_timeout_reports_the_time_it_waited(stack):
    env = {k: v for k, v in stack.env.items() if v}
    result = CliRunner().invoke(cli.main, ["enqueue", "waiter", "I live in Oslo.", "--wait", "--timeout", "1"], env=env)
    assert result.exit_code == 2
    waited = re.search(r"still pending after ([0-9.]+)s", result.stderr)
    assert waited is not None, result.stderr
    assert float(waited.group(1)) >= 1.0  # the time really spent waiting, not what was left of it


@pytest.fixture
def in_kolkata(monkeypatch):
    """The process's local zone is UTC+05:30 for the test (CI machines run in UTC, where local and UTC agree
    and reading a naive time as UTC would pass unseen)."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("given", ["2025-01-02", "2025-01-02T00:00", "2025-01-02T00:00:00"])
def test_dates_and_naive_times_on_the_command_line_are_local_time(stack, given, in_kolkata):
    env = {k: v for k, v in stack.env.items() if v}
    mid = f"when-{uuid.uuid4().hex[:8]}"
    done = CliRunner().invoke(
        cli.main, ["enqueue", "dater", "I live in Oslo.", "--message-id", mid, "--timestamp", given], env=env
    )
    assert done.exit_code == 0, done.output
    stored = Envelope.model_validate_json(stack.client.redis.get(keys.message_payload("dater", mid)))
    # Midnight in Kolkata, written out independently of the code under test (no astimezone()).
    assert stored.timestamp == datetime(2025, 1, 1, 18, 30, tzinfo=UTC)


def test_the_default_data_directory_is_per_user_whatever_the_folder(tmp_path):
    elsewhere = tmp_path / "some" / "project"
    elsewhere.mkdir(parents=True)
    env = {k: v for k, v in _base_env().items() if k != "XDG_DATA_HOME"} | {"HOME": str(tmp_path)}
    code = "from engram_api.settings import Settings; print(Settings().data_dir)"
    for cwd in (tmp_path, elsewhere):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, check=True)
        assert Path(out.stdout.strip()) == tmp_path / ".local" / "share" / "engram"


def test_search_broad_without_clusters_falls_back_to_facts_with_a_note(stack):
    result = stack.client.search(stack.user, "where does the user live?", detail_level="broad")
    assert result.level == "detailed" and result.facts and "no topic clusters" in result.note
    env = {k: v for k, v in stack.env.items() if v}
    shown = CliRunner().invoke(cli.main, ["search", stack.user, "hiking", "--detail", "broad"], env=env)
    text = " ".join(shown.stdout.split())  # however the table wraps
    assert shown.exit_code == 0 and "hiking" in text and "no topic clusters" in text


def test_context_with_too_small_a_budget_says_how_much_the_best_fact_needs(stack):
    env = {k: v for k, v in stack.env.items() if v}
    runner = CliRunner()
    small = runner.invoke(cli.main, ["context", stack.user, "where does the user live?", "--max-tokens", "5"], env=env)
    assert small.exit_code == 0
    needed = re.search(r"nothing fits in --max-tokens 5; the most relevant line needs about (\d+)", small.stdout)
    assert needed is not None, small.stdout
    enough = runner.invoke(
        cli.main, ["context", stack.user, "where does the user live?", "--max-tokens", needed.group(1)], env=env
    )
    assert "User lives in Tampa" in enough.stdout
