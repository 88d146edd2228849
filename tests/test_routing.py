"""Celery wiring in one place: queue names and task routes are declared in ``engram_api.keys`` only, the
app's configuration routes every task by them, and no pipeline stage, maintenance job or ``engram_api``
module imports Celery, kombu or the worker's app (stages publish through an injected dispatcher)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engram_api import keys
from engram_api.settings import Settings
from engram_workers.celery_config import make_celery

ROOT = Path(__file__).resolve().parents[1]
_CELERY_SIDE = ("celery", "kombu", "engram_workers.app", "engram_workers.tasks")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for folder in ("engram_api", "engram_workers/stages", "engram_workers/maintenance")
        for p in (ROOT / folder).rglob("*.py")
    ),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_stages_jobs_and_the_api_never_import_celery(path: Path) -> None:
    wrong = {name for name in _imports(path) if name.startswith(_CELERY_SIDE)}
    assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


def test_every_task_is_routed_to_its_declared_queue() -> None:
    app = make_celery(Settings(), "redis://127.0.0.1:1/0")
    assert {q.name for q in app.conf.task_queues} == set(keys.QUEUES)
    for task, queue in keys.TASK_QUEUES.items():
        assert app.amqp.router.route({}, task)["queue"].name == queue == keys.queue_for(task)
    assert set(keys.TASK_QUEUES) == {keys.EXTRACT_TASK, keys.APPLY_TASK, *keys.MAINTENANCE_TASKS}
