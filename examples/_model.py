"""The chat model the examples talk to: any litellm model, named by ``CHAT_MODEL`` (``CHAT_API_BASE`` and
``CHAT_API_KEY`` for an OpenAI-compatible server). The test suite points it at the LLM stand-in. Engram
itself needs no model here: its workers extract with ``LLM_MODEL``, or with the offline rules without one."""

from __future__ import annotations

import os
import sys

import litellm


def complete(messages: list[dict[str, str]]) -> str:
    """The model's answer to ``messages`` (``{role, content}``, OpenAI style)."""
    model = os.environ.get("CHAT_MODEL")
    if not model:
        sys.exit("set CHAT_MODEL (a litellm model, e.g. gpt-4o-mini, or openai/<name> with CHAT_API_BASE)")
    response = litellm.completion(
        model=model,
        messages=messages,
        api_base=os.environ.get("CHAT_API_BASE") or None,
        api_key=os.environ.get("CHAT_API_KEY") or None,
        timeout=60,
    )
    return response.choices[0].message.content or ""
