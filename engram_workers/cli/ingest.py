"""``engram enqueue``: put messages on the queue, one from the arguments or many from JSON lines."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import click

from engram_workers.cli._common import TIME_HELP, open_client, parse_time
from engram_workers.cli._output import emit_json, err_console, table

if TYPE_CHECKING:
    from rich.progress import Progress

    from engram_api import MemoryClient
    from engram_api.models import Envelope, Receipt, WaitResult

__all__ = ["COMMANDS", "enqueue_envelopes", "read_jsonl", "wait_with_progress"]


def _reject_constant(name: str) -> None:
    # Python's json accepts NaN and Infinity, which no other JSON reader (nor a metadata value) should see.
    raise ValueError(f"{name} is not JSON")


def read_jsonl(stream: IO[str], client: MemoryClient) -> list[Envelope]:
    """Parse and validate every line before anything is published: a bad line 900 enqueues nothing."""
    from engram_api.errors import InvalidInputError
    from engram_api.producer import build_envelope

    envelopes = []
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line, parse_constant=_reject_constant)
        except ValueError as exc:
            raise InvalidInputError(f"line {number}", f"not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise InvalidInputError(f"line {number}", "must be a JSON object")
        unknown = set(item) - {"user_id", "text", "messages", "message_id", "timestamp", "metadata"}
        if unknown:
            raise InvalidInputError(f"line {number}", f"unknown keys {sorted(unknown)}")
        if ("text" in item) == ("messages" in item):
            raise InvalidInputError(f"line {number}", 'needs exactly one of "text" or "messages"')
        timestamp: Any = item.get("timestamp")
        if isinstance(timestamp, str):
            timestamp = parse_time(timestamp, f"line {number}.timestamp")
        try:
            envelopes.append(
                build_envelope(
                    client.settings,
                    item.get("user_id"),
                    item["text"] if "text" in item else item["messages"],
                    message_id=item.get("message_id"),
                    timestamp=timestamp,
                    metadata=item.get("metadata"),
                )
            )
        except InvalidInputError as exc:
            raise InvalidInputError(f"line {number}.{exc.field}", exc.problem) from None
    return envelopes


def _progress() -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console(),
        transient=False,
    )


def enqueue_envelopes(client: MemoryClient, envelopes: Sequence[Envelope]) -> list[Receipt]:
    receipts = []
    with _progress() as progress:
        task = progress.add_task("enqueue", total=len(envelopes))
        for envelope in envelopes:
            receipts.append(client.producer.submit(envelope))
            progress.advance(task)
    return receipts


def wait_with_progress(client: MemoryClient, receipts: Sequence[Receipt], timeout: float) -> WaitResult:
    """A bar of applied (or dead-lettered) messages; raises ``WaitTimeoutError`` (exit 2) naming the real
    time waited when messages are still pending after ``timeout`` seconds."""
    with _progress() as progress:
        task = progress.add_task("apply", total=len(receipts))
        return client.producer.wait(
            receipts, timeout, on_progress=lambda finished, _: progress.update(task, completed=finished)
        )


@click.command(short_help="Queue messages: text, a JSON lines file or stdin.")
@click.argument("user_id", required=False)
@click.argument("text", required=False)
@click.option(
    "--file",
    "-f",
    "source",
    type=click.File("r"),
    help='JSON lines, one message each: {"user_id", "text" or "messages", "message_id"?, "timestamp"?, '
    '"metadata"?} (metadata: an object of str/number/bool values). "-" reads stdin.',
)
@click.option("--message-id", help="Idempotency key of the message (default: random).")
@click.option("--timestamp", help=f"When the message was said: {TIME_HELP} Default: now.")
@click.option("--wait", "wait_", is_flag=True, help="Block until every message is applied or dead-lettered.")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=0), help="Seconds --wait waits.")
@click.option("--json", "as_json", is_flag=True, help="Print the receipts (and the wait result) as JSON.")
def enqueue(
    user_id: str | None,
    text: str | None,
    source: IO[str] | None,
    message_id: str | None,
    timestamp: str | None,
    wait_: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Queue messages for the workers: USER_ID TEXT (TEXT "-" reads stdin), or --file of JSON lines.

    Returns as soon as the messages are queued unless --wait is given. A message id that was already
    queued is not queued twice (reported as a duplicate).
    """
    from engram_api.errors import InvalidInputError
    from engram_api.producer import build_envelope

    if (source is None) == (user_id is None):
        raise click.UsageError("give USER_ID TEXT or --file, not both and not neither")
    if source is not None and (message_id or timestamp):
        raise click.UsageError("--message-id and --timestamp go with USER_ID TEXT; in a file they are per line")
    with open_client() as client:
        if source is not None:
            envelopes = read_jsonl(source, client)
            if not envelopes:
                raise InvalidInputError("file", "has no messages")
        else:
            if text is None:
                raise click.UsageError("missing TEXT (or use --file)")
            when = parse_time(timestamp, "timestamp") if timestamp else None
            body = sys.stdin.read() if text == "-" else text
            envelopes = [build_envelope(client.settings, user_id, body, message_id=message_id, timestamp=when)]
        receipts = (
            enqueue_envelopes(client, envelopes) if len(envelopes) > 1 else [client.producer.submit(envelopes[0])]
        )
        result = wait_with_progress(client, receipts, timeout) if wait_ else None
    if as_json:
        emit_json({"receipts": receipts, "wait": result})
    else:
        duplicates = sum(r.duplicate for r in receipts)
        if len(receipts) == 1:
            r = receipts[0]
            state = "already queued" if r.duplicate else "queued"
            click.echo(f"{state}: user {r.user_id}, message {r.message_id}, task {r.task_id}")
        else:
            click.echo(f"queued {len(receipts) - duplicates} messages ({duplicates} duplicates skipped)")
        if result is not None:
            click.echo(f"applied {len(result.applied)}, dead-lettered {len(result.dead_lettered)}")
            if result.dead_lettered:
                table("dead-lettered (see `engram dlq list`)", ["message id"], [(m,) for m in result.dead_lettered])
    if result is not None and result.dead_lettered:
        raise click.exceptions.Exit(1)


COMMANDS = [enqueue]
