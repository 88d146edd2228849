"""The built wheel is the product: installed into a fresh virtualenv, away from the source tree, it runs
``engram demo`` to the end, and it ships the runtime packages only (no tests, no ops/, no test doubles).

The virtualenv sees the machine's site-packages (``--system-site-packages``) so that torch and the other
dependencies are not downloaded again; Engram itself must come from the wheel, which the test checks by
where the venv's Python imports it from, with no PYTHONPATH and a working directory outside the repo.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Build outputs and caches stay out of the copy the wheel is built from (the launcher's target is 100+ MB).
_NOT_SOURCE = (
    ".git", "__pycache__", "*.egg-info", "build", "target", "bench-results", "engram-data", ".*_cache", "node_modules",
)  # fmt: skip
_RUNTIME_TOP_LEVEL = {"engram_api", "engram_gateway", "engram_integrations", "engram_workers", "beat_schedule.py"}


def _outside_env(**extra: str) -> dict[str, str]:
    """This environment without anything that points into the checkout or at configured services."""
    dropped = {"PYTHONPATH", "REDIS_URL", "NEO4J_URI", "NEO4J_USER", "NEO4J_PASSWORD", "LLM_MODEL", "LLM_API_KEY"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(("ENGRAM_", "LLM_"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LITELLM_LOCAL_MODEL_COST_MAP="True", COLUMNS="160")
    env.update(extra)
    return env


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    dist = work / "dist"
    # No build isolation: setuptools is installed, and an isolated build would download it again.
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
        cwd=work, env=_outside_env(), timeout=300,
    )  # fmt: skip
    (built,) = dist.glob("engram-*.whl")
    return built


def test_the_wheel_ships_the_runtime_packages_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top = {name.split("/", 1)[0] for name in names if ".dist-info" not in name.split("/", 1)[0]}
        runtime_code = "\n".join(archive.read(n).decode() for n in names if n.endswith(".py"))
    assert top == _RUNTIME_TOP_LEVEL
    assert "engram_workers/cli/sample_conversation.json" in names  # the demo's conversation
    from engram_gateway.ui import STATIC  # the explorer's page: every file of it

    assert {f"engram_gateway/ui/static/{p.name}" for p in STATIC.iterdir()} <= set(names)
    # The runtime never reaches for development-only code (it is not there in an install).
    assert not re.findall(r"^\s*(?:from|import)\s+(?:engram_testing|tests)\b.*", runtime_code, re.MULTILINE)


@pytest.mark.slow
def test_the_wheel_in_a_fresh_virtualenv_runs_the_demo(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = _outside_env(ENGRAM_DATA_DIR=str(outside / "engram-data"))
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=outside, env=env, timeout=120)
    python = venv / "bin" / "python"
    _run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)],
        cwd=outside,
        env=env,
        timeout=300,
    )

    where = _run(
        [str(python), "-c", "import engram_api, engram_workers; print(engram_api.__file__, engram_workers.__file__)"],
        cwd=outside, env=env, timeout=60,
    ).stdout.split()  # fmt: skip
    site_packages = venv.resolve() / "lib"
    for path in where:
        assert Path(path).resolve().is_relative_to(site_packages), f"imported from {path}, not from the wheel"

    done = _run([str(venv / "bin" / "engram"), "demo"], cwd=outside, env=env, timeout=400)
    assert "messages applied, 0 dead-lettered" in done.stdout
    assert "-> User lives in Austin" in done.stdout
    assert "Traceback" not in done.stderr
    assert not (outside / "engram-data" / "services.json").exists()
