"""Writes docs/configuration.md from engram_api.settings.Settings (the one place settings are declared).

Run: python ops/gen_config_docs.py   (tests/test_docs.py fails when the file is out of date)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engram_api.settings import Settings, variable_for  # noqa: E402

HEADER = """# Configuration reference

Every setting Engram has, generated from `engram_api/settings/` by `python ops/gen_config_docs.py`.
Seed-compatible names (`NEO4J_URI`, `REDIS_URL`, `LLM_MODEL`, ...) are read as they are; the rest are
`ENGRAM_<NAME>`. A wrong value stops the process at start-up with a message naming the variable.
With nothing set, Engram runs embedded: SQLite graph store, a local Redis started by `engram up` / `engram demo`,
the offline rule-based extractor, and the bundled MiniLM embeddings.

| variable | default | meaning |
| --- | --- | --- |
"""


def render() -> str:
    rows = []
    for name, field in Settings.model_fields.items():
        if field.default_factory is not None:
            default = "(per user)"
        else:
            default = "" if field.default is None else f"`{field.default}`"
        rows.append(f"| `{variable_for(name)}` | {default} | {field.description or ''} |")
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    (ROOT / "docs" / "configuration.md").write_text(render())
    print("wrote docs/configuration.md")
