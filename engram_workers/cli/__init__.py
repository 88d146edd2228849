"""The ``engram`` command line: run the fleet, feed it, read memory back, operate it.

Every command module imports only click at import time; Celery, torch, litellm and the stores are
imported inside the commands that need them, so ``engram --help`` answers at once.

Errors end as one line on stderr (``error: ...``), credentials redacted: exit code 2 for bad input or configuration (and any
other ``EngramError``), 1 for anything unexpected. ``ENGRAM_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from engram_workers.cli import demo, dlq, gateway, ingest, maintenance, memory, migrate, ops, probe

__all__ = ["main"]


def _is_engram_error(exc: BaseException) -> bool:
    # An EngramError can only exist once engram_api is loaded: no import on the happy path.
    errors = sys.modules.get("engram_api.errors")
    return errors is not None and isinstance(exc, errors.EngramError)


def _debug_and_secrets() -> tuple[bool, tuple[str, ...]]:
    """ENGRAM_DEBUG and the configured secrets, through Settings; settings too broken to load cannot ask
    for a traceback (and their error already hides what it must)."""
    from engram_api.errors import ConfigError
    from engram_api.settings import load_settings

    try:
        current = load_settings()
    except ConfigError:
        return False, ()
    return current.debug, current.secrets


class EngramGroup(click.Group):
    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any) -> Any:  # type: ignore[override]
        extra.pop("standalone_mode", None)
        try:
            code = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        except click.exceptions.NoArgsIsHelpError as exc:
            # `engram` or `engram dlq` alone: the help is the answer, not an error.
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.ClickException as exc:
            hint = ""
            if isinstance(exc, click.UsageError) and exc.ctx is not None:
                hint = f" (see `{exc.ctx.command_path} --help`)"
            click.echo(f"error: {exc.format_message()}{hint}", err=True)
            sys.exit(exc.exit_code)
        except Exception as exc:
            debug, secrets = _debug_and_secrets()
            if debug:
                raise
            from engram_api.redaction import redact

            # One line, always: a driver's message may span several (Neo4j's "Couldn't connect ...:\n...").
            # Redacted: a driver or provider error may quote a URL with its password, or a key.
            message = redact(" ".join(str(exc).split()), secrets)
            if _is_engram_error(exc):
                click.echo(f"error: {message}", err=True)
                sys.exit(2)
            click.echo(f"error: {type(exc).__name__}: {message}", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=EngramGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="engram", prog_name="engram")
def main() -> None:
    """Engram: durable memory ingestion for AI chat apps.

    Start with `engram demo`. With nothing configured everything is embedded (Redis, SQLite graph,
    offline extractor, data in your user data directory; ENGRAM_DATA_DIR to choose); set REDIS_URL, NEO4J_URI and LLM_MODEL to use real services.
    """


for command in (
    *demo.COMMANDS,
    *ingest.COMMANDS,
    *memory.COMMANDS,
    *ops.COMMANDS,
    *dlq.COMMANDS,
    *maintenance.COMMANDS,
    *gateway.COMMANDS,
    *probe.COMMANDS,
    *migrate.COMMANDS,
):
    main.add_command(command)
del command
