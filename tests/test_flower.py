"""`engram flower` as an operator meets it: a real Flower process with basic auth, watching a real fleet,
looked at through its HTTP API and in headless Chromium. Task arguments are ids only, never message text."""

from __future__ import annotations

import ast
import base64
import json
import secrets
import struct
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from engram_api import keys
from engram_api.settings import Settings
from engram_workers.celery_config import celery_config
from engram_workers.services.ports import free_port
from tests.support.browser import CHROMIUM, HEADLESS_FLAGS
from tests.support.operator_processes import EventLog, engram_process, wait_until
from tests.support.stack import SETTLE_S, engram_stack

pytestmark = pytest.mark.slow  # a fleet and a Flower process

USER = "ops"
SECRET_TEXT = "My locker code is marmalade-4417 and I live in Lisbon."
STAGE_TASKS = (keys.EXTRACT_TASK, keys.APPLY_TASK)
# Virtual time runs the page's scripts (the tasks table loads over XHR) before the DOM is dumped.
CHROMIUM_FLAGS = [*HEADLESS_FLAGS, "--virtual-time-budget=5000"]


@dataclass(frozen=True)
class Flower:
    port: int
    password: str
    pid: int
    user_id: str
    message_id: str

    def url(self, path: str, *, credentials: bool = False) -> str:
        auth = f"{USER}:{self.password}@" if credentials else ""
        return f"http://{auth}127.0.0.1:{self.port}{path}"

    def get(self, path: str, *, password: str | None = None) -> tuple[int, str]:
        """(status, body) of a GET, with basic auth unless ``password`` is ""."""
        password = self.password if password is None else password
        request = urllib.request.Request(self.url(path))
        if password:
            token = base64.b64encode(f"{USER}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def api(self, path: str) -> Any:
        """The JSON body of an authenticated GET that must succeed."""
        status, body = self.get(path)
        assert status == 200, (path, status, body[:500])
        return json.loads(body)

    def stage_tasks(self) -> dict[str, dict[str, Any]]:
        """This message's extract and apply tasks as Flower's API reports them, by task name."""
        return {
            t["name"]: t
            for t in self.api("/api/tasks").values()
            if t["name"] in STAGE_TASKS and t["args"] and self.message_id in t["args"]
        }


@pytest.fixture(scope="module")
def flower(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flower]:
    """Offline extractor, SQLite, an extract and an apply worker, `engram flower` with a password, and
    one message ingested while Flower watched."""
    password = secrets.token_urlsafe(12)
    with engram_stack(
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("flower"),
        neo4j_uri=None,
        llm_url=None,
        flower_user=USER,
        flower_password=password,
    ) as stack:
        port = free_port()
        with engram_process("flower", ["flower", "--port", str(port)], env=stack.env, log_dir=stack.data_dir) as proc:
            proc.wait_for_log("Visit me at", timeout=60)
            here = Flower(port, password, proc.pid, user_id="", message_id="")
            # Flower knows a worker from its events: once both are listed it hears every task's events.
            wait_until(
                lambda: (
                    {w["hostname"].split("@")[0] for w in here.api("/workers?json=1")["data"]} >= {"extract", "apply"}
                ),
                timeout=30,
                what="Flower to hear both workers",
            )
            receipt = stack.client.enqueue("flower_user", SECRET_TEXT)
            here = replace(here, user_id=receipt.user_id, message_id=receipt.message_id)
            assert stack.client.wait(receipt, timeout=SETTLE_S).applied == [receipt.message_id]
            wait_until(
                lambda: {n for n, t in here.stage_tasks().items() if t["state"] == "SUCCESS"} == set(STAGE_TASKS),
                timeout=30,
                what="Flower to record both stages as succeeded",
            )
            yield here


def chromium(tmp_path: Path, *args: str) -> str:
    """Headless Chromium with a fresh profile; its stdout."""
    done = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_api_lists_the_workers_and_the_finished_tasks_with_ids_only(flower: Flower) -> None:
    def both_workers() -> dict[str, Any] | None:
        listed = flower.api("/api/workers")
        return listed if {name.split("@")[0] for name in listed} >= {"extract", "apply"} else None

    # /api/workers asks the workers by broadcast and waits one second for replies; on a loaded machine a
    # reply can miss that window (an empty answer, seen in CI), and the next call asks again.
    workers = wait_until(both_workers, timeout=60, what="/api/workers to list both workers")
    assert all(keys.EXTRACT_TASK in w["registered"] for w in workers.values())

    tasks = flower.stage_tasks()
    assert set(tasks) == set(STAGE_TASKS)
    for task in tasks.values():
        assert task["state"] == "SUCCESS"
        assert list(ast.literal_eval(task["args"])) == [flower.user_id, flower.message_id]
        assert ast.literal_eval(task["kwargs"]) == {}
    assert tasks[keys.APPLY_TASK]["result"].startswith("'applied: v")
    assert "marmalade" not in json.dumps(flower.api("/api/tasks"))


def test_everything_but_the_healthcheck_needs_the_password(flower: Flower) -> None:
    for path in (
        "/api/workers",
        "/api/tasks",
        "/workers",
        "/tasks",
        f"/task/{flower.stage_tasks()[keys.APPLY_TASK]['uuid']}",
    ):
        assert flower.get(path, password="")[0] == 401, path
        assert flower.get(path, password="wrong")[0] == 401, path
    assert flower.get("/healthcheck", password="") == (200, "OK")
    # The password reaches Flower through its environment: `ps` shows argv to every local user.
    assert flower.password not in Path(f"/proc/{flower.pid}/cmdline").read_text()


def test_the_workers_page_in_a_browser_lists_both_workers_online(flower: Flower, tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", flower.url("/workers", credentials=True))
    assert "Online workers" in dom
    for worker in flower.api("/workers?json=1")["data"]:
        assert worker["hostname"] in dom
    assert dom.count(">Online<") >= 2


def test_the_tasks_pages_in_a_browser_show_finished_stages_by_id_never_the_text(flower: Flower, tmp_path: Path) -> None:
    tasks = flower.stage_tasks()
    listing = chromium(tmp_path, "--dump-dom", flower.url("/tasks", credentials=True))
    for name, task in tasks.items():
        assert name in listing and task["uuid"] in listing
    assert "SUCCESS" in listing

    for task in tasks.values():
        page = chromium(tmp_path, "--dump-dom", flower.url(f"/task/{task['uuid']}", credentials=True))
        assert task["name"] in page and "SUCCESS" in page
        assert flower.user_id in page and flower.message_id in page
        assert "marmalade" not in page and "Lisbon" not in page and "locker" not in page


def test_a_screenshot_of_the_tasks_page_is_a_png_of_the_window(flower: Flower, tmp_path: Path) -> None:
    shot = tmp_path / "tasks.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", flower.url("/tasks", credentials=True))
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (1280, 900)
    # A blank page compresses to a few KB; Flower's table, menus and text take far more.
    assert len(data) > 20_000, len(data)


def test_workers_send_task_events_only_once_asked_for_them(redis_url: str, tmp_path: Path) -> None:
    """By default a worker sends task events only once asked (Flower's ``enable_events`` broadcast): a
    message applied before is invisible to a listener, and each stage of one applied after shows."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None) as stack:
        assert stack.settings.task_events is False
        events = EventLog(stack.settings, stack.env["REDIS_URL"]).start()
        try:
            both = {"extract", "apply"}
            quiet = stack.client.enqueue("events_user", "I live in Porto and I work as a nurse.")
            assert stack.client.wait(quiet, timeout=SETTLE_S).applied == [quiet.message_id]
            after = len(events)
            # A worker's events leave in order: a heartbeat from each after the message means none of it is due.
            wait_until(lambda: events.heartbeats_since(after) >= both, timeout=30, what="heartbeats after it")
            assert events.task_events() == []

            assert events.ask_for_task_events() == both
            shown = stack.client.enqueue("events_user", "My sister Ana lives in Braga.")
            assert stack.client.wait(shown, timeout=SETTLE_S).applied == [shown.message_id]
            wait_until(lambda: len(events.of_type("task-received")) >= 2, timeout=30, what="both stages' task-received")
            received = events.of_type("task-received")
            assert {e["name"] for e in received} == set(STAGE_TASKS)
            assert all(shown.message_id in e["args"] and quiet.message_id not in e["args"] for e in received)
            tasks = {e["uuid"] for e in received}
            for kind in ("task-started", "task-succeeded"):
                wait_until(
                    lambda kind=kind: tasks <= {e["uuid"] for e in events.of_type(kind)},
                    timeout=30,
                    what=f"both stages' {kind}",
                )
        finally:
            events.stop()


def test_the_task_events_setting_turns_them_on_from_the_start() -> None:
    config = celery_config(Settings(task_events=True), "redis://127.0.0.1:1/0")
    assert config["worker_send_task_events"] is True and config["task_send_sent_event"] is True
    config = celery_config(Settings(), "redis://127.0.0.1:1/0")
    assert config["worker_send_task_events"] is False and config["task_send_sent_event"] is False
