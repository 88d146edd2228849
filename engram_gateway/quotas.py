"""Per-key quotas of one gateway process, so one tenant cannot starve the others: a request rate and a
number of open MCP sessions.

Invariants:
- Both are counted per key name, in this process (no Redis round trip per request): with N gateway
  replicas behind a load balancer a key gets at most N times the configured figures.
- The rate is GCRA (the generic cell-rate algorithm): requests are admitted ``1/rate`` apart on average,
  with bursts of up to ``burst``; a refused request waits nothing and is answered 429 with the seconds
  after which one would be admitted. It is checked after the key and before the body is read.
- Sessions: one opens when the SDK's answer names its id and closes on the client's DELETE or once idle
  for the SDK's idle timeout (which the ledger shares with the SDK); a key at its cap gets 429 for a new
  session, and its open sessions keep working.
"""

from __future__ import annotations

import math
import threading
import time

from engram_api.errors import EngramError

__all__ = ["KeyRates", "RateLimitedError", "SessionLedger"]


class RateLimitedError(EngramError):
    """A key over its request rate or its open-session cap (429 with ``Retry-After``)."""

    def __init__(self, problem: str, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(problem)

    @property
    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.retry_after_s)))


class KeyRates:
    """GCRA per key name: ``rate`` requests a second on average, bursts of ``burst``; ``rate`` 0 is off."""

    def __init__(self, rate: float, burst: int) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.tolerance = self.interval * max(0, burst - 1)
        self._tat: dict[str, float] = {}  # theoretical arrival time of each key's next request
        self._lock = threading.Lock()

    def admit(self, key: str) -> None:
        """Count one request of ``key``, or raise ``RateLimitedError`` (and count nothing)."""
        if not self.interval:
            return
        now = time.monotonic()
        with self._lock:
            tat = max(self._tat.get(key, now), now)
            early = tat - now - self.tolerance
            if early > 0:
                raise RateLimitedError(
                    f"key {key!r} is over its rate of {1 / self.interval:g} requests a second "
                    "(ENGRAM_GATEWAY_KEY_RATE); nothing was done",
                    early,
                )
            self._tat[key] = tat + self.interval


class SessionLedger:
    """Open MCP sessions per key name; at most ``per_key`` each."""

    def __init__(self, per_key: int, idle_s: float) -> None:
        self.per_key = per_key
        self.idle_s = idle_s
        self._last_seen: dict[str, dict[str, float]] = {}  # key -> session id -> last request
        self._lock = threading.Lock()

    def check_room(self, key: str) -> None:
        """Raise ``RateLimitedError`` when ``key`` already holds ``per_key`` live sessions."""
        now = time.monotonic()
        with self._lock:
            sessions = self._last_seen.get(key, {})
            for sid in [s for s, seen in sessions.items() if now - seen > self.idle_s]:
                del sessions[sid]  # the SDK closed it too: idle for its timeout
            if len(sessions) >= self.per_key:
                oldest = min(sessions.values())
                raise RateLimitedError(
                    f"key {key!r} holds {len(sessions)} open MCP sessions, its cap "
                    "(ENGRAM_GATEWAY_KEY_MCP_SESSIONS): end one (DELETE) or let one go idle",
                    oldest + self.idle_s - now,
                )

    def opened(self, key: str, session_id: str) -> None:
        """The SDK's answer opened ``session_id`` for ``key``."""
        with self._lock:
            self._last_seen.setdefault(key, {})[session_id] = time.monotonic()

    def touched(self, key: str, session_id: str) -> None:
        """A request of ``session_id``; ids the key did not open are not recorded (no growth by guessing)."""
        with self._lock:
            sessions = self._last_seen.get(key, {})
            if session_id in sessions:
                sessions[session_id] = time.monotonic()

    def closed(self, key: str, session_id: str) -> None:
        with self._lock:
            self._last_seen.get(key, {}).pop(session_id, None)
