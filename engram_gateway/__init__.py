"""Engram's network face: the versioned HTTP API and the MCP server (``engram serve``).

The gateway only validates, enqueues and reads through ``engram_api`` (``MemoryClient``); it never calls
an LLM or waits for extraction. Keys, scopes and user-id namespaces: ``engram_gateway.auth``.
"""

from engram_gateway.app import create_app, serve
from engram_gateway.service import Gateway

__all__ = ["Gateway", "create_app", "serve"]
