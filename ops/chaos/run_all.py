"""Run every chaos scenario against freshly started services and print one table.

    python ops/chaos/run_all.py            # full size (about 15 minutes on 2 cores)
    python ops/chaos/run_all.py --quick    # small size (a few minutes)
    python ops/chaos/run_all.py --only worker_kill --only poison

Results also go to bench-results/chaos.json. The exit code is 0 only when every scenario held its
guarantees (nothing lost, nothing duplicated, every scenario-specific check passed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

# The scenarios import each other by module name (this folder), and engram_api, engram_testing and
# tests.support from the source root (workers load the fault middleware as tests.support.faults too).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import flaky_llm
import lease_expiry
import neo4j_outage
import poison
import redis_restart
import worker_kill
from accounting import ScenarioResult, format_table
from fleet import Services

REPO_ROOT = Path(__file__).resolve().parents[2]

SCENARIOS = {
    "worker_kill": worker_kill,
    "redis_restart": redis_restart,
    "neo4j_outage": neo4j_outage,
    "flaky_llm": flaky_llm,
    "poison": poison,
    "lease_expiry": lease_expiry,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (the test suite's)")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="run just these (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench-results" / "chaos.json")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep service data and worker logs here")
    args = parser.parse_args(argv)

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="engram-chaos-"))
    print(f"chaos: services and worker logs under {work_dir}", flush=True)
    results: list[ScenarioResult] = []
    with Services.started(work_dir) as services:
        for name in args.only or SCENARIOS:
            module = SCENARIOS[name]
            print(f"chaos: {module.NAME} ...", flush=True)
            started = time.monotonic()
            try:
                result = module.run(services, module.QUICK if args.quick else module.FULL)
            except Exception as exc:  # one broken scenario must not hide the others' results
                result = ScenarioResult(scenario=module.NAME, error=f"{type(exc).__name__}: {exc}")
                result.details["traceback"] = traceback.format_exc()
                result.seconds = round(time.monotonic() - started, 1)
            print(f"chaos: {module.NAME}: {'ok' if result.ok else 'FAILED'} in {result.seconds:.0f}s", flush=True)
            results.append(result)

    print()
    print(format_table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "mode": "quick" if args.quick else "full",
                "finished_at": datetime.now(UTC).isoformat(),
                "work_dir": str(work_dir),
                "results": [r.to_json() for r in results],
            },
            indent=2,
            default=str,
        )
    )
    print(f"\nchaos: results written to {args.out}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
