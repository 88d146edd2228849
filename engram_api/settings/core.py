"""``Settings``, joined from the sections, with what spans them: credentials, and reading the environment.

Each section (``services``, ``ingest``, ``recall``, ``operations``, ``gateway``) is a plain pydantic model of
its fields and their own checks; ``Settings`` inherits them all and adds pydantic-settings' environment
reading (``ENGRAM_<FIELD>``, or a seed-compatible name the field declares). Invariants:
- the fields are in section order, services first: pydantic collects a class's fields from its last base
  first, so the bases are listed last section first (``tests/test_settings.py`` holds the order, which
  docs/configuration.md and .env.example follow, and that no two sections declare one field);
- ``load_settings()`` turns a bad value into a ``ConfigError`` that names the variable and what it expects,
  and never quotes a credential (a URL that may carry one is quoted masked).
"""

from __future__ import annotations

import re

from pydantic import AliasChoices, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from engram_api.errors import ConfigError
from engram_api.redaction import mask_userinfo
from engram_api.settings.gateway import GatewaySettings
from engram_api.settings.ingest import IngestSettings
from engram_api.settings.operations import OperationsSettings
from engram_api.settings.recall import RecallSettings
from engram_api.settings.services import ServiceSettings

# The sections in the order their fields are read and documented.
SECTIONS = (ServiceSettings, IngestSettings, RecallSettings, OperationsSettings, GatewaySettings)

# Placeholders shipped in .env.example (and other well-known defaults): refused as real passwords.
EXAMPLE_PASSWORDS = frozenset({"change-me-please", "change-me-too", "change-me"})

# Settings whose value is a credential: masked wherever text is shown, logged or stored, never echoed.
_CREDENTIALS = ("llm_api_key", "neo4j_password", "flower_password", "api_key", "redis_sentinel_password")


# No docstring: it would become the description of Settings' JSON schema. The bases are SECTIONS reversed.
class Settings(GatewaySettings, OperationsSettings, RecallSettings, IngestSettings, ServiceSettings, BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_", extra="ignore", populate_by_name=True, frozen=True, env_file=None
    )

    @field_validator("llm_model", "llm_api_key", "llm_api_base", "neo4j_password", "api_key", "redis_sentinel_password")
    @classmethod
    def _blank_is_unset(cls, v: str | None) -> str | None:
        return v or None

    @field_validator("neo4j_password", "flower_password")
    @classmethod
    def _not_an_example(cls, v: str | None) -> str | None:
        # Every Engram process loads settings at start-up, so a deployment that kept .env.example's
        # placeholders refuses to start instead of running with a published password.
        if v is not None and v.strip().casefold() in EXAMPLE_PASSWORDS:
            raise ValueError("is the example password from .env.example: choose your own")
        return v

    @property
    def secrets(self) -> tuple[str, ...]:
        """Configured credentials: masked wherever text is shown, logged or stored (``redaction``)."""
        return tuple(s for s in (getattr(self, name) for name in _CREDENTIALS) if s)


def variable_for(loc: str) -> str:
    # pydantic reports either the field name or the environment alias it was read from.
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        choices = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else []
        if loc == name or loc in choices:
            return choices[0] if choices else f"ENGRAM_{name.upper()}"
    return loc.upper()


# The variables of credentials (never echoed), and of URLs that may carry one (echoed masked).
_SECRET_VARIABLES = frozenset(variable_for(n) for n in _CREDENTIALS)
_URL_VARIABLES = frozenset(variable_for(n) for n in ("redis_url", "neo4j_uri", "llm_api_base"))


def _shown(variable: str, value: object) -> str:
    """How a refused value is quoted in a ``ConfigError``: never a password, even in a malformed URL."""
    if variable in _SECRET_VARIABLES:
        return "(value not shown)"
    if variable in _URL_VARIABLES and isinstance(value, str):
        return f"(got {mask_userinfo(value)!r})"
    return f"(got {value!r})"


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus ``overrides``); a bad value raises ``ConfigError`` naming the variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except SettingsError as exc:  # a list or mapping setting that is not JSON: refused before validation
        named = re.search(r'field "(\w+)"', str(exc))
        field = Settings.model_fields.get(named.group(1)) if named else None
        variable = variable_for(named.group(1) if named else "?")
        expected = f"; expected {field.description}" if field is not None and field.description else ""
        raise ConfigError(variable, f"is not valid JSON ({exc.__cause__ or exc}){expected}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        variable = variable_for(str(err["loc"][0]) if err["loc"] else "?")
        # Where inside a JSON value, e.g. ENGRAM_API_KEYS: "[0].sha256: Field required".
        inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][1:]).lstrip(".")
        raise ConfigError(
            variable, f"{inner + ': ' if inner else ''}{err['msg']} {_shown(variable, err.get('input'))}"
        ) from None
