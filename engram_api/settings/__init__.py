"""Every knob Engram has, read from the environment, declared once.

Seed-compatible names (``NEO4J_URI``, ``REDIS_URL``, ``LLM_MODEL``, ...) are read as they are; every other
setting is ``ENGRAM_<FIELD>``. ``load_settings()`` turns a bad value into a ``ConfigError`` that names the
variable and what it expects, so a mistyped deployment fails at start-up, not at the first message.

Everything is imported from here (``from engram_api.settings import Settings``); each field is declared in
the module of its concern, in the order of docs/configuration.md and .env.example:
- ``services``: Neo4j, Redis (direct, Sentinel, TLS), the LLM endpoint, the encoder, the data folder;
- ``ingest``: LLM call discipline, input limits (``MAX_BATCH_CAP``, ``MAX_TURNS_CAP``), delivery, worker
  processes;
- ``recall``: recall scoring and graph expansion, the Neo4j pool, FAISS indexes, snapshots, caches;
- ``operations``: maintenance jobs and Beat intervals, middleware hooks, observability;
- ``gateway``: the HTTP / MCP gateway, its keys (``ApiKeySpec``, ``Scope``), cells;
- ``core``: ``Settings`` joined from those sections, the credentials (``secrets``, ``EXAMPLE_PASSWORDS``),
  ``load_settings`` and ``variable_for``.
"""

from __future__ import annotations

from engram_api.settings.core import EXAMPLE_PASSWORDS, Settings, load_settings, variable_for
from engram_api.settings.gateway import ApiKeySpec, Scope
from engram_api.settings.ingest import MAX_BATCH_CAP, MAX_TURNS_CAP

__all__ = [
    "EXAMPLE_PASSWORDS",
    "MAX_BATCH_CAP",
    "MAX_TURNS_CAP",
    "ApiKeySpec",
    "Scope",
    "Settings",
    "load_settings",
    "variable_for",
]
