"""A reader process for the memory benchmark: recalls for the given users, then reports its own memory.

``python reader_probe.py USER [USER ...] --queries N``; configuration from the environment (REDIS_URL,
NEO4J_URI, ENGRAM_DATA_DIR), as an application's process would get it. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os

from benchlib import proc_memory
from corpus import queries


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("users", nargs="+")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--model-only", action="store_true", help="only load the embedding model (the floor)")
    args = parser.parse_args()
    from engram_api import MemoryClient
    from engram_api.settings import load_settings
    from engram_api.storage.embedding.embedder import get_embedder

    after: dict[str, dict[str, float]] = {}
    if args.model_only:
        get_embedder(load_settings().embedding_model).encode_one("load the model")
    else:
        client = MemoryClient()
        for i, user in enumerate(args.users):
            for q in queries(f"probe-{i}", args.queries):
                client.recall(user, q, k=10)
            after[user] = proc_memory(os.getpid())
    print(json.dumps({"final": proc_memory(os.getpid()), "after_user": after}))


if __name__ == "__main__":
    main()
