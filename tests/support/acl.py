"""The ACL users docs/operations.md ("Access control") documents, read from its ``ACL SETUSER`` block, so a
test runs a deployment with exactly what the docs tell an operator to create."""

from __future__ import annotations

from pathlib import Path

__all__ = ["documented_acl"]

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented_acl(db: int, deployment: str = "") -> dict[str, list[str]]:
    """The ``ACL SETUSER`` arguments by user for database ``db`` (each user's password is ``<user>-pw``).
    With ``deployment`` (an ENGRAM_REDIS_KEY_PREFIX) every key and channel pattern gets ``<deployment>:``
    after its ``~`` or ``&``, as the docs say, and each user's name ``<deployment>-`` before it."""
    text = OPERATIONS.read_text().split("**Access control.**", 1)[1].split("```", 2)[1]
    users = {}
    for line in text.strip().splitlines():
        words = line.replace("<db>", str(db)).split()
        assert words[:2] == ["ACL", "SETUSER"], line
        user = f"{deployment}-{words[2]}" if deployment else words[2]
        rules = [w.replace("<password>", f"{user}-pw") for w in words[3:]]
        if deployment:
            rules = [f"{w[0]}{deployment}:{w[1:]}" if w[:1] in ("~", "&") else w for w in rules]
        users[user] = [user, *rules]
    return users
