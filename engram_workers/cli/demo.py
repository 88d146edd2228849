"""``engram demo``: the whole pipeline on one machine with nothing configured, in about a minute.

It starts what ``engram up`` starts (embedded Redis unless REDIS_URL is set, an extract and an apply
worker, Beat), ingests three bundled months of chats with one user, waits until every message is applied and
then reads memory back: supersession, multi-hop recall, history, a prompt context and the cost.
Reruns start clean: the demo user is forgotten first (nothing else is touched).

Each scene checks that it shows what its caption claims (``_claim``); one that does not ends the demo
with exit code 1 and says which claim failed, so a regression cannot hide behind a confident caption.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import TYPE_CHECKING, Any

import click

from engram_workers.cli._common import settings
from engram_workers.cli._output import console, count, err_console, table

if TYPE_CHECKING:
    from engram_api import MemoryClient
    from engram_api.models import Envelope

__all__ = ["COMMANDS", "SceneError", "load_sample"]

SAMPLE = "sample_conversation.json"
_MESSAGE_GAP = timedelta(minutes=2)  # between two messages of one chat session
# Facts age from when they were said (decay), so the sample is moved to end this many days ago: an
# absolute 2024 date would have the first maintenance run archive the whole demo.
_LAST_CHAT_DAYS_AGO = 3
# What the bundled conversation says, which the scenes check they show.
_HOME, _OLD_HOME = "Austin", "Tampa"
_BROTHER, _EMPLOYER = "Alex", "Amazon"
# Said in the conversation, and no context line for a dinner: small talk, and the replaced home.
_NOT_CONTEXT = ("Good morning!", "I live in Tampa.")


def load_sample() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resources.files("engram_workers.cli").joinpath(SAMPLE).read_text())
    return data


def date_shift(sample: dict[str, Any]) -> timedelta:
    """Whole days that move the sample's last chat to a few days ago (times of day stay as written)."""
    last = max(datetime.fromisoformat(s["started_at"]) for s in sample["sessions"])
    target = datetime.now(UTC).date() - timedelta(days=_LAST_CHAT_DAYS_AGO)
    return target - last.date()


def sample_envelopes(client: MemoryClient, sample: dict[str, Any], shift: timedelta) -> list[Envelope]:
    """One message per chat turn, dated within its session; ids are fixed so a rerun is recognizable."""
    from engram_api.producer import build_envelope

    envelopes = []
    for s, session in enumerate(sample["sessions"], 1):
        start = datetime.fromisoformat(session["started_at"]) + shift
        for m, text in enumerate(session["messages"], 1):
            envelopes.append(
                build_envelope(
                    client.settings,
                    sample["user_id"],
                    text,
                    message_id=f"demo-s{s}-m{m}",
                    timestamp=start + (m - 1) * _MESSAGE_GAP,
                    metadata={"session": session["title"]},
                )
            )
    return envelopes


def _section(title: str) -> None:
    console().print()
    console().rule(f"[bold]{title}[/bold]", align="left")


class SceneError(click.ClickException):
    """A scene did not show what its caption claims: the demo fails loudly instead of printing a claim
    the output above it contradicts (exit 1)."""

    exit_code = 1


def _claim(holds: bool, scene: str, claim: str) -> None:
    if not holds:
        raise SceneError(f"scene {scene} does not show what it claims: {claim}")


def _show(client: MemoryClient, user: str, as_of: datetime) -> None:
    from engram_workers.cli.memory import print_facts, print_recall

    out = console()
    _section("1. Supersession: where does the user live?")
    now = client.recall(user, "where does the user live?", k=3)
    print_recall(now.items, caption=f"{sum(now.timings_ms.values()):.0f} ms, zero LLM calls")
    home = next((i for i in now.items if i.kind == "fact"), None)
    _claim(home is not None and home.object == _HOME and home.current, "1", f"the top fact is {_HOME}, current")
    assert home is not None
    out.print(f"-> [bold]{home.statement}[/bold]; the old home is superseded, not deleted:")
    then = client.recall(user, "where does the user live?", k=5, as_of=as_of)
    old = next((i for i in then.items if i.kind == "fact"), None)
    _claim(old is not None and old.object == _OLD_HOME, "1", f"as of {as_of:%Y-%m-%d} the top fact is {_OLD_HOME}")
    assert old is not None
    out.print(f"-> as of {as_of:%Y-%m-%d}: [bold]{old.statement}[/bold] (recall --as-of travels in time)")
    moves = client.history(user, "user", "LIVES_IN")
    print_facts(moves, title="history of LIVES_IN: nothing is overwritten")
    _claim([f.object_name for f in moves] == [_OLD_HOME, _HOME], "1", "the history keeps both homes")

    _section("2. Multi-hop: what company does my brother work for?")
    hop = client.recall(user, "what company does my brother work for?", k=3)
    print_recall(hop.items)
    answer = next((i for i in hop.items if i.kind == "fact" and i.object == _EMPLOYER), None)
    _claim(
        answer is not None and "graph" in answer.channels and answer.subject == _BROTHER,
        "2", f"'{_BROTHER} works at {_EMPLOYER}' is in the top 3, reached through the graph",
    )  # fmt: skip
    assert answer is not None
    out.print(
        f"-> [bold]{answer.statement}[/bold] (the question names neither {_BROTHER} nor {_EMPLOYER}: the graph "
        f"links brother -> {_BROTHER} -> {_EMPLOYER})"
    )

    _section("2b. The conversation itself: what happened to the sourdough starter?")
    said = client.recall(user, "what happened to the sourdough starter?", k=3)
    print_recall(said.items)
    episode = next((i for i in said.items if i.kind == "episode"), None)
    facts = client.get_graph(user, 1, 1000).facts
    _claim(
        episode is not None and "sourdough" in episode.statement
        and not any(set(episode.source_ids) & set(f.source_ids) for f in facts),
        "2b", "the top excerpt is the sourdough message, of which no fact was extracted",
    )  # fmt: skip
    assert episode is not None
    out.print(
        f"-> [bold]{episode.statement}[/bold] ({episode.speaker}, {episode.event_time:%Y-%m-%d}): "
        "the extractor made no fact of it; the message itself is a memory"
    )

    _section("3. get_context: a prompt-ready block for 'plan a dinner for me'")
    block = client.get_context(user, "plan a dinner for me", max_tokens=200)
    out.print(block or "(empty)", highlight=False)
    shown = [text for text in _NOT_CONTEXT if text in block]
    _claim(not shown, "3", f"no small talk and no replaced value without its replacement (shows {shown})")
    out.print(
        "-> current facts first; no small talk, and no excerpt of a value since replaced (Tampa) where "
        "the query does not ask for it"
    )

    _section("4. What it cost")
    stats = client.stats(user)
    table(
        None,
        ["memory", "count"],
        [
            ("facts (current / superseded)", f"{stats.current_facts} / {stats.superseded_facts}"),
            ("entities", stats.entities),
            ("messages applied (episodes)", stats.episodes),
        ],
    )
    usage = stats.usage
    if usage.llm_calls == 0:
        out.print(
            "-> [bold]0 LLM tokens, $0.00[/bold]: the offline rule-based extractor made no LLM calls "
            "(set LLM_MODEL to extract with an LLM); recall never calls one."
        )
    else:
        out.print(
            f"-> {usage.llm_calls} LLM calls, {usage.prompt_tokens} prompt + {usage.completion_tokens} "
            f"completion tokens, about ${usage.cost_usd:.4f}; recall never calls the LLM."
        )


@click.command(short_help="Run the pipeline locally on a sample conversation.")
@click.option(
    "--timeout", default=300.0, show_default=True, type=click.FloatRange(min=1), help="Seconds to wait for the workers."
)
def demo(timeout: float) -> None:
    """Run the whole pipeline locally on a sample conversation and show what it remembers.

    Needs nothing configured (embedded Redis, SQLite, offline extractor, data in ENGRAM_DATA_DIR);
    honours REDIS_URL, NEO4J_URI and LLM_MODEL when they are set.
    """
    from engram_api import MemoryClient
    from engram_api.redaction import redact
    from engram_workers.cli._local import LocalStack
    from engram_workers.cli.ingest import enqueue_envelopes, wait_with_progress

    started = time.monotonic()
    current = settings()
    sample = load_sample()
    user = sample["user_id"]
    sessions = sample["sessions"]
    out, err = console(), err_console()
    out.rule("[bold]Engram demo[/bold]")
    messages = sum(len(s["messages"]) for s in sessions)
    shift = date_shift(sample)
    first = min(datetime.fromisoformat(s["started_at"]) for s in sessions) + shift
    out.print(f"{messages} messages in {len(sessions)} chats with one user ({user}) since {first:%B %-d}.")

    stack = LocalStack(current)
    client: MemoryClient | None = None
    try:
        with err.status("starting Redis, an extract worker, an apply worker and Beat..."):
            stack.prepare(err.print)
            url = stack.start_redis(reuse=True)
            stack.start_extract_worker("demo-extract", 8)
            stack.start_apply_worker("demo-apply", 2)
            stack.start_beat()
            client = MemoryClient(settings=current, redis_url=url)
            # Forgetting loads the embedder: done while the workers boot, and makes a rerun start clean.
            client.forget_user(user)
            stack.wait_ready()
        table(
            "setup",
            ["", ""],
            [
                ("queue", f"Redis {redact(url)}" + (" (embedded)" if stack.redis_server else "")),
                ("graph", current.neo4j_uri or f"SQLite {stack.data_dir / 'graph.sqlite3'}"),
                ("extractor", current.llm_model or "offline rules (LLM_MODEL is not set)"),
                ("embeddings", f"{current.embedding_model}, local"),
                ("logs", str(stack.log_dir)),
            ],
        )
        receipts = enqueue_envelopes(client, sample_envelopes(client, sample, shift))
        ingest_started = time.monotonic()
        result = wait_with_progress(client, receipts, timeout)
        out.print(
            f"{count(len(result.applied), 'message')} applied, {len(result.dead_lettered)} dead-lettered, "
            f"in {time.monotonic() - ingest_started:.1f} s"
        )
        _show(client, user, datetime.fromisoformat(sample["as_of_example"]) + shift)
    finally:
        if client is not None:
            client.close()
        with err.status("stopping the workers..."):
            stack.stop()

    _section("Next")
    for command, what in (
        ("engram up", "run Redis and the workers; leave it running in its own terminal, then:"),
        (f'engram recall {user} "what pets do I have?"', "ask the demo's memory anything (add --json for scripts)"),
        (f"engram history {user} user --predicate WORKS_AT", "see a fact change over time"),
        ('engram enqueue alice "I moved to Denver" --wait', "remember something new"),
        ("engram health", "check every dependency"),
        ("engram --help", "everything else: search, graph, stats, dlq, maintenance, export, ..."),
    ):
        out.print(f"  [cyan]{command}[/cyan]\n      {what}")
    out.print(f"\ndemo finished in {time.monotonic() - started:.1f} s; everything it started is stopped.")


COMMANDS = [demo]
