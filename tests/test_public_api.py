"""The public surface of engram_api is deliberate: this list changes only on purpose."""

from __future__ import annotations

import json
import subprocess
import sys

import engram_api

EXPECTED = {
    "AsyncMemoryClient", "BackPressureError", "ChatMessage", "ConfigError", "DeadLetter", "EngramError", "EntityRecord",
    "Extraction", "FactRecord", "ForgetResult", "GraphPage", "HealthReport", "InvalidInputError", "LLMError",
    "MemoryClient", "NotFoundError", "RecallItem", "RecallResult", "Receipt", "SearchResult", "Settings",
    "StoreUnavailableError", "UserStats", "WaitResult", "WaitTimeoutError", "load_settings",
}  # fmt: skip


def test_public_names_are_exactly_the_documented_ones():
    assert set(engram_api.__all__) == EXPECTED
    for name in engram_api.__all__:
        # Each is the project's own class or function, defined where its docs say, under its own name.
        value = getattr(engram_api, name)
        assert value.__module__.startswith("engram_api.") and value.__name__ == name, name


def test_async_client_mirrors_every_sync_method():
    sync = {
        n
        for n in vars(engram_api.MemoryClient)
        if not n.startswith("_") and callable(getattr(engram_api.MemoryClient, n))
    }
    missing = sync - set(vars(engram_api.AsyncMemoryClient))
    assert missing == set()


def test_importing_engram_has_no_side_effects():
    """No connection, no model, no heavy client library at import time."""
    code = (
        "import json, sys, engram_api, engram_workers, beat_schedule\n"
        "heavy = ('celery', 'kombu', 'litellm', 'torch', 'sentence_transformers', 'neo4j', 'faiss')\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(heavy))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []
