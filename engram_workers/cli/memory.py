"""Read memory back (recall, search, context, history, graph, stats), forget it, export and import it, check health.

All of it goes through ``MemoryClient``: zero LLM calls (``health`` pings the LLM only when asked to
check a configured one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING

import click

from engram_workers.cli._common import TIME_HELP, open_client, parse_time, settings, user_id_argument
from engram_workers.cli._output import console, count, emit_json, fmt_time, json_option, table

if TYPE_CHECKING:
    from engram_api import MemoryClient
    from engram_api.models import CheckResult, FactRecord, RecallItem

__all__ = ["COMMANDS", "print_facts", "print_recall"]


def _found_by(item: RecallItem) -> str:
    """Which channels reached an item; the graph says how far (on a matched entity itself at hop 0, else
    that many entity steps away)."""
    names = []
    for channel in item.channels:
        if channel == "graph":
            reach = "on a matched entity" if item.hops <= 0 else f"{item.hops} hop{'s' if item.hops != 1 else ''} away"
            names.append(f"graph ({reach})")
        else:
            names.append(channel.replace("_", " "))
    return " + ".join(names)


def _memory(item: RecallItem) -> str:
    return item.statement if item.kind == "fact" else f"{item.speaker}: {item.statement}"


def print_recall(items: Sequence[RecallItem], *, title: str | None = None, caption: str | None = None) -> None:
    rows = [
        (i, _memory(item), item.kind, fmt_time(item.event_time), _found_by(item), f"{item.score:.3f}")
        for i, item in enumerate(items, 1)
    ]
    table(title, ["#", "memory", "kind", "when", "found by", "score"], rows, caption=caption)


def print_facts(facts: Sequence[FactRecord], *, title: str | None = None) -> None:
    rows = [
        (
            fact.statement,
            fact.predicate,
            fmt_time(fact.valid_from),
            fmt_time(fact.valid_until) if fact.valid_until else "current",
            f"{fact.strength:.2f}" + (" (archived)" if fact.archived else ""),
        )
        for fact in facts
    ]
    # Ids are for programs: --json has them.
    table(title, ["fact", "predicate", "valid from", "valid until", "strength"], rows)


@click.command(short_help="Memories relevant to a query (zero LLM calls).")
@user_id_argument
@click.argument("query")
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, 200), help="How many memories.")
@click.option("--as-of", help=f"Recall what was true at this time: {TIME_HELP}")
@click.option("--since", help=f"Only what happened at or after this time (event time): {TIME_HELP}")
@click.option("--until", help=f"Only what happened before this time (event time): {TIME_HELP}")
@json_option
def recall(
    user_id: str, query: str, k: int, as_of: str | None, since: str | None, until: str | None, as_json: bool
) -> None:
    """Memories relevant to QUERY: current facts and conversation excerpts (vectors, keywords, graph)."""
    when = parse_time(as_of, "as_of") if as_of else None
    start = parse_time(since, "since") if since else None
    end = parse_time(until, "until") if until else None
    with open_client() as client:
        result = client.recall(user_id, query, k, as_of=when, since=start, until=end)
    if as_json:
        emit_json(result)
        return
    timing = ", ".join(f"{name} {ms:.0f} ms" for name, ms in result.timings_ms.items())
    caption = f"weights: {result.weights}; {'cached; ' if result.cached else ''}{timing}"
    title = f"recall: {query!r}" + (f" as of {fmt_time(when)}" if when else "")
    print_recall(result.items, title=title, caption=caption)


@click.command(short_help="Search by topic clusters or by single facts.")
@user_id_argument
@click.argument("query")
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, 200))
@click.option(
    "--detail",
    type=click.Choice(["auto", "broad", "detailed"]),
    default="auto",
    show_default=True,
    help="broad: topic clusters; detailed: individual facts; auto: clusters when one matches well.",
)
@json_option
def search(user_id: str, query: str, k: int, detail: str, as_json: bool) -> None:
    """Search memory at the level of topics (clusters) or of individual facts."""
    with open_client() as client:
        result = client.search(user_id, query, k, detail)
    if as_json:
        emit_json(result)
        return
    if result.level == "broad":
        rows = [(c.label, c.summary, len(c.member_fact_ids), f"{c.score:.3f}") for c in result.clusters]
        table(f"search (broad): {query!r}", ["topic", "summary", "facts", "score"], rows)
    else:
        print_recall(result.facts, title=f"search (detailed): {query!r}", caption=result.note or None)


@click.command(short_help="A prompt-ready block of facts and excerpts for a query.")
@user_id_argument
@click.argument("query")
@click.option("--max-tokens", default=800, show_default=True, type=click.IntRange(1, 100_000))
@json_option
def context(user_id: str, query: str, max_tokens: int, as_json: bool) -> None:
    """A prompt-ready block for QUERY within a token budget: current facts, then dated conversation excerpts."""
    with open_client() as client:
        text = client.get_context(user_id, query, max_tokens)
        needed = 0
        if not text and not as_json:
            # "Nothing known" and "nothing fits" both give an empty block: tell them apart for a person.
            from engram_api.reader.context import count_tokens

            header_and_best = client.get_context(user_id, query, 100_000).splitlines()[:2]
            # Counted as get_context counts: each line's tokens and its line break.
            needed = sum(count_tokens(line) + 1 for line in header_and_best) if len(header_and_best) == 2 else 0
    if as_json:
        emit_json({"user_id": user_id, "query": query, "context": text})
    elif text:
        click.echo(text)
    elif needed:
        click.echo(f"(nothing fits in --max-tokens {max_tokens}; the most relevant line needs about {needed})")
    else:
        click.echo("(nothing known for this query)")


@click.command(short_help="How facts about a subject changed over time.")
@user_id_argument
@click.argument("subject", default="user")
@click.option("--predicate", "-p", help="Only this relation, e.g. LIVES_IN or WORKS_AT.")
@click.option(
    "--limit", "-n", type=int, default=None,
    help="Show only the latest N facts (unset: the library's default, engram_api.models.HISTORY_LIMIT).",
)  # fmt: skip
@json_option
def history(user_id: str, subject: str, predicate: str | None, limit: int | None, as_json: bool) -> None:
    """How facts about SUBJECT changed over time, superseded ones included, oldest first.

    SUBJECT is an entity name or alias; "user" (the default) is the user themself.
    """
    with open_client() as client:
        # No engram_api import at CLI import time, so the default lives in the library only.
        facts = client.history(user_id, subject, predicate, *([] if limit is None else [limit]))
    if as_json:
        emit_json(facts)
    else:
        print_facts(facts, title=f"history of {subject!r}" + (f" ({predicate})" if predicate else ""))


@click.command(short_help="Page through a user's knowledge graph.")
@user_id_argument
@click.option("--page", default=1, show_default=True, type=click.IntRange(1))
@click.option("--page-size", default=50, show_default=True, type=click.IntRange(1, 1000))
@json_option
def graph(user_id: str, page: int, page_size: int, as_json: bool) -> None:
    """One page of the user's knowledge graph: facts (oldest first) and the entities they mention."""
    with open_client() as client:
        result = client.get_graph(user_id, page, page_size)
    if as_json:
        emit_json(result)
        return
    pages = max(1, -(-result.total_facts // page_size))
    print_facts(result.facts, title=f"facts, page {page} of {pages} ({result.total_facts} in all)")
    rows = [(e.name, e.label, ", ".join(e.aliases), e.summary) for e in result.entities]
    table("entities on this page", ["name", "label", "aliases", "summary"], rows)


@click.command(short_help="Counts of a user's memory and its LLM cost.")
@user_id_argument
@json_option
def stats(user_id: str, as_json: bool) -> None:
    """Counts of the user's memory and the LLM tokens and cost spent building it."""
    with open_client() as client:
        result = client.stats(user_id)
    if as_json:
        emit_json(result)
        return
    usage = result.usage
    rows = [
        ("entities", result.entities),
        (
            "facts (current / superseded / archived)",
            f"{result.current_facts} / {result.superseded_facts} / {result.archived_facts}",
        ),
        ("facts in all", result.facts),
        ("episodes (messages applied)", result.episodes),
        ("topic clusters", result.clusters),
        ("graph version", result.version),
        ("LLM calls", usage.llm_calls),
        ("LLM tokens (prompt + completion)", f"{usage.prompt_tokens} + {usage.completion_tokens}"),
        ("estimated LLM cost", f"${usage.cost_usd:.4f}"),
    ]
    table(f"memory of {user_id}", ["", "value"], rows)


@contextmanager
def erasure_client() -> Iterator[MemoryClient]:
    """A client whose erasures reach Redis. With the embedded default and the fleet stopped, the embedded
    Redis is started on its own files for the command (its AOF holds the queue and the dead letters: an
    erasure that skipped them would be undone by the next `engram up`) and stopped after."""
    from engram_workers.cli._local import LocalStack

    stack = LocalStack(settings())
    url = stack.start_redis(reuse=True)  # REDIS_URL, or the running embedded Redis, or one started here
    try:
        with open_client(url) as client:
            yield client
    finally:
        stack.stop()


@click.command(short_help="Forget one message, or one fact.")
@user_id_argument
@click.argument("memory_id")
@json_option
def forget(user_id: str, memory_id: str, as_json: bool) -> None:
    """Forget MEMORY_ID: a message id (the message and the facts only it stated), or the `id` of a recall
    item in --json output: a fact's (that fact) or an excerpt's (the message it comes from). Exits 2 when
    the user has none of them. Starts the embedded Redis for the erasure when the fleet is stopped."""
    with erasure_client() as client:
        result = client.forget(user_id, memory_id)
    if as_json:
        emit_json(result)
    else:
        what = f"fact {memory_id}"
        if memory_id in result.removed_chunk_ids:
            what = f"the message of excerpt {memory_id}"
        elif result.episodes:
            what = f"message {memory_id}"
        click.echo(
            f"forgot {what}: {count(result.facts, 'fact')}, {count(result.entities, 'entity', 'entities')}, "
            f"{count(result.vectors, 'vector')}"
        )


@click.command("forget-user", short_help="Erase everything of one user.")
@user_id_argument
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def forget_user(user_id: str, yes: bool, as_json: bool) -> None:
    """Erase everything of one user: graph, vectors, queued messages, dead letters (and their copies in the
    store's and Redis's files). Starts the embedded Redis for the erasure when the fleet is stopped."""
    if not yes:
        click.confirm(f"Erase all memory of {user_id}? This cannot be undone", abort=True, err=True)
    with erasure_client() as client:
        result = client.forget_user(user_id)
    if as_json:
        emit_json(result)
    else:
        click.echo(
            f"erased {user_id}: {count(result.episodes, 'episode')}, {count(result.facts, 'fact')}, "
            f"{count(result.entities, 'entity', 'entities')}"
        )


def _llm_check(client: MemoryClient) -> CheckResult:
    """One real extraction call: proves the model, the key and JSON mode together."""
    from engram_api.health import timed
    from engram_workers.extraction.llm import call_llm

    def ping() -> str:
        answer = call_llm(
            client.settings,
            [
                {"role": "system", "content": 'Answer with the JSON object {"entities": [], "facts": []}.'},
                {"role": "user", "content": "health check"},
            ],
        )
        return f"{client.settings.llm_model}: {answer.usage.prompt_tokens + answer.usage.completion_tokens} tokens"

    return timed(ping, client.settings.secrets)


@click.command(short_help="Check every dependency (exit 1 when unhealthy).")
@json_option
def health(as_json: bool) -> None:
    """Check the graph store, Redis, the embedder, the index directory, queues (and the LLM if set).

    Exits 1 when any check fails.
    """
    with open_client() as client:
        report = client.health()
        if client.settings.llm_model:
            report.checks["llm"] = _llm_check(client)
            report.ok = report.ok and report.checks["llm"].ok
    if as_json:
        emit_json(report)
    else:
        rows = [
            ("[green]ok[/green]" if c.ok else "[red]FAIL[/red]", name, c.detail, f"{c.latency_ms:.0f} ms")
            for name, c in report.checks.items()
        ]
        table("engram health", ["", "check", "detail", "time"], rows)
        console().print("[green]healthy[/green]" if report.ok else "[red]unhealthy[/red]")
    if not report.ok:
        raise click.exceptions.Exit(1)


@click.command(short_help="Back up one user's memory as JSON lines.")
@user_id_argument
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, allow_dash=True), default="-",
    help="File to write, readable by you only (default: stdout).",
)  # fmt: skip
def export(user_id: str, output: str) -> None:
    """Back up one user's memory as JSON lines: a header, then every message (episode), entity and fact.

    Superseded and archived facts are included (history survives); embeddings are not (they are
    recomputed from the text on import). Works with the embedded fleet stopped. Restore with `engram import`.
    """
    with open_client() as client, _private_output(output) as out:
        lines = client.export_memory(user_id)
        first = next(lines)  # the header: always there, even for a user with no memory
        header = json.loads(first)
        out.writelines(f"{line}\n" for line in (first, *lines))
    click.echo(
        f"exported {count(header['episodes'], 'message')}, {count(header['facts'], 'fact')} and "
        f"{count(header['entities'], 'entity', 'entities')} of {user_id}",
        err=True,
    )


@contextmanager
def _private_output(path: str) -> Iterator[IO[str]]:
    """stdout for "-", else ``path`` opened for writing with mode 0600 (an export holds every message)."""
    if path == "-":
        with click.open_file("-", "w") as stdout:  # stdout, left open
            yield stdout
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        yield out


@click.command("import", short_help="Restore a user's memory from an export.")
@click.argument("file", type=click.File("r"))
@json_option
def import_(file: IO[str], as_json: bool) -> None:
    """Restore the memory in FILE (written by `engram export`; - reads stdin) into its user.

    The user must hold no other messages (run `engram forget-user` first to replace them). Every line is
    checked before anything is written; an interrupted import is finished by running it again.
    """
    with open_client() as client:
        result = client.import_memory(file)
    if as_json:
        emit_json(result)
    else:
        skipped = f" ({result.skipped} already there)" if result.skipped else ""
        click.echo(
            f"imported {result.user_id}: {count(result.episodes, 'message')}{skipped}, {count(result.facts, 'fact')}, "
            f"{count(result.entities, 'entity', 'entities')} (graph version {result.version})"
        )


COMMANDS = [recall, search, context, history, graph, stats, forget, forget_user, health, export, import_]
