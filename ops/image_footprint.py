"""The image's footprint without a container engine: what ops/Dockerfile puts on top of python:3.11-slim.

From a source tree it builds the wheel, installs it into a fresh virtualenv (from the lock with ``--lock``,
as the image does; else with the dependencies pip resolves, as images before the lock did), makes the
ONNX export once as the image's build does, and then runs ``engram recall`` in fresh processes on a copy
of a seeded data directory (the embedded default: SQLite + FAISS, no Redis, no services), as a container's
first recall does. It prints the virtualenv's and the export's size on disk, the export's time, and each
first recall's wall time and maximum RSS (``/usr/bin/time -v``).

    ENGRAM_DATA_DIR=/tmp/seeded engram demo          # once: the user the recalls read (demo-user)
    python3 ops/image_footprint.py --source . --lock ops/requirements.lock --data /tmp/seeded --work /tmp/fp-after
    git worktree add /tmp/before 8833c0b             # before: that commit's dependencies, no lock
    python3 ops/image_footprint.py --source /tmp/before --data /tmp/seeded --work /tmp/fp-before

Times depend on the machine's load: compare before and after measured in the same session.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# What a model-less build copies: the wheel needs the packages and pyproject.toml only.
_NOT_SOURCE = (".git", "__pycache__", "*.egg-info", "build", "target", "bench-results", "node_modules", "tests")
# The image's build step (ops/Dockerfile): the export through the settings a container reads.
_BAKE = (
    "from engram_api.settings import Settings; from engram_api.storage.embedding.embedder import embedder_for; "
    "e = embedder_for(Settings()); e.encode_one('bake'); print(e.backend)"
)


def _run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[str, str]:
    """(stdout, stderr) of a command that must succeed."""
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout, done.stderr


def _mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6


def _largest(site: Path, n: int = 6) -> list[tuple[str, float]]:
    sizes = [(p.name, _mb(p)) for p in site.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")]
    return sorted(sizes, key=lambda s: -s[1])[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="the source tree whose wheel is measured")
    parser.add_argument("--lock", type=Path, help="install from this lock (pip --no-deps --require-hashes)")
    parser.add_argument("--data", type=Path, required=True, help="a data directory seeded by `engram demo`")
    parser.add_argument("--work", type=Path, required=True, help="an empty directory for the venv and copies")
    parser.add_argument("--recalls", type=int, default=3, help="fresh processes, each a first recall")
    args = parser.parse_args()

    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = work / "source"
    shutil.copytree(args.source, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work), str(source)]
    )
    (wheel,) = work.glob("engram-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    started = time.monotonic()
    if args.lock:
        _run([*pip, "--no-deps", "--require-hashes", "-r", str(args.lock.resolve())])
        _run([*pip, "--no-deps", str(wheel)])
    else:
        _run([*pip, f"{wheel}[tracing]"])  # the image before the lock: `pip install '.[tracing]'`
    install_s = time.monotonic() - started

    # No PYTHONPATH, outside the source tree: the venv's Engram is the wheel's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ENGRAM_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LITELLM_LOCAL_MODEL_COST_MAP="True")
    env["ENGRAM_MODEL_CACHE_DIR"] = str(work / "models")
    started = time.monotonic()
    backend = _run([str(venv / "bin" / "python"), "-c", _BAKE], env=env, cwd=work)[0].strip()
    bake_s = time.monotonic() - started

    recalls = []
    for i in range(args.recalls):
        data = work / f"data-{i}"
        shutil.copytree(args.data, data)
        _, timed = _run(  # /usr/bin/time reports on stderr
            ["/usr/bin/time", "-v", str(venv / "bin" / "engram"), "recall", "demo-user", "where does the user live?"],
            env={**env, "ENGRAM_DATA_DIR": str(data)},
            cwd=work,
        )
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", timed)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timed)
        assert wall and rss, timed[-2000:]
        seconds = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
        recalls.append({"wall_s": round(seconds, 2), "max_rss_mb": round(int(rss.group(1)) / 1024, 1)})

    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    report = {
        "source": str(args.source),
        "lock": str(args.lock) if args.lock else None,
        "install_s": round(install_s, 1),
        "venv_mb": round(_mb(venv)),
        "export_mb": round(_mb(work / "models")),
        "export_backend": backend,
        "export_s": round(bake_s, 1),
        "torch_installed": (site / "torch").is_dir(),
        "largest_mb": [(name, round(mb)) for name, mb in _largest(site)],
        "first_recalls": recalls,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
