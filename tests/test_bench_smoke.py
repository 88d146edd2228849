"""The benchmark runner works end to end on its smallest slice: it starts its own Redis, prints the
table and writes valid JSON with the documented keys. No timing is asserted (times are machine noise)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engram_api.producer import build_envelope
from engram_api.settings import Settings

REPO = Path(__file__).resolve().parents[1]
RESULT_KEYS = {"bench", "mode", "started_at", "seconds", "machine", "summary", "tables", "notes"}


def test_quick_enqueue_benchmark_prints_a_table_and_writes_json(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "ops" / "bench" / "run.py"),
            "--quick",
            "--only",
            "enqueue",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "enqueue latency" in done.stdout and "redis-py LPUSH (baseline)" in done.stdout

    result = json.loads((tmp_path / "enqueue.json").read_text())
    assert set(result) == RESULT_KEYS
    assert result["bench"] == "enqueue" and result["mode"] == "quick"
    assert result["machine"]["nproc"] >= 1
    summary = result["summary"]
    assert summary["n"] == 2_000
    for dist in (summary["enqueue_ms"], summary["lpush_ms"]):
        assert dist["n"] == 2_000 and 0 < dist["p50"] <= dist["p99"]
    assert summary["ratio_p50"] > 0 and summary["payload_bytes"] > 0
    assert isinstance(summary["target_p99_met"], bool) and isinstance(summary["target_ratio_met"], bool)
    # The producer's Lua registration and the Celery publish both reach Redis.
    assert summary["redis_commands_per_enqueue"]["evalsha"] == 1 and summary["redis_commands_per_enqueue"]["lpush"] >= 1
    assert result["tables"][0]["title"].startswith("enqueue latency")

    latest = json.loads((tmp_path / "latest.json").read_text())
    assert latest["failed"] == {} and set(latest["results"]) == {"enqueue"}
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def test_quality_without_its_data_sets_says_where_they_go_and_exits_0(tmp_path):
    empty = tmp_path / "no-datasets"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", "bench", "--quick", "--only", "quality",
         "--datasets", str(empty), "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = " ".join(done.stdout.split())  # rich wraps long paths
    assert "quality skipped" in text and "--datasets" in text
    for name in ("locomo_dev5.json", "sample_20.json"):
        assert name in text
    latest = json.loads((tmp_path / "out" / "latest.json").read_text())
    assert latest["skipped"] == ["quality"] and latest["results"] == {} and latest["failed"] == {}


def test_llm_quality_bench_refuses_to_run_without_the_users_model(tmp_path):
    """``--llm`` spends the user's tokens: it runs the quality bench only, and only with LLM_MODEL set."""
    env = {k: v for k, v in os.environ.items() if k != "LLM_MODEL"}
    for args in (["--only", "quality", "--llm"], ["--only", "enqueue", "--llm"]):
        done = subprocess.run(
            [sys.executable, str(REPO / "ops" / "bench" / "run.py"), *args, "--out", str(tmp_path)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and "--llm needs --only quality and LLM_MODEL set" in done.stderr


def test_llm_quality_bench_sends_speakers_owner_and_earlier_turns():
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    locomo = importlib.import_module("quality_locomo")
    conversation = {
        "speaker_a": "Caroline",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Caroline" if i % 2 else "Melanie", "dia_id": f"D1:{i}", "text": f"turn {i}"}
            for i in range(1, 10)
        ],
    }
    turns = locomo.session_turns(conversation)
    items = locomo.ingest_items("u1", "Caroline", turns, 0, True)
    last = build_envelope(Settings(), **dict(items[-1]))
    assert last.owner_name == "Caroline" and last.messages[0].name == "Caroline"
    assert [m.content for m in last.earlier] == [f"turn {i}" for i in range(3, 9)]
    assert last.earlier[0].name == "Caroline" and last.earlier[1].name == "Melanie"
    assert locomo.ingest_items("u1", "Caroline", turns, 0, False)[0]["messages"] == "turn 1"


def test_quality_bench_runs_the_chosen_conversations_and_names_an_unknown_one():
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    locomo = importlib.import_module("quality_locomo")
    benchlib = importlib.import_module("benchlib")
    data = [{"sample_id": s} for s in ("conv-26", "conv-30", "conv-43")]

    def chosen(quick: bool, conversations: tuple[str, ...] = ()) -> list[str]:
        ctx = benchlib.BenchContext(quick=quick, services=None, workdir=REPO, console=None)  # type: ignore[arg-type]
        ctx.conversations = conversations
        return [c["sample_id"] for c in locomo.chosen_conversations(ctx, data)]

    assert chosen(True) == ["conv-30"]
    assert chosen(False) == ["conv-26", "conv-30", "conv-43"]
    assert chosen(True, ("conv-43",)) == ["conv-43"]
    with pytest.raises(ValueError, match="conv-99"):
        chosen(False, ("conv-43", "conv-99"))
