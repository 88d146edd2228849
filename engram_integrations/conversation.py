"""One conversation session remembered in Engram: what the framework adapters share.

Invariants:
- Each ``add`` is ONE Engram message holding that exchange's turns (``{role, content}``), with a message id
  unique to this session object (``<session>:<token>:<n>``) and ``metadata.session`` = the session id, so
  two objects for one session id never collide and a message says which session it came from. The
  session's last turns go along as ``earlier`` (context the extractor reads but never extracts from).
- ``turns`` is this session's short-term transcript, held in the process; what outlives the session is
  what the workers extracted and the turns themselves as episodes, read back with ``context``.
- ``forget`` erases this session's messages from Engram (facts only they stated, their excerpts, queued
  payloads) and empties ``turns``; memory from other sessions stays.
- Bad input (a role Engram does not know, an empty exchange) is the producer's ``InvalidInputError``:
  nothing is enqueued and ``turns`` is unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from engram_api import MemoryClient
from engram_api.errors import NotFoundError
from engram_api.models import Receipt, WaitResult

__all__ = ["ConversationMemory"]

EARLIER_TURNS = 6  # the session's last turns the extractor sees as context of a new exchange


class ConversationMemory:
    def __init__(self, client: MemoryClient, user_id: str, session_id: str, *, owner_name: str | None = None) -> None:
        self.client = client
        self.user_id = user_id
        self.session_id = session_id
        self.owner_name = owner_name
        self.turns: list[dict[str, Any]] = []
        self.receipts: list[Receipt] = []
        self._token = uuid.uuid4().hex[:8]

    def add(self, turns: Sequence[Mapping[str, Any]]) -> Receipt:
        """Enqueue one exchange (``{role, content[, name]}`` turns; returns at once, the workers extract it) and
        keep its turns."""
        exchange = [dict(turn) for turn in turns]
        receipt = self.client.enqueue(
            self.user_id,
            exchange,
            message_id=f"{self.session_id}:{self._token}:{len(self.receipts)}",
            metadata={"session": self.session_id},
            owner_name=self.owner_name,
            earlier=self.turns[-EARLIER_TURNS:] or None,
        )
        self.turns.extend(exchange)
        self.receipts.append(receipt)
        return receipt

    def context(self, query: str, max_tokens: int = 800) -> str:
        """What Engram remembers about the user that bears on ``query``, as a prompt block ("" when nothing)."""
        return self.client.get_context(self.user_id, query, max_tokens)

    def wait(self, timeout: float = 60.0) -> WaitResult:
        """Block until this session's messages are applied (demos and tests; a chat app moves on)."""
        return self.client.wait(self.receipts, timeout=timeout)

    def forget(self) -> int:
        """Erase this session's messages from Engram; returns how many were still there."""
        forgotten = 0
        for receipt in self.receipts:
            try:
                self.client.forget(self.user_id, receipt.message_id)
                forgotten += 1
            except NotFoundError:  # already forgotten (by id, or with the whole user)
                pass
        self.turns.clear()
        self.receipts.clear()
        return forgotten
