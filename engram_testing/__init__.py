"""Development-only helpers for tests, benchmarks and chaos scenarios: the LLM stand-in (an
OpenAI-compatible HTTP server with scripted answers) and the Neo4j launcher manager.

Not part of the wheel (``pyproject.toml`` packages only ``engram_api`` and ``engram_workers``): it is
imported from the source tree's root, where pytest, ``ops/bench`` and ``ops/chaos`` run. Nothing in the
runtime packages may import it.

Importing this package starts nothing; the classes load on first use::

    from engram_testing import LLMStandin, Neo4jServer, Reply
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram_testing.llm_standin import LLMStandin
    from engram_testing.llm_standin_replies import Reply, approx_tokens
    from engram_testing.neo4j_server import Neo4jServer

__all__ = ["LLMStandin", "Neo4jServer", "Reply", "approx_tokens"]

_LAZY = {
    "LLMStandin": "engram_testing.llm_standin",
    "Reply": "engram_testing.llm_standin_replies",
    "approx_tokens": "engram_testing.llm_standin_replies",
    "Neo4jServer": "engram_testing.neo4j_server",
}


def __getattr__(name: str) -> Any:
    # Lazy: worker processes import ``Reply`` helpers without loading the HTTP server or Neo4j code.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
