"""Output for people (rich tables on stdout) and for scripts (``--json``), and one-line errors on stderr.

rich is imported on first use, not at import, so ``engram --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "clip",
    "console",
    "count",
    "emit_json",
    "err_console",
    "fail",
    "fmt_time",
    "json_option",
    "table",
    "to_jsonable",
]

F = TypeVar("F", bound=Callable[..., Any])

_consoles: dict[str, Console] = {}


def console() -> Console:
    if "out" not in _consoles:
        from rich.console import Console

        _consoles["out"] = Console()
    return _consoles["out"]


def err_console() -> Console:
    """Progress bars and status spinners go to stderr so that stdout stays parseable."""
    if "err" not in _consoles:
        from rich.console import Console

        _consoles["err"] = Console(stderr=True)
    return _consoles["err"]


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")(fn)


# Vectors are derived data (recomputed from the text by the local embedder) and hundreds of floats long.
_VECTOR_FIELDS = frozenset({"embedding", "centroid"})


def to_jsonable(value: Any) -> Any:
    """pydantic models (and lists/dicts of them) -> plain JSON types, without embedding vectors."""
    if hasattr(value, "model_dump"):
        return to_jsonable(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items() if k not in _VECTOR_FIELDS}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def emit_json(value: Any) -> None:
    click.echo(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 fact', '2 facts', '0 entities' (``plural`` when adding an s is wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def clip(text: str, width: int) -> str:
    """The first line of ``text`` in at most ``width`` characters, cut at a word boundary when there is
    one, with '…' when something was left out."""
    lines = text.splitlines() or [""]
    line = lines[0]
    if len(line) <= width and len(lines) == 1:
        return line
    if len(line) > width:
        cut = line[: width - 1]
        if line[width - 1] != " " and " " in cut:  # the cut fell inside a word: leave the word out
            cut = cut.rsplit(" ", 1)[0]
        line = cut
    return line.rstrip() + "…"


def fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else "-"


def table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str | None = None
) -> None:
    from rich.table import Table

    # On a narrow terminal long cells fold onto several lines: rules between rows keep them one row each.
    grid = Table(
        title=title, caption=caption, title_justify="left", caption_justify="left", header_style="bold",
        show_lines=console().width < 120,
    )  # fmt: skip
    for column in columns:
        grid.add_column(column, overflow="fold")
    empty = True
    for row in rows:
        grid.add_row(*("" if cell is None else str(cell) for cell in row))
        empty = False
    if empty:
        console().print(f"[dim]{title + ': ' if title else ''}nothing to show[/dim]")
        return
    console().print(grid)


def fail(message: str, code: int = 2) -> None:
    """One line on stderr and the exit code; no traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
