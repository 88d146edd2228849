"""The benchmark runner works end to end on its smallest slice: it starts its own Redis, prints the
table and writes valid JSON with the documented keys. No timing is asserted (times are machine noise)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engram_api.producer import build_envelope
from engram_api.settings import Settings
from engram_testing.llm_standin import Reply, approx_tokens
from tests.support.extractions import message_text

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
    offline = [build_envelope(Settings(), **dict(i)) for i in locomo.ingest_items("u1", "Caroline", turns, 0, False)]
    assert offline[0].text == "turn 1" and offline[0].earlier == [] and offline[0].owner_name is None
    # Without an LLM the two turns before go along too: a chunk's vector carries the question it answers.
    assert [(m.name, m.content) for m in offline[-1].earlier] == [("Caroline", "turn 7"), ("Melanie", "turn 8")]


def test_the_context_table_has_the_answer_words_beside_the_evidence():
    """A rendering that fits more turns by cutting what they say must show as a loss: the quality bench
    reports, beside each context's evidence share, the share of questions whose answer words it holds."""
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    locomo = importlib.import_module("quality_locomo")
    conversation = {
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ana", "dia_id": "D1:1", "text": "I moved to Lisbon."}],
    }
    kept, text = locomo._packed([0], locomo.session_turns(conversation))
    assert kept == {"D1:1"} and text == "- [2023-05-08] Ana: I moved to Lisbon."
    nan = float("nan")
    rows = {"get_context": [(1.0, 1.0), (0.5, 0.0), (1.0, nan)], "naive RAG packed": [(0.5, 0.0)] * 3}
    sums = {(method, cat): r for method, r in rows.items() for cat in (1, "all")}
    coverage = {"turns": 1, "turns_with_facts": 0, "questions": 3, "questions_with_covered_evidence": 0}
    tables, summary = locomo._tables([{"sample_id": "conv-x"}], sums, coverage, "rules")
    assert tables[1].rows[-1] == ["all", 3, pytest.approx(2.5 / 3), 0.5, 0.5, 0.0]  # no answer: not counted
    assert summary["context_answer_words"]["multi-hop"] == {"get_context": 0.5, "naive RAG packed": 0.0}


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


# ------------------------------------------------------------------ engram bench --only quality --llm

# A LoCoMo-shaped conversation (quality_locomo.session_turns, run_locomo) and sample_20-shaped cases
# (bench_quality._sample20), written here: the real data sets are never copied into the repository.
TINY_LOCOMO = [
    {
        "sample_id": "conv-tiny",
        "conversation": {
            "speaker_a": "Caroline",
            "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "I moved to Lisbon last spring."},
                {"speaker": "Melanie", "dia_id": "D1:2", "text": "Nice! I paint landscapes every weekend."},
                {"speaker": "Caroline", "dia_id": "D1:3", "text": "Thanks!"},
                {"speaker": "Melanie", "dia_id": "D1:4", "text": "What do you do for fun?"},
            ],
        },
        "qa": [
            {"question": "Where did Caroline move to?", "answer": "Lisbon", "evidence": ["D1:1"], "category": 4},
            {"question": "What does Melanie paint?", "answer": "landscapes", "evidence": ["D1:2"], "category": 1},
            {"question": "Who asked about fun?", "answer": "Melanie", "evidence": ["D1:4"], "category": 4},
        ],
    }
]
TINY_SAMPLE20 = [
    {
        "id": "ku_001",  # ltm_script.STALE: "Tampa" must not be a current fact once Austin is
        "question_type": "knowledge_update",
        "question": "Where do I live now?",
        "answer": "Austin",
        "sessions": [
            {"session_id": "s1", "messages": [
                {"role": "user", "content": "I live in Tampa."}, {"role": "assistant", "content": "Noted."}]},
            {"session_id": "s2", "messages": [
                {"role": "user", "content": "I moved to Austin last week."}, {"role": "assistant", "content": "Big move!"}]},
        ],
    },
    {
        "id": "ssu_tiny",
        "question_type": "single_session_user",
        "question": "What is my favorite food?",
        "answer": "ramen",
        "sessions": [{"session_id": "s1", "messages": [{"role": "user", "content": "My favorite food is ramen."}]}],
    },
]  # fmt: skip
TINY_ANSWERS = {
    "I moved to Lisbon": {
        "entities": [{"ref": "N1", "name": "Lisbon", "label": "Place"}],
        "facts": [{"subject": "user", "predicate": "LIVES_IN", "object": "N1", "statement": "User lives in Lisbon"}],
    },
    "I paint landscapes": {
        "entities": [{"ref": "N1", "name": "Melanie", "label": "Person"}, {"ref": "N2", "name": "landscape painting"}],
        "facts": [{"subject": "N1", "predicate": "PAINTS", "object": "N2",
                   "statement": "Melanie paints landscapes every weekend"}],
    },
    "I live in Tampa": {
        "entities": [{"ref": "N1", "name": "Tampa", "label": "Place"}],
        "facts": [{"subject": "user", "predicate": "LIVES_IN", "object": "N1", "statement": "User lives in Tampa"}],
    },
    "I moved to Austin": {
        "entities": [{"ref": "N1", "name": "Austin", "label": "Place"}],
        "facts": [{"subject": "user", "predicate": "LIVES_IN", "object": "N1", "statement": "User lives in Austin"}],
    },
    "My favorite food is ramen": {
        "entities": [{"ref": "N1", "name": "ramen", "label": "Food"}],
        "facts": [{"subject": "user", "predicate": "FAVORITE_FOOD", "object": "N1",
                   "statement": "User's favorite food is ramen"}],
    },
}  # fmt: skip


def _table_rows(stdout: str, title: str) -> list[list[str]]:
    """The body rows of the rich table printed under ``title``, each as its stripped cells."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows, rules = [], 0
    for line in lines[start + 1 :]:
        if line.lstrip().startswith(("┏", "┡", "└")):
            rules += 1
            if line.lstrip().startswith("└"):
                return rows
            continue
        if rules >= 2 and "│" in line:  # below the header's rule
            rows.append([cell.strip() for cell in line.strip().strip("│").split("│")])
    return rows


@pytest.mark.slow  # a Redis and two worker processes (each loads the embedder)
def test_llm_quality_bench_runs_the_data_through_llm_model_and_prints_its_tables(tmp_path, llm_standin):
    """``engram bench --only quality --llm`` end to end on a tiny data set, LLM_MODEL pointed at the stand-in
    (openai/ prefix + api_base, as the users' own OpenAI-compatible servers): every turn and session is
    extracted through litellm and the printed tables count what the stand-in actually served."""
    datasets = tmp_path / "datasets"
    (datasets / "locomo").mkdir(parents=True)
    (datasets / "engram_ltm_samples").mkdir()
    (datasets / "locomo" / "locomo_dev5.json").write_text(json.dumps(TINY_LOCOMO))
    (datasets / "engram_ltm_samples" / "sample_20.json").write_text(json.dumps(TINY_SAMPLE20))
    served: list[str] = []

    def answer(request: dict) -> Reply:
        said = message_text(request)
        found = next((a for key, a in TINY_ANSWERS.items() if key in said), {"entities": [], "facts": [], "ends": []})
        reply = Reply.json(found)
        served.append(reply.content)
        return reply

    llm_standin.script(answer)
    env = {**os.environ, "LLM_MODEL": "openai/standin", "LLM_API_BASE": llm_standin.url, "LLM_API_KEY": "test-key"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", "bench", "--quick", "--only", "quality", "--llm",
         "--store", "sqlite", "--conversations", "conv-tiny", "--datasets", str(datasets), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    stdout = done.stdout
    assert "extracting with YOUR model openai/standin" in stdout

    # 4 LoCoMo turns + 3 sample_20 sessions; "Thanks!" is small talk and skips the model.
    messages, calls = 7, 6
    assert llm_standin.calls == calls and not llm_standin.errors
    prompts = [r.messages[-1]["content"] for r in llm_standin.requests]
    assert any("Caroline (memory owner): I moved to Lisbon" in p for p in prompts)
    assert any("Melanie: Nice! I paint landscapes" in p and "Earlier turns" in p for p in prompts)

    coverage = dict(_table_rows(stdout, "LoCoMo coverage of the your LLM_MODEL"))
    assert coverage["turns that produced >= 1 fact"] == "2 / 4"
    assert coverage["questions with >= 1 evidence turn that produced a fact"] == "2 / 3"
    recall = _table_rows(stdout, "LoCoMo evidence recall (conv-tiny; your LLM_MODEL)")
    assert {(r[0], r[1], r[2]) for r in recall} >= {("all", "3", "hybrid"), ("covered only", "2", "naive RAG")}

    # cases, answer found, stale absent, passed (the last column, average context lines, is not fixed).
    sample20 = {(r[0], r[1]): r[2:6] for r in _table_rows(stdout, "engram-ltm sample_20")}
    assert sample20 == {
        ("your LLM_MODEL", "knowledge_update"): ["1", "1/1", "1/1", "1/1"],
        ("your LLM_MODEL", "single_session_user"): ["1", "1/1", "n/a", "1/1"],
    }

    # Token usage per message as litellm reported the stand-in's usage (its deterministic ~4 chars/token).
    prompt_tokens = sum(approx_tokens("".join(m["content"] for m in r.messages)) for r in llm_standin.requests)
    completion_tokens = sum(approx_tokens(c) for c in served)
    cost = dict(_table_rows(stdout, "LLM extraction cost (your LLM_MODEL)"))
    assert cost["messages"] == str(messages)
    assert cost["prompt tokens per message"] == f"{prompt_tokens / messages:.2f}"
    assert cost["completion tokens per message"] == f"{completion_tokens / messages:.2f}"
    assert cost["llm calls per message"] == f"{calls / messages:.2f}"
    assert cost["dead lettered"] == "0"

    result = json.loads((out / "quality.json").read_text())
    assert result["summary"]["llm_cost"]["messages"] == messages
    assert result["summary"]["llm_cost"]["prompt_tokens_per_message"] == pytest.approx(prompt_tokens / messages)
    assert json.loads((out / "latest.json").read_text())["failed"] == {}


# ---------------------------------------------------------------- ingest: our CPU per message

_FORKS_A_BUSY_CHILD = """
import os, sys, time
pid = os.fork()
if pid == 0:
    sys.stdin.readline()
    while time.process_time() < 0.5:
        pass
    os._exit(0)
print("forked", flush=True)
os.waitpid(pid, 0)
print("reaped", flush=True)
sys.stdin.readline()
"""


def test_ingest_cpu_per_message_counts_a_workers_pool_children():
    """The ingest bench's "our CPU" reading of a worker includes its pool children, live or reaped: here the
    parent sleeps and only its forked child uses CPU (0.5 s of its own process time, not wall-clock)."""
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    benchlib = importlib.import_module("benchlib")
    proc = subprocess.Popen(
        [sys.executable, "-c", _FORKS_A_BUSY_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "forked"
        assert len(importlib.import_module("benchmeters")._tree(proc.pid)) == 2
        before = benchlib.cpu_seconds([proc.pid])
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "reaped"
        assert benchlib.cpu_seconds([proc.pid]) - before >= 0.45
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_ingest_counts_redis_commands_since_an_earlier_reading(redis_url):
    """The ingest bench's Redis commands per message: ``INFO commandstats`` differences, each command of a
    pipeline counted (HyperLogLog commands: nothing else in the suite sends them)."""
    from engram_api.connections import redis_client

    sys.path.insert(0, str(REPO / "ops" / "bench"))
    benchlib = importlib.import_module("benchlib")
    client = redis_client(redis_url, Settings())
    before = benchlib.command_calls(client)
    pipe = client.pipeline(transaction=False)
    pipe.pfadd("bench-smoke:hll", "a", "b")
    pipe.pfcount("bench-smoke:hll")
    pipe.pfcount("bench-smoke:hll")
    assert pipe.execute() == [1, 2, 2]
    calls = benchlib.command_calls(client, since=before)
    assert (calls["pfadd"], calls["pfcount"]) == (1, 2)
    client.delete("bench-smoke:hll")


def test_dense_offline_scores_sentences_and_feedback_through_the_recall_step():
    """The offline dense measurement (docs/benchmarks.md, "Dense signals measured offline"): a turn's
    sentences are its long ones with the speaker; a sentence that fits the query lifts its turn above a
    turn whose whole vector fits better; the feedback vector is the query moved toward the keyword
    channel's top turns; the recalled similarity left as it is gives the pool back in the step's order."""
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    offline = importlib.import_module("dense_offline")
    from engram_api.storage.embedding.embedder import Embedder

    assert offline.sentences("Ana: Hi! I moved to Lisbon last May with my cats. Great news, right?") == [
        "Ana: I moved to Lisbon last May with my cats."
    ]
    encoder = Embedder(model="all-MiniLM-L6-v2", backend="onnx")
    texts = [
        "Ana: Work was long today and the bus was late again. I adopted a grey kitten from the shelter on Friday.",
        "Ben: My cat and my dog both love the garden, and pets are great company at home.",
    ]
    vectors = encoder.encode(texts)
    turns = {"u": offline.Turns(["c1", "c2"], texts, ["D1:1", "D1:2"], vectors)}
    signals = offline.Signals(encoder, turns)
    qvec = encoder.encode(["Did Ana adopt a kitten from the shelter?"])[0]
    question = offline.Question("u", "single-hop", {"D1:1"}, "yes", qvec, [], ["c2"])
    best = signals.sentence_best("u", "c1", qvec)
    assert best == pytest.approx(max(float(encoder.encode([s])[0] @ qvec) for s in offline.sentences(texts[0])))
    assert best > float(vectors[0] @ qvec) and signals.sentence_best("u", "c2", qvec) is None  # one long sentence
    assert signals.extra_vectors("u") == 2
    assert signals.channel(question, lam=1.0)[0] == ["D1:1"]
    assert np.allclose(signals.moved(question, 1, 0.5), qvec + 0.5 * vectors[1])
    question.rows = [("c2", 3.0, 0.1, ["D1:2"]), ("c1", 2.0, 0.9, ["D1:1"]), ("f1", 1.0, 0.0, ["D1:3"])]
    # The step adds 1.5 x the min-max normalized similarity to each of the top rows: 3.0 + 0.1... vs 2.0 + 1.5.
    assert offline.reordered(question, lambda _q, _i, sim: sim) == [["D1:1"], ["D1:2"], ["D1:3"]]
    assert offline.reordered(question, lambda _q, _i, _s: 0.5) == [["D1:2"], ["D1:1"], ["D1:3"]]


def test_the_hosts_bench_reader_in_its_own_process_answers_and_exits(tmp_path, redis_url):
    """The hosts bench's reader host in a process of its own (``hosts_process.ChildReader``): with a data
    directory of its own it reads the user another process wrote (one whole read, its first), answers a
    recall with its time and parts taken in it and the floor, refuses nothing silently, and exits on close."""
    from tests.support.stack import engram_stack

    sys.path.insert(0, str(REPO / "ops" / "bench"))
    hosts_process = importlib.import_module("hosts_process")
    bulk_load = importlib.import_module("bulk").bulk_load
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path / "stack", neo4j_uri=None, llm_url=None, workers=False
    ) as stack:
        writer = stack.client
        reader = writer.reader
        bulk_load(writer.graph, reader.keeper, reader.embedder, writer.redis, "own-host-user", 60, "60", out=tmp_path)
        # The child shares the graph store and nothing else, as hosts share Neo4j (SQLite's file sits in the
        # data directory, so the child's is a link to the stack's).
        (tmp_path / "own").mkdir()
        (tmp_path / "own" / "graph.sqlite3").symlink_to(writer.settings.sqlite_path)
        child = hosts_process.ChildReader.start(stack.env, tmp_path / "own")
        try:
            ms, parts = child.recall("own-host-user", "where does the user like to go hiking")
            assert ms > 0 and {"embed", "faiss", "fusion"} <= parts.keys()
            assert child.last_cpu_ms > 0 and child.last_wait_ms >= 0  # the child's own CPU and wait for that recall
            assert child.floor("own-host-user", "where does the user go") > 0
            floor = child.timed_floor("own-host-user", "where does the user go")
            assert floor.ms > 0 and floor.cpu_ms > 0
            assert child.stats() == {"rebuilds": 1, "from_feed": 0}
            with pytest.raises(RuntimeError, match="result cache"):  # a cached answer is no measurement
                child.recall("own-host-user", "where does the user like to go hiking")
        finally:
            child.close()
        assert child.proc.returncode == 0
        assert any((tmp_path / "own" / "indexes").iterdir()), "the child kept its own index files"


def _hosts_pairs():
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    return importlib.import_module("hosts_pairs")


def test_the_hosts_bench_pairs_a_recall_with_its_floor_and_takes_the_median_of_their_ratios():
    """``hosts_pairs``: a pair's floor runs first every other turn; the figure is the median (p25, p75) of
    the per-pair ratios, not the ratio of the two medians (a loaded moment doubling both sides of a pair
    leaves its ratio alone)."""
    pairs_mod = _hosts_pairs()
    timed = pairs_mod.Timed
    calls: list[str] = []
    pairs = pairs_mod.Pairs()
    # Three pairs, the second in a moment of load (both sides 4x): per-pair ratios 1.5, 1.5, 2.0.
    sides = [(15.0, 10.0), (60.0, 40.0), (20.0, 10.0)]
    for turn, (above, below) in enumerate(sides):
        pairs.measure(
            "catch-up", turn, lambda above=above: calls.append("recall") or timed(above, above / 2),
            lambda below=below: calls.append("floor") or timed(below, below / 4),
        )  # fmt: skip
    assert calls == ["floor", "recall", "recall", "floor", "floor", "recall"]
    got = pairs.summary()["catch-up"]
    assert got["ratio"] == {"n": 3, "p25": 1.5, "p50": 1.5, "p75": 1.75}
    assert got["cpu_ratio"]["p50"] == 3.0  # (x / 2) / (y / 4) = 2 x / y
    assert got["recall_ms"]["p50"] / got["floor_ms"]["p50"] == 2.0  # the ratio of p50s: 20 / 10
    assert pairs_mod.quartiles([1.0, 2.0], [0.0, 1.0])["n"] == 1  # a zero floor is no pair
    with pytest.raises(ValueError, match="not pairs"):
        pairs_mod.quartiles([1.0], [])


def test_the_hosts_bench_reader_meter_counts_the_readers_pool_threads_and_not_others():
    """``reader_meter``: CPU spent on the reader's pool threads counts, CPU on another thread does not; its
    wait for a core is a reading that only grows."""
    from concurrent.futures import ThreadPoolExecutor

    pairs_mod = _hosts_pairs()

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    pool = ThreadPoolExecutor(max_workers=1)
    held = type("Held", (), {"pool": pool})()
    client = type("Client", (), {"reader": type("Reader", (), {"_threads": type("T", (), {"_held": held})()})()})()
    meter = pairs_mod.reader_meter(client)
    pool.submit(lambda: None).result()  # the pool's thread exists
    start, waited = meter.cpu(), meter.waits()
    pool.submit(spin, 0.05).result()
    on_pool = meter.cpu() - start
    assert meter.waits() >= waited >= 0
    other = ThreadPoolExecutor(max_workers=1)
    start = meter.cpu()
    other.submit(spin, 0.05).result()
    elsewhere = meter.cpu() - start
    pool.shutdown()
    other.shutdown()
    assert on_pool >= 0.05 and elsewhere < 0.02


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins a process to one of two cores")
def test_the_hosts_bench_separate_host_pins_the_reader_alone_and_restores_every_thread():
    """``separate_core``: the reader process on the last core, this process on the rest, while open; both
    back on the cores they had when it closes."""
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    hosts_process = importlib.import_module("hosts_process")
    cores = os.sched_getaffinity(0)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = hosts_process.ChildReader(proc)
        with hosts_process.separate_core(child, []) as pinned:
            assert pinned is not None and pinned["reader_cores"] == [max(cores)]
            assert os.sched_getaffinity(proc.pid) == {max(cores)}
            threads = [int(t.name) for t in Path("/proc/self/task").iterdir()]
            assert all(os.sched_getaffinity(t) == cores - {max(cores)} for t in threads)
        assert os.sched_getaffinity(proc.pid) == cores and os.sched_getaffinity(0) == cores
    finally:
        proc.kill()
        proc.wait()


def test_query_offline_reshapes_the_query_windows_a_reply_and_weights_bm25s_length_and_the_speaker():
    """The offline query measurement (docs/benchmarks.md, "The query's side measured offline"): the dense
    query forms drop the wh-word and auxiliaries; the names a query gives beside the speakers and the
    calendar's; a turn's window is it with the other speaker's reply the same day; its BM25 over a user's
    turns weighs a turn's length by ``b`` and the speaker's name as a field by ``w``."""
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "ops" / "bench"))
    offline = importlib.import_module("query_offline")
    pools = importlib.import_module("pool_offline")

    assert offline.stripped("What did Caroline research?") == "Caroline research"
    assert offline.turn_shaped("What did Caroline research?") == "Caroline: research"
    assert pools.names("Did Jon and Gina see the Eiffel Tower in June?", {"Jon", "Gina"}) == ["Eiffel Tower"]
    day = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)

    def turn(cid: str, speaker: str, text: str, at: datetime) -> SimpleNamespace:
        return SimpleNamespace(id=cid, speaker=speaker, text=text, event_time=at, indexed_text=f"{speaker}: {text}")

    turns = [
        turn("c1", "Ana", "Where did you move?", day),
        turn("c2", "Ben", "Austin.", day + timedelta(seconds=1)),
        turn("c3", "Ben", "We love the food there, tacos and barbecue every single week.", day + timedelta(seconds=2)),
        turn("c4", "Ana", "Nice!", day + timedelta(days=7)),
    ]
    assert pools.reply_windows(turns) == {"c1": "Ana: Where did you move?\nBen: Austin."}
    index = offline.TurnIndex(turns)
    assert index.search("Ben", 10, 1.2, 0.75, 0.0) == []  # the name is not in the words said
    assert [h.node_id for h in index.search("Ben", 10, 1.2, 0.75, 1.0)] == ["c2", "c3"]
    index.body[1]["food"] = 1  # "Austin." now holds "food" once, as the long turn does
    short, long_ = (index.search("food", 10, 1.2, b, 0.0) for b in (1.0, 0.0))
    assert [h.node_id for h in short] == ["c2", "c3"] and short[0].score > short[1].score
    assert long_[0].score == pytest.approx(long_[1].score)  # b = 0: the length does not count


def test_maxsim_offline_masks_tokens_and_reorders_the_top_as_the_recall_step_does():
    """The offline late-interaction measurement (docs/benchmarks.md, "Late interaction measured offline"):
    with no MaxSim weight the pool comes back in recall's own order; with the cosine replaced, the top is
    ordered by MaxSim and the rows below the depth stay; the masks drop special tokens and punctuation
    (``words``), stop words (``content``) and the turn answered (``own``), a text is its own best match."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "ops" / "bench"))
    offline = importlib.import_module("maxsim_offline")

    assert offline.parsed(offline.named("own", "+reply", 0.0, 4.5)) == ("own", "+reply")
    depth = offline.DEFAULT_RECIPE.rerank_depth

    def item(n: int, score: float, sim: float) -> SimpleNamespace:
        return SimpleNamespace(id=f"i{n:03d}", score=score, breakdown=SimpleNamespace(similarity=sim))

    items = [item(n, 10.0 - n * 0.01, (n * 7 % 11) / 11) for n in range(depth + 5)]
    pool = offline.Pool(items)
    sims = {i.id: -i.score for i in items}  # MaxSim reverses the pool's order
    assert offline.reordered(pool, sims, 1.5, 0.0) == pool.ordered(offline.as_recalled)
    late = offline.reordered(pool, sims, 0.0, 4.5)
    assert late[:depth] == items[:depth][::-1] and late[depth:] == items[depth:]

    pytest.importorskip("transformers")
    states = offline.TokenStates("all-MiniLM-L6-v2")
    query, doc = "Where did Ana move?", "Ana: I moved to Lisbon.\n(replying to Ben: Where did you go?)"
    states.encode([query], query=True)
    states.encode([doc, query])
    tokens = states.tokenizer.convert_ids_to_tokens(states.tokenizer(doc)["input_ids"])
    kept = {
        mask: [t for t, keep in zip(tokens, states.memo[(doc, False)][mask], strict=True) if keep]
        for mask in offline.MASKS
    }
    assert kept["all"] == tokens and kept["words"][:4] == ["ana", "i", "moved", "to"] and "[SEP]" not in kept["words"]
    assert kept["own"] == ["ana", "i", "moved", "to", "lisbon"] and "to" not in kept["content"]
    assert [
        t
        for t, k in zip(
            states.tokenizer.convert_ids_to_tokens(states.tokenizer(query)["input_ids"]),
            states.memo[(query, True)]["content"],
            strict=True,
        )
        if k
    ] == ["ana", "move"]
    assert states.maxsim(query, query, "words") == pytest.approx(1.0, abs=1e-5)
    assert states.maxsim(query, doc, "words") > states.maxsim(query, doc, "own")  # "where did" is in the reply


def test_maxsim_offline_stored_forms_keep_what_a_store_would_and_rescore_only_the_top():
    """``maxsim_offline.py --stored`` (docs/benchmarks/history.md, "Late interaction's stored token states"):
    int8 with a scale per token reads back within half a step; a pruned form keeps the 8 masked tokens of
    highest idf (an unseen piece rarest) or norm, in text order; ``sign`` is 1 bit a dimension; re-scoring the
    sign order's top in float32 moves rows within that top only."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "ops" / "bench"))
    offline = importlib.import_module("maxsim_offline")

    rng = np.random.default_rng(7)
    vecs = rng.normal(size=(12, offline.DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    words = np.array([False] + [True] * 10 + [False])  # [CLS] ... [SEP]
    norms = np.array([99.0, 9, 8, 7, 6, 1, 5, 4, 2, 3, 10, 99])  # positions 5 and 8 weakest
    doc = {"vecs": vecs, "norms": norms, "ids": np.arange(12), "words": words}
    assert np.abs(offline.int8(vecs) - vecs).max() <= np.abs(vecs).max() / 254 + 1e-6
    idf = {piece: float(piece) for piece in range(12) if piece != 2}  # piece 2 unseen: the rarest
    forms = offline.stored_forms(idf)
    assert offline.PRUNED[0] == 8
    assert np.array_equal(forms["float32"](doc, "words"), vecs[1:11])
    assert np.allclose(forms["int8, 8 by idf"](doc, "words"), offline.int8(vecs[[2, 4, 5, 6, 7, 8, 9, 10]]))
    assert np.allclose(forms["int8, 8 by norm"](doc, "words"), offline.int8(vecs[[1, 2, 3, 4, 6, 7, 9, 10]]))
    assert len(forms["int8, 16 by norm"](doc, "words")) == 10
    assert set(np.unique(forms["sign"](doc, "words"))) == {-1.0, 1.0}
    assert offline.token_bytes("sign") == 48 and offline.token_bytes("int8, 16 by norm") == offline.DIM + 2

    depth = offline.DEFAULT_RECIPE.rerank_depth
    cosine = SimpleNamespace(similarity=0.5)
    items = [SimpleNamespace(id=f"i{n:03d}", score=10.0 - n * 0.01, breakdown=cosine) for n in range(depth + 5)]
    pool = offline.Pool(items)
    coarse = {i.id: -i.score for i in items}  # the sign order reverses the pool's top
    fine = {i.id: i.score for i in items}  # float32 says the pool's order was right
    once = offline.reordered(pool, coarse, 0.0, 4.5)
    again = offline.rescored(pool, coarse, fine, 4.5, 10)
    assert again[:10] == sorted(once[:10], key=lambda i: -i.score) and again[10:] == once[10:]


def test_maxsim_graph_gives_the_query_token_states_from_the_floors_pass():
    """``maxsim_graph.py`` (docs/benchmarks/history.md, "Late interaction's stored token states"): the shipped
    graph with the last hidden state as a second output gives the same vector as the encoder, and the query's
    ``words`` tokens' states, normalized; the step is timed for each stored form."""
    sys.path.insert(0, str(REPO / "ops" / "bench"))
    graph = importlib.import_module("maxsim_graph")
    from engram_api.storage.embedding.embedder import Embedder

    encoder = Embedder(model=graph.MODEL, backend="onnx", threads=1)
    shipped, both, tokenizer = graph.two_outputs(encoder)
    query = "Where did Ana move, in 2022?"
    vec, states = graph.query_states(both, tokenizer, query)
    assert float(vec @ encoder.encode([query])[0]) == pytest.approx(1.0, abs=1e-5)
    assert np.allclose(shipped.run(None, graph._feed([tokenizer.encode(query)]))[0][0], vec, atol=1e-6)
    words = [t for t in tokenizer.encode(query).tokens[1:-1] if any(c.isalnum() for c in t)]  # no [CLS], [SEP]
    assert states.shape == (len(words), 384) and words[:3] == ["where", "did", "ana"]
    assert np.allclose(np.linalg.norm(states, axis=1), 1.0, atol=1e-5)
    assert set(graph.step(8, rounds=2)) == {"float32", "int8", "sign"}


def test_maxsim_further_variants_change_only_what_they_name():
    """``maxsim_offline.py --further`` (docs/benchmarks/history.md, "Late interaction's signs step, varied
    on dev"): MaxSim reads signs and may weight the query's tokens; the deeper step, MaxSim alone, the
    rank fusion and the equal-weight mix re-order only their top; a turn's neighbours stay in its session; the second query's names
    leave out the speakers' and the query's; the query's ``no wh`` mask drops its wh-words and auxiliaries."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "ops" / "bench"))
    further = importlib.import_module("maxsim_further")

    query = np.array([[1.0, 0.0], [0.0, 1.0]])
    doc = further.signs(np.array([[0.6, -0.2], [-0.1, 0.3]]))
    assert np.array_equal(doc, [[1.0, -1.0], [-1.0, 1.0]])
    assert further.late(query, doc) == 1.0 and further.late(query, doc[:1]) == 0.0
    assert further.late(query, np.array([[1.0, 0.0]]), np.array([3.0, 1.0])) == pytest.approx(0.75)
    assert further.late(query[:0], doc) == 0.0

    cosine = SimpleNamespace(similarity=0.5)
    items = [SimpleNamespace(id=f"i{n:03d}", score=10.0 - n * 0.01, breakdown=cosine) for n in range(105)]
    pool = further.Pool(items)
    agree = {i.id: i.score for i in items}
    reverse = {i.id: -i.score for i in items}
    assert further.by_ranks(pool, agree) == items and further.alone(pool, agree) == items == further.even(pool, agree)
    last = {i.id: float(i.id == "i039") for i in items}  # MaxSim's best is the total's 40th: equal weights tie
    assert (
        further.even(pool, last)[:3] == [items[0], items[39], items[1]] and further.even(pool, last)[40:] == items[40:]
    )
    assert further.alone(pool, reverse) == items[:40][::-1] + items[40:]
    assert further.by_ranks(pool, reverse)[40:] == items[40:]
    deeper = further.reordered(pool, reverse, 0.0, 4.5, 60)
    assert deeper == items[:60][::-1] + items[60:]

    from datetime import datetime

    said_on = [("a", 1, 9), ("b", 1, 10), ("c", 1, 11), ("d", 2, 9)]  # a turn's id, day, hour
    turns = [SimpleNamespace(id=t, event_time=datetime(2023, 5, day, hour)) for t, day, hour in said_on]
    assert further.neighbours(turns) == {"a": ["b"], "b": ["a", "c"], "c": ["b"], "d": []}
    said = ["Caroline: I went to Paris with Melanie and Ana, then Lake Tahoe.", "Melanie: What about Paris?"]
    assert further.names_in(said, "Where did Ana go?", {"Caroline", "Melanie"}) == ["Paris", "Lake Tahoe"]

    pytest.importorskip("transformers")
    states = further.TokenStates("all-MiniLM-L6-v2")
    asked = "Where did Ana move, and what does she do?"
    states.encode([asked], query=True)
    tokens = states.tokenizer.convert_ids_to_tokens(states.tokenizer(asked)["input_ids"])
    plain = [t for t, keep in zip(tokens, states.memo[(asked, True)]["no wh"], strict=True) if keep]
    assert plain == ["ana", "move", "and", "she"]


def test_bulk_loaded_facts_carry_their_token_states_as_applied_ones_do(tmp_path, redis_url):
    """``bulk.bulk_load`` stores each fact's packed token states (every word, as apply keeps a statement's),
    so a recall's late-interaction step pays MaxSim on a bulk-loaded user as on a real one, not the cosine
    that stands in for a record without states; the second load reads them from the run's cache."""
    from engram_api.storage.embedding.states import pack
    from tests.support.stack import engram_stack

    sys.path.insert(0, str(REPO / "ops" / "bench"))
    bulk = importlib.import_module("bulk")
    texts = [s for s, _, _ in bulk.statements("20", 20)]
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path / "stack", neo4j_uri=None, llm_url=None, workers=False
    ) as stack:
        client = stack.client
        reader = client.reader
        for user in ("first-load", "cached-load"):
            bulk.bulk_load(client.graph, reader.keeper, reader.embedder, client.redis, user, 20, "20", out=tmp_path)
            index = reader.keeper.current(user, client.graph.user_stamp(user))
            ids = [v.node_id for v in client.graph.vectors(user)[0] if v.kind == "fact"]
            held = index.states_for(ids)
            assert len(ids) == 20 and held.keys() == set(ids)
            _, kept = reader.embedder.encode_states(texts)
            assert sorted(held.values()) == sorted(pack(k) for k in kept)
