"""The TypeScript client (clients/typescript) through Node's own test runner, against a real ``engram serve``
with a real worker fleet behind it on the embedded default (SQLite, the rule-based extractor: no model).

Its tests (``clients/typescript/test``) enqueue, wait, recall, read the context and history, forget a message
and a user, check each error is typed from its problem body, and check the committed generated client is what
the live gateway's schema generates (so a schema change fails here until ``npm run generate``). npm's
dependencies come from the lock file (``scripts/install.sh``: ``npm ci`` only when node_modules is stale).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import GatewayProcess, gateway_process, mint_keys
from tests.support.stack import engram_stack

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"


@pytest.fixture(scope="module")
def compiled() -> Path:
    """The package installed from its lock file and compiled (src and tests) with its own tsc."""
    for tool in ("node", "npm"):
        assert shutil.which(tool), f"{tool} is not installed: ops/test.sh installs it (Debian's nodejs and npm)"
    subprocess.run([str(PACKAGE / "scripts" / "install.sh")], check=True, timeout=600)
    built = subprocess.run(
        [str(PACKAGE / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"],
        cwd=PACKAGE, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    return PACKAGE / "dist" / "test"


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, dict]]:
    secrets, entries = mint_keys()
    data = tmp_path_factory.mktemp("tsclient")
    with (
        engram_stack(redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=None) as stack,
        gateway_process({**stack.env, "ENGRAM_API_KEYS": entries}, data / "logs") as gw,
    ):
        yield gw, secrets


@pytest.mark.timeout(900)  # cold workers on a loaded machine; the Node tests' own waits are hang guards
def test_the_typescript_client_passes_its_node_tests_against_a_real_gateway(compiled, gateway) -> None:
    gw, secrets = gateway
    files = sorted(str(path) for path in compiled.glob("*.test.js"))
    assert len(files) >= 2, files
    env = {
        "PATH": os.environ["PATH"],
        "ENGRAM_URL": gw.url,
        "ENGRAM_KEY": secrets["a_rw"],
        "ENGRAM_READ_KEY": secrets["a_read"],
        "ENGRAM_NAMESPACE": "appA",
    }
    done = subprocess.run(
        ["node", "--test", "--test-reporter=spec", *files], cwd=PACKAGE, env=env, capture_output=True, text=True,
        timeout=840,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = dict(re.findall(r"^ℹ (\w+) (\d+)$", done.stdout, flags=re.MULTILINE))
    assert (summary.get("fail"), summary.get("skipped"), summary.get("todo")) == ("0", "0", "0"), done.stdout[-3000:]
    assert int(summary["pass"]) >= 12, summary  # test/*.test.ts: every one ran
