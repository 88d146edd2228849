"""What the command modules share: settings, the client, argument checks and time parsing.

engram_api is imported inside the functions: importing it pulls in numpy and the reader, which
``engram --help`` must not pay for.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from engram_api import MemoryClient
    from engram_api.settings import Settings

__all__ = ["TIME_HELP", "open_client", "parse_time", "settings", "user_id_argument", "user_option"]

F = TypeVar("F", bound=Callable[..., Any])


def settings() -> Settings:
    from engram_api.settings import load_settings

    return load_settings()


def open_client(redis_url: str | None = None) -> MemoryClient:
    from engram_api import MemoryClient

    return MemoryClient(settings=settings(), redis_url=redis_url)


def _check_user(_: click.Context, param: click.Parameter, value: Any) -> Any:
    # Checked before any service is touched, so a typo fails at once with the library's own message.
    from engram_api.models import check_user_id

    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(check_user_id(v, param.name or "user_id") for v in value)
    return check_user_id(value, param.name or "user_id")


def user_id_argument(fn: F) -> F:
    return click.argument("user_id", callback=_check_user)(fn)


def user_option(help_text: str) -> Callable[[F], F]:
    """A repeatable ``--user``; no value means every user."""
    return click.option("--user", "user_ids", multiple=True, callback=_check_user, metavar="USER_ID", help=help_text)


TIME_HELP = (
    "an ISO 8601 date or time (2024-05-01, 2024-05-01T14:30, 2024-05-01T14:30+02:00); without a zone it is local time."
)


def parse_time(value: str, field: str) -> datetime:
    """The one rule for every CLI date option: an ISO 8601 date or date-time; a date means its local midnight
    and a time without a zone is local time (as a person typing it means it)."""
    from engram_api.errors import InvalidInputError

    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidInputError(field, f"expected {TIME_HELP.split(';')[0]} (got {value[:40]!r})") from None
    # astimezone() on a naive datetime reads it in the machine's local zone.
    return parsed if parsed.tzinfo is not None else parsed.astimezone()
