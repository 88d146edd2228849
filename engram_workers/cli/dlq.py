"""``engram dlq``: messages the pipeline gave up on, with the reason; replay them or drop them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from engram_workers.cli._common import open_client, user_option
from engram_workers.cli._output import clip, count, emit_json, fmt_time, json_option, table

if TYPE_CHECKING:
    from engram_api import MemoryClient
    from engram_api.models import DeadLetter

__all__ = ["COMMANDS"]

_REASON_WIDTH = 120


@click.group(short_help="List, replay or drop dead-lettered messages.")
def dlq() -> None:
    """Dead letters: messages that failed extraction or apply for good."""


@dlq.command("list")
@user_option("Only this user's dead letters (repeatable).")
@click.option("--full", is_flag=True, help="Show whole reasons (else the first line, up to 120 characters).")
@json_option
def list_(user_ids: tuple[str, ...], full: bool, as_json: bool) -> None:
    """List dead letters, oldest first."""
    with open_client() as client:
        letters = _letters(client, user_ids)
    if as_json:
        emit_json(letters)
        return
    rows = [
        (
            fmt_time(letter.failed_at),
            letter.user_id,
            letter.message_id,
            letter.stage,
            letter.attempts,
            letter.reason if full else clip(letter.reason, _REASON_WIDTH),
        )
        for letter in letters
    ]
    table("dead letters", ["failed at", "user", "message", "stage", "attempts", "reason"], rows)


@dlq.command()
@click.argument("user_id", required=False)
@click.argument("message_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Replay every dead letter (of --user, if given).")
@user_option("With --all: only this user's (repeatable).")
@json_option
def replay(user_id: str | None, message_id: str | None, all_: bool, user_ids: tuple[str, ...], as_json: bool) -> None:
    """Put a dead letter back on the queue: USER_ID MESSAGE_ID, or --all."""
    with open_client() as client:
        targets = _targets(client, user_id, message_id, all_, user_ids)
        receipts = [client.replay(uid, mid) for uid, mid in targets]
    if as_json:
        emit_json(receipts)
    else:
        click.echo(f"replayed {count(len(receipts), 'message')}")


@dlq.command()
@click.argument("user_id", required=False)
@click.argument("message_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Drop every dead letter (of --user, if given).")
@user_option("With --all: only this user's (repeatable).")
@click.option("--yes", is_flag=True, help="With --all: do not ask for confirmation.")
@json_option
def drop(
    user_id: str | None, message_id: str | None, all_: bool, user_ids: tuple[str, ...], yes: bool, as_json: bool
) -> None:
    """Discard a dead letter for good: USER_ID MESSAGE_ID, or --all."""
    with open_client() as client:
        targets = _targets(client, user_id, message_id, all_, user_ids)
        if all_ and targets and not yes:
            click.confirm(f"Drop {count(len(targets), 'dead letter')} for good?", abort=True, err=True)
        dropped = [f"{uid}:{mid}" for uid, mid in targets if client.drop_dead_letter(uid, mid)]
    if as_json:
        emit_json({"dropped": dropped})
    else:
        click.echo(f"dropped {count(len(dropped), 'dead letter')}")


def _letters(client: MemoryClient, user_ids: tuple[str, ...]) -> list[DeadLetter]:
    """Every dead letter, or only these users' (each user's read from its own index), oldest first."""
    if not user_ids:
        return client.dead_letters()
    return sorted((d for uid in dict.fromkeys(user_ids) for d in client.dead_letters(uid)), key=lambda d: d.failed_at)


def _targets(
    client: MemoryClient, user_id: str | None, message_id: str | None, all_: bool, user_ids: tuple[str, ...]
) -> list[tuple[str, str]]:
    from engram_api.errors import NotFoundError
    from engram_api.models import check_message_id, check_user_id

    if all_:
        if user_id or message_id:
            raise click.UsageError("give USER_ID MESSAGE_ID or --all, not both")
        return [(d.user_id, d.message_id) for d in _letters(client, user_ids)]
    if not (user_id and message_id):
        raise click.UsageError("give USER_ID MESSAGE_ID, or --all")
    if user_ids:
        raise click.UsageError("--user goes with --all")
    check_user_id(user_id)
    check_message_id(message_id)
    if client.producer.ledger.dead_letters.get(user_id, message_id) is None:
        raise NotFoundError(f"no dead letter {message_id!r} for user {user_id!r}")
    return [(user_id, message_id)]


COMMANDS = [dlq]
