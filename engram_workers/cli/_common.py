"""What the command modules share: settings, the client, argument checks and time parsing.

engram_api is imported inside the functions: importing it pulls in numpy and the reader, which
``engram --help`` must not pay for.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from engram_api import MemoryClient
    from engram_api.settings import Settings

__all__ = ["open_client", "parse_time", "settings", "user_id_argument", "user_option"]

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


def parse_time(value: str, field: str) -> datetime:
    """ISO 8601 date or date-time; without a zone it is taken as UTC."""
    from engram_api.errors import InvalidInputError

    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            field, f"expected an ISO 8601 date or time such as 2024-05-01 (got {value[:40]!r})"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
