"""The off-spec answer corpus (tests/support/off_spec.py) through a parser: the share of answers whose facts
survive, and the answers whose facts were lost with no error and no note.

``python ops/bench/parse_corpus.py`` reads with this checkout's ``read_answer``; ``--parser FILE`` reads
with the ``read_answer`` of another copy of ``engram_workers/extraction/answer.py`` (an older commit's, to
measure before and after in one run: ``git show main:engram_workers/extraction/answer.py > /tmp/answer_main.py``;
before the reader had a module of its own, it was in ``llm.py``).
``-v`` lists every failed case and why.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.off_spec import score  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parser", type=Path, help="another answer.py to read with (default: this checkout's)")
    parser.add_argument("-v", "--verbose", action="store_true", help="list the failed cases")
    args = parser.parse_args(argv)
    if args.parser:
        spec = importlib.util.spec_from_file_location("llm_under_test", args.parser)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
        read = module.read_answer
    else:
        from engram_workers.extraction.answer import read_answer as read
    result = score(read)
    print(f"{args.parser or 'this checkout'}: {result.line()}")
    if args.verbose:
        for name, why in result.failed.items():
            print(f"  {name}: {why[:300]}")
        print(f"  silent: {result.silent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
