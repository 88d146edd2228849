"""API keys of the gateway: minting, hashed lookup, scopes and user-id namespaces.

Invariants:
- Only SHA-256 digests of keys are configured (``ENGRAM_API_KEYS``); a key is 32 random bytes, so a fast
  hash is enough (nothing to brute-force) and lookup is one dict access on the digest.
- A key is bound to scopes (read, write, operator) and to a namespace: it may only name user ids
  ``<namespace>.<rest>``. Namespaces cannot contain '.', so a user id belongs to exactly one namespace and
  the check is a pure function of the id string: it answers the same whether or not the user exists (no
  existence oracle). ``*`` (every user) is for operator keys.
- A gateway configured as one cell (``ENGRAM_CELL_INDEX`` of ``ENGRAM_CELL_COUNT``) checks the user's cell
  after the namespace: another cell's user is ``WrongCellError`` (421, naming the right cell), so a
  router's mistake is refused before anything is read or written here, never written into this stack.
- With no key configured the gateway is in local mode: every caller is the ``local`` principal (all scopes,
  every namespace), and ``engram serve`` refuses to listen anywhere but loopback.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace

from engram_api.cells import Cell
from engram_api.errors import ConfigError, EngramError
from engram_api.models import check_user_id
from engram_api.settings import ApiKeySpec, Scope

__all__ = [
    "KEY_PREFIX",
    "LOOPBACK",
    "AccessDeniedError",
    "KeyRing",
    "Principal",
    "check_bind",
    "digest",
    "mint_key",
]

KEY_PREFIX = "egk_"
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
ALL_SCOPES: frozenset[Scope] = frozenset({"read", "write", "operator"})


class AccessDeniedError(EngramError):
    """Missing or unknown key (``status`` 401), or a key without the scope / namespace asked for (403)."""

    def __init__(self, status: int, problem: str, *, field: str | None = None) -> None:
        self.status = status
        self.field = field
        super().__init__(problem)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def mint_key(name: str, scopes: Iterable[str], namespace: str) -> tuple[str, ApiKeySpec]:
    """A new secret and the entry to add to ``ENGRAM_API_KEYS`` (validated like configured ones)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    spec = ApiKeySpec(name=name, sha256=digest(key), scopes=frozenset(scopes), namespace=namespace)  # type: ignore[arg-type]
    return key, spec


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's name, what it may do and which users it may touch."""

    name: str
    scopes: frozenset[Scope]
    namespace: str
    cell: Cell | None = None  # this gateway's cell: another cell's user is refused (421), whatever the key

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise AccessDeniedError(403, f"key {self.name!r} lacks the {scope!r} scope")

    def owns(self, user_id: str) -> bool:
        return self.namespace == "*" or user_id.startswith(f"{self.namespace}.")

    def user(self, user_id: object, field: str = "user_id") -> str:
        """The validated user id, if this key may touch it; else a typed error naming ``field``."""
        uid = check_user_id(user_id, field)
        if not self.owns(uid):
            raise AccessDeniedError(
                403, f"user ids of key {self.name!r} start with {self.namespace + '.'!r}", field=field
            )
        if self.cell is not None:
            self.cell.check(uid, field)
        return uid


LOCAL = Principal(name="local", scopes=ALL_SCOPES, namespace="*")


class KeyRing:
    """The configured keys, by digest."""

    def __init__(self, specs: Iterable[ApiKeySpec], cell: Cell | None = None) -> None:
        self._by_digest = {spec.sha256: spec for spec in specs}
        self.cell = cell

    @property
    def local_mode(self) -> bool:
        return not self._by_digest

    def principal(self, key: str | None) -> Principal:
        """The principal of a presented key; 401 when it is missing or unknown (local mode: ``LOCAL``)."""
        if self.local_mode:
            return replace(LOCAL, cell=self.cell)
        if not key:
            raise AccessDeniedError(401, "missing API key (send 'Authorization: Bearer <key>' or 'X-API-Key')")
        spec = self._by_digest.get(digest(key))
        if spec is None:
            raise AccessDeniedError(401, "unknown API key")
        return Principal(name=spec.name, scopes=spec.scopes, namespace=spec.namespace, cell=self.cell)

    def from_headers(self, authorization: str | None, api_key: str | None) -> Principal:
        if api_key:
            return self.principal(api_key)
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer":
                raise AccessDeniedError(401, "Authorization must use the Bearer scheme")
            return self.principal(token.strip())
        return self.principal(None)


def check_bind(host: str, ring: KeyRing) -> None:
    """No key configured: listening anywhere but loopback would give anyone every user's memory."""
    if ring.local_mode and host not in LOOPBACK:
        raise ConfigError(
            "ENGRAM_API_KEYS",
            f"no API key is configured, so the gateway only listens on 127.0.0.1 (asked for {host!r}); "
            "mint a key with `engram keys new`",
        )
