"""The message ledger owns the Redis wire contract: no module outside ``engram_api/ledger`` carries Lua
text, and no module outside ``engram_api/keys.py`` spells an Engram key (an ``engram:`` literal, or an
f-string over a ``keys.*PREFIX``). A static check over the shipped packages' sources, and a check that the
checker itself catches each kind of offence."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engram_api", "engram_workers", "engram_gateway", "engram_testing")
LEDGER = Path("engram_api/ledger")
KEYS = Path("engram_api/keys.py")
LUA_MARKERS = ("redis.call(", "redis.pcall(", "KEYS[", "ARGV[")


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _prefix_fstring(node: ast.JoinedStr) -> bool:
    """An f-string that interpolates one of keys' prefixes (``keys.PREFIX``, ``keys.STATUS_PREFIX``, ...)."""
    for part in node.values:
        if isinstance(part, ast.FormattedValue):
            value = part.value
            name = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
            if name.endswith("PREFIX"):
                return True
    return False


def offences(source: str, path: Path) -> list[str]:
    """What ``source`` (the file at ``path``, relative to the repository) does that only the ledger or
    keys.py may do."""
    tree = ast.parse(source)
    found = []
    in_ledger = path.is_relative_to(LEDGER)
    for text in _strings(tree):
        if not in_ledger and any(marker in text for marker in LUA_MARKERS):
            found.append(f"{path}: Lua text {text.strip()[:60]!r}")
        if path != KEYS and text.startswith("engram:"):
            found.append(f"{path}: key literal {text[:60]!r}")
    if path != KEYS:
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr) and _prefix_fstring(node):
                found.append(f"{path}:{node.lineno}: a key built from a keys prefix")
    return found


def test_no_lua_text_or_key_spelling_outside_the_ledger_and_keys() -> None:
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    files.append(ROOT / "beat_schedule.py")
    assert len(files) > 100  # premise: the packages were found
    found = [o for p in files for o in offences(p.read_text(), p.relative_to(ROOT))]
    assert found == []


def test_the_check_catches_lua_and_key_spellings_elsewhere() -> None:
    elsewhere = Path("engram_workers/stages/common.py")
    lua = "S = \"if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end\"\n"
    literal = 'LOCK = "engram:lock:x"\n'
    built = "from engram_api import keys\nK = f'{keys.PREFIX}:msg:{uid}'\nS = f'{keys.STATUS_PREFIX}*'\n"
    assert len(offences(lua, elsewhere)) == 1 and offences(lua, LEDGER / "scripts.py") == []
    assert len(offences(literal, elsewhere)) == 1 and offences(literal, KEYS) == []
    assert len(offences(built, elsewhere)) == 2 and offences(built, KEYS) == []
    assert offences('URN = "urn:engram:problem:x"\nS = f"{user_id}:{message_id}"\n', elsewhere) == []
