"""What every contract shares: the id rules, the size limits, the base model and the current time.

Invariants: a user id or message id that passes ``check_user_id`` / ``check_message_id`` is safe in a
Redis key, a file name's hash input and a store query (fail closed, typed ``InvalidInputError``); no user
is called ``GLOBAL_SCOPE``; every datetime a contract accepts from a caller is timezone-aware and is held
in UTC (``check_aware``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from engram_api.errors import InvalidInputError

__all__ = [
    "GLOBAL_SCOPE",
    "HISTORY_LIMIT",
    "HISTORY_MAX_LIMIT",
    "MESSAGE_ID_RE",
    "META_KEYS",
    "META_KEY_CHARS",
    "META_VALUE_CHARS",
    "USER_ID_RE",
    "MessageId",
    "UserId",
    "check_aware",
    "check_message_id",
    "check_user_id",
    "utcnow",
]

USER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$")
MESSAGE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")


# history() answers the latest HISTORY_LIMIT facts unless asked for more; at most HISTORY_MAX_LIMIT, so
# one call never materializes a long-lived subject's whole past.
HISTORY_LIMIT = 100
HISTORY_MAX_LIMIT = 1000

# What one enqueued message may carry besides its text: the producer checks these for Python callers, the
# gateway's request models declare them, so an oversized body fails validation after bounded work.
META_KEYS = 50
META_KEY_CHARS = 64
META_VALUE_CHARS = 1_000

# The scope name of fleet-wide learned weights; no user may be called this.
GLOBAL_SCOPE = "global"


def utcnow() -> datetime:
    return datetime.now(UTC)


def check_user_id(value: object, field: str = "user_id") -> str:
    """Fail closed: a missing, empty or odd user id never reaches a store or a key."""
    if not isinstance(value, str):
        raise InvalidInputError(field, f"must be a string, got {type(value).__name__}")
    if not USER_ID_RE.fullmatch(value):
        raise InvalidInputError(
            field,
            "must be 1-128 characters of letters, digits, '_', '.', '@' or '-', starting with a "
            f"letter or digit (got {value[:40]!r})",
        )
    if value == GLOBAL_SCOPE:
        raise InvalidInputError(field, f"{GLOBAL_SCOPE!r} is reserved")
    return value


def check_message_id(value: object, field: str = "message_id") -> str:
    if not isinstance(value, str) or not MESSAGE_ID_RE.fullmatch(value):
        raise InvalidInputError(
            field, f"must be 1-128 characters of letters, digits, '_', '.', ':', '@' or '-' (got {str(value)[:40]!r})"
        )
    return value


def check_aware(value: datetime | None, field: str = "timestamp") -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(field, "must be timezone-aware (e.g. datetime.now(timezone.utc))")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInputError(field, "is out of range once converted to UTC") from None


UserId = Annotated[str, AfterValidator(check_user_id)]
MessageId = Annotated[str, AfterValidator(check_message_id)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)
