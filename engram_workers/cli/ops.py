"""Run the fleet: ``worker``, ``beat``, ``flower`` (one process each, for containers and systemd) and
``up`` (everything at once on one machine, for development).

Celery runs in this process (``app.start``) rather than behind an exec, so ``worker --metrics-port``
can serve Prometheus metrics from the pool's parent process. Every Celery setting lives with the app
(``engram_workers.app``, ``engram_workers.celery_config``); these commands only choose a stage's queues,
pool and node name, touch the probes' heartbeat and start the process.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from engram_workers.cli._common import settings
from engram_workers.cli._output import err_console

__all__ = ["COMMANDS"]

STAGES = ("extract", "apply", "maintenance", "all")


def _celery(argv: list[str]) -> None:
    """Run a celery sub-command in this process with Engram's app; exit with its code."""
    from engram_workers.app import app

    code = app.start(argv=argv)
    raise click.exceptions.Exit(code or 0)


def _metrics_dir(chosen: Path | None) -> str:
    """prometheus_client's multiprocess directory: pool children write there, the parent serves the sum.

    It must be empty at start (old files would be counted again), so a caller-chosen one is cleared.
    """
    if chosen is None:
        made = tempfile.mkdtemp(prefix="engram-metrics-")
        # Pool children leave through os._exit, so only the parent (the owner) runs this.
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        return made
    chosen.mkdir(parents=True, exist_ok=True)
    for stale in chosen.glob("*.db"):
        stale.unlink()
    return str(chosen)


@click.command(short_help="Run a Celery worker for one stage (or all).")
@click.option(
    "--stage",
    type=click.Choice(STAGES),
    default="all",
    show_default=True,
    help="extract: threads x32; apply: prefork x CPUs (ENGRAM_CPU_LIMIT, else the cgroup quota); maintenance: "
    "prefork x1; all: every queue, prefork x CPUs.",
)
@click.option("--queues", "-Q", help="Comma-separated queues to consume (overrides --stage's).")
@click.option("--pool", type=click.Choice(["prefork", "threads", "solo"]), help="Overrides --stage's pool.")
@click.option("--concurrency", "-c", type=click.IntRange(1, 1024), help="Overrides --stage's concurrency.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), help="Serve Prometheus /metrics on this port.")
@click.option("--hostname", "-n", help="Worker node name (default: <stage>@<host>).")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
def worker(
    stage: str,
    queues: str | None,
    pool: str | None,
    concurrency: int | None,
    metrics_port: int | None,
    hostname: str | None,
    loglevel: str,
) -> None:
    """Run a Celery worker for one stage of the pipeline (or all of them)."""
    from engram_api.connections import resolve_redis_url
    from engram_workers.celery_config import stage_defaults

    current = settings()  # a bad environment fails here with the variable's name, not deep inside Celery
    stage_queues, stage_pool, stage_concurrency = stage_defaults(stage, current.cpu_limit)
    chosen_queues = [q.strip() for q in queues.split(",") if q.strip()] if queues else stage_queues
    if not chosen_queues:
        raise click.BadParameter("no queue given", param_hint="--queues")
    redis_url = resolve_redis_url(current)  # no Redis fails here too, before the heartbeat says a worker runs
    if metrics_port is not None:
        # Before anything imports prometheus_client: it picks multiprocess mode at import, from this variable
        # (inherited by the pool children).
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir(current.metrics_dir)
        from engram_workers import metrics

        metrics.serve(metrics_port, redis_url, current, multiprocess=True)
    from engram_workers.probes import start_heartbeat

    start_heartbeat(stage)  # `engram probe live --role <stage>` reads it
    argv = [
        "worker",
        "--queues", ",".join(chosen_queues),
        "--pool", pool or stage_pool,
        "--concurrency", str(concurrency or stage_concurrency),
        "--hostname", hostname or f"{stage}@%h",
        "--loglevel", loglevel,
    ]  # fmt: skip
    _celery(argv)


@click.command(short_help="Run Celery Beat (maintenance schedule, one leader).")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
def beat(loglevel: str) -> None:
    """Run Celery Beat with Engram's maintenance schedule (decay, hierarchy, weights, reconcile, redeliver).

    Safe to run more than once for availability: a Redis lock elects one leader, the others stand by
    and take over within ~25 s of its death. Intervals come from ENGRAM_*_INTERVAL_S.
    """
    from engram_api.connections import resolve_redis_url
    from engram_workers.probes import start_heartbeat

    # A bad environment or no Redis fails here with the variable's name, not deep inside Celery, and
    # before the heartbeat: a probe must not see a Beat that is not going to run.
    resolve_redis_url(settings())
    start_heartbeat("beat")  # `engram probe live --role beat` reads it
    _celery(["beat", "--loglevel", loglevel])


@click.command(short_help="Run Flower, the Celery dashboard.")
@click.option("--port", default=5555, show_default=True, type=click.IntRange(1, 65535))
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0: all).")
def flower(port: int, address: str) -> None:
    """Run Flower, the Celery dashboard (tasks carry ids only, never message text).

    Basic auth is on when ENGRAM_FLOWER_PASSWORD is set (user: ENGRAM_FLOWER_USER, default "engram").
    """
    current = settings()
    if current.flower_password:
        # Through the environment, not argv: a password on the command line shows in `ps`.
        os.environ["FLOWER_BASIC_AUTH"] = f"{current.flower_user}:{current.flower_password}"
    elif address not in ("127.0.0.1", "localhost", "::1"):
        err_console().print(
            f"[yellow]warning:[/yellow] Flower on {address} without a password; set ENGRAM_FLOWER_PASSWORD"
        )
    _enable_task_events()
    _celery(["flower", f"--port={port}", f"--address={address}"])


def _enable_task_events() -> None:
    """Ask the running workers for task events at once (they send none unless ENGRAM_TASK_EVENTS is on).
    Flower asks too, but first 5 s after its start: a task that ends before would never show."""
    from kombu.exceptions import OperationalError

    from engram_workers.app import app

    try:
        app.control.enable_events()
    except OperationalError as exc:
        err_console().print(
            f"[yellow]warning:[/yellow] cannot reach the broker yet ({exc}); Flower asks again every 5 s"
        )


class _Stop(Exception):
    """SIGTERM, turned into an exception so that `up` unwinds through its finally block."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


@click.command(short_help="Run Redis, workers and Beat locally until Ctrl-C.")
@click.option("--flower/--no-flower", "with_flower", default=False, show_default=True, help="Also run Flower.")
@click.option("--flower-port", default=5555, show_default=True, type=click.IntRange(1, 65535))
@click.option("--extract-concurrency", default=32, show_default=True, type=click.IntRange(1, 1024))
@click.option("--apply-concurrency", default=2, show_default=True, type=click.IntRange(1, 256))
@click.option("--beat/--no-beat", "with_beat", default=True, show_default=True, help="Also run Beat (maintenance).")
@click.option(
    "--gateway/--no-gateway", "with_gateway", default=False, show_default=True, help="Also run `engram serve`."
)
@click.option("--gateway-port", default=8080, show_default=True, type=click.IntRange(1, 65535))
def up(
    with_flower: bool,
    flower_port: int,
    extract_concurrency: int,
    apply_concurrency: int,
    with_beat: bool,
    with_gateway: bool,
    gateway_port: int,
) -> None:
    """Run everything on this machine until Ctrl-C: Redis (embedded unless REDIS_URL is set), an extract
    worker, an apply worker (which also runs maintenance), Beat and optionally Flower and the HTTP/MCP
    gateway (on 127.0.0.1).

    The graph is Neo4j when NEO4J_URI is set (its schema migrated first, as `engram migrate` does), else
    SQLite in ENGRAM_DATA_DIR. Logs go to
    ENGRAM_DATA_DIR/logs. Clients on this machine find the embedded Redis by themselves (its URL, with a
    password generated at each start, is in ENGRAM_DATA_DIR/services.json, readable by this user only).
    """
    from engram_api.redaction import redact
    from engram_workers.cli._local import LocalStack

    current = settings()
    stack = LocalStack(current)
    out = err_console()
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        with out.status("starting Engram..."):
            stack.prepare(out.print)
            url = stack.start_redis(reuse=False)
            stack.start_extract_worker("extract", extract_concurrency)
            stack.start_apply_worker("apply", apply_concurrency)
            if with_beat:
                stack.start_beat()
            if with_flower:
                stack.start_flower(flower_port, "127.0.0.1")
            if with_gateway:
                stack.start_gateway(gateway_port)
            stack.wait_ready()
        out.print(f"redis      {redact(url)}" + ("" if stack.redis_server else " (REDIS_URL)"))
        out.print(f"extract    threads x{extract_concurrency}")
        out.print(f"apply      prefork x{apply_concurrency} (+ maintenance queue)")
        if with_beat:
            out.print("beat       maintenance schedule")
        if with_flower:
            out.print(f"flower     http://127.0.0.1:{flower_port}")
        if with_gateway:
            out.print(f"gateway    http://127.0.0.1:{gateway_port}/v1 (OpenAPI: /docs, MCP: /mcp)")
        graph = current.neo4j_uri or f"SQLite {stack.data_dir / 'graph.sqlite3'}"
        extractor = current.llm_model or "offline rules (LLM_MODEL unset)"
        out.print(
            f"graph      {graph}\nextractor  {extractor}\ndata       {stack.data_dir}\nlogs       {stack.log_dir}"
        )
        out.print(
            '[green]Engram is up.[/green] Try `engram enqueue alice "I live in Austin" --wait`. Ctrl-C (or SIGTERM) stops.'
        )
        while True:
            dead = stack.dead_child()
            if dead is not None:
                raise click.ClickException(f"{dead.name} exited unexpectedly; see {dead.log_path}")
            time.sleep(0.5)
    except (KeyboardInterrupt, _Stop):
        out.print("stopping...")
    finally:
        signal.signal(signal.SIGTERM, previous)
        stack.stop()
    out.print("stopped.")


@click.command(short_help="Stop the `engram up` (or demo) running on this data directory.")
@click.option("--timeout", default=120.0, show_default=True, type=click.FloatRange(1), help="Seconds to wait.")
def down(timeout: float) -> None:
    """Stop every `engram up` and `engram demo` on ENGRAM_DATA_DIR: SIGTERM to each, which then stops
    its workers, Beat, Flower and embedded Redis; after TIMEOUT seconds it is killed and its children
    ended. Also ends whatever a killed `engram up` left running. Exit 0 when nothing runs afterwards.
    """
    from engram_workers.cli._local import describe_reaped
    from engram_workers.services import fleet

    data_dir = settings().data_dir.resolve()
    out = err_console()
    running = fleet.live_supervisors(data_dir)
    for record in running:
        out.print(f"stopping the supervisor pid {record.supervisor.pid} and {len(record.children)} children...")
    supervisors = [record.supervisor for record in running]
    # The supervisors stop their own children on SIGTERM; a stuck one is killed, and reaped below.
    fleet.end_processes(supervisors, grace_s=timeout)
    reaped = fleet.reap_leftovers(data_dir)
    leftovers = [r for r in reaped if r.supervisor not in supervisors]
    if leftovers:
        out.print(describe_reaped(leftovers))
    if not running and not reaped:
        out.print(f"nothing runs on {data_dir}")
        return
    out.print("stopped.")


@click.command("bench", context_settings={"ignore_unknown_options": True}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Run the benchmarks (from a source checkout): python ops/bench/run.py ARGS.

    \b
    ARGS (all optional):
      --quick          small sizes (a few minutes in all)
      --only LIST      comma-separated subset of
                       enqueue,housekeeping,encoder,llm,vectors,gateway,ingest,apply,recall,hosts,seeds,
                       memory,quality
      --store NAME     the deployments' graph store: neo4j (default) or sqlite
      --out DIR        where results, caches and the seeds' venv go (default: bench-results/)
      --datasets DIR   the quality benchmark's data (it is skipped when missing)
      --keep           keep the run's work directory (service data, logs)
      --llm            with --only quality: extract with your own LLM_MODEL (see docs/extraction.md)
      --conversations IDS  quality only: comma-separated LoCoMo sample ids
    See docs/benchmarks.md.
    """
    if args[:1] in (("--help",), ("-h",)):
        click.echo(click.get_current_context().get_help())
        return
    script = Path(__file__).resolve().parents[2] / "ops" / "bench" / "run.py"
    if not script.exists():
        raise click.ClickException(f"{script} not found: benchmarks run from a source checkout")
    raise SystemExit(subprocess.call([sys.executable, str(script), *args]))


COMMANDS = [worker, beat, flower, up, down, bench]
