"""Credential redaction for everything Engram shows, logs or stores: URLs, provider errors, reasons.

Invariant: text that leaves a process (a health report, a log line, a dead-letter reason, a retry
reason) passes through ``redact`` first. It removes the password of any ``scheme://user:password@host``
URL, bearer tokens, ``api_key=...``-style assignments, provider key shapes (``sk-...``, ``AKIA...``)
and the exact values of the secrets configured in ``Settings`` (which may have any shape).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

__all__ = ["MASK", "RedactingFilter", "mask_userinfo", "redact"]

MASK = "***"

# Anchored on "://" (a literal the engine searches for), not on the scheme: a scheme-first pattern restarts
# at every character of a long run of letters and rescans it, quadratic in the run (20,000 letters took
# seconds). The scheme never mattered to what is masked; user and password stop at '/' and whitespace, so
# each character is scanned by at most one attempt: linear in the text.
_URL_PASSWORD = re.compile(r"(?P<head>://[^/\s:@]*:)[^@\s/]+(?=@)")
_BEARER = re.compile(r"(?P<head>\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.I)
_ASSIGNED = re.compile(
    r"(?P<head>\b(?:api[_-]?key|access[_-]?token|secret|password|passwd|token)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}&]{4,}",
    re.I,
)
_KEY_SHAPES = re.compile(r"\b(?:sk-[A-Za-z0-9_-]{8,}|(?:AKIA|ASIA)[A-Z0-9]{12,}|xox[abp]-[A-Za-z0-9-]{8,})")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every credential it carries replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:  # a 1-3 character "secret" would mask half of every message
            text = text.replace(secret, MASK)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _BEARER.sub(lambda m: m.group("head") + MASK, text)
    text = _ASSIGNED.sub(lambda m: m.group("head") + MASK, text)
    return _KEY_SHAPES.sub(MASK, text)


def mask_userinfo(url: str) -> str:
    """A URL as it may be shown: whatever precedes its last '@' after the scheme (user and password) is
    masked, even when the URL is malformed (``redact`` only recognizes a well-formed ``//user:pw@``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    return f"{scheme}{sep}{MASK}@{rest.rsplit('@', 1)[1]}"


class RedactingFilter(logging.Filter):
    """A log filter that redacts each record's final message (arguments included) in place."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.secrets)
            record.exc_info = None
        return True
