"""Loads one corpus into the seed projects and times their recall; runs inside bench-results/seeds-venv.

``python seeds_runner.py CORPUS.json OUT.json``. Imports only the seeds (engram-memory-sdk 0.1.0 as
``engram_memory``, engram-ltm 0.2.9 as ``engram``) and their dependencies, never Engram itself. Each seed
gets the corpus through its own write path with its LLM bypassed: the scripted extraction of every
message is converted to the seed's own extraction format and handed to the step after its LLM call.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

_WARM = 3


def _timed_recalls(search: Any, queries: list[str]) -> tuple[list[float], float]:
    """Milliseconds per query (after warm-up queries) and the mean number of items returned."""
    for q in queries[:_WARM]:
        search(f"warm-up {q}")
    times, returned = [], 0
    for q in queries[_WARM:]:
        start = time.perf_counter()
        returned += len(search(q))
        times.append((time.perf_counter() - start) * 1e3)
    return times, returned / max(1, len(times))


# ------------------------------------------------------------------------------------------ engram-ltm
def run_ltm(corpus: dict[str, Any], workdir: Path) -> dict[str, Any]:
    from engram.client import Engram
    from engram.config import EngramConfig
    from engram.models import Entity, ExtractionResult, Memory, MemoryType, Relation

    config = EngramConfig(
        llm_provider="ollama",  # never called: extraction results are handed to consolidation directly
        embedding_provider="sentence-transformers",
        embedding_model=corpus["model_path"],
        vector_store="faiss",
        graph_store="networkx",
        db_path=str(workdir / "ltm.db"),
    )
    client = Engram(config)
    user = corpus["user_id"]
    start = time.perf_counter()
    stored = 0
    for msg in corpus["messages"]:
        by_ref = {
            e["ref"]: Entity(user_id=user, name=e["name"], entity_type=e["label"].upper()) for e in msg["entities"]
        }
        by_ref["user"] = Entity(user_id=user, name="User", entity_type="PERSON")
        memories, relations = [], []
        for f in msg["facts"]:
            mem = Memory(
                user_id=user,
                content=f["statement"],
                importance=f.get("importance", 0.5),
                memory_type=MemoryType(f.get("memory_type", "semantic")),
                source_message_ids=[msg["id"]],
            )
            memories.append(mem)
            if f.get("object") in by_ref and f["subject"] in by_ref:
                relations.append(
                    Relation(
                        user_id=user,
                        source_entity_id=by_ref[f["subject"]].id,
                        relation_type=f["predicate"],
                        target_entity_id=by_ref[f["object"]].id,
                        memory_id=mem.id,
                    )
                )
        extraction = ExtractionResult(memories=memories, entities=list(by_ref.values()), relations=relations)
        stored += len(client._consolidator.process_extraction(extraction, user))
    load_s = time.perf_counter() - start
    times, returned = _timed_recalls(lambda q: client.search(q, user, k=10), corpus["queries"])
    return {"ok": True, "load_s": load_s, "memories": stored, "recall_ms": times, "mean_items": returned}


# ----------------------------------------------------------------------------------- engram-memory-sdk
class _ScriptedExtractor:
    """Stands where the SDK's LLMExtractor stands: returns the scripted extraction in the SDK's shape.

    Nodes: one per entity (merge keys name + userId) and one ``Memory`` node per fact (merge keys mid +
    userId, summary = the fact's statement), related ABOUT its entities. Nodes are emitted grouped by
    label because the SDK upserts one UNWIND per label and maps temp_N refs by result order.
    """

    def __init__(self, by_text: dict[str, dict[str, Any]]) -> None:
        self.by_text = by_text

    async def extract(self, user_id: str, text: str, neighbourhood: list[dict[str, Any]]) -> tuple[list, list]:
        from engram_memory.models import NodeInstruction, RelInstruction

        msg = self.by_text[text]
        entities = sorted(
            [*msg["entities"], {"ref": "user", "name": "User", "label": "Person"}], key=lambda e: e["label"]
        )
        nodes = [
            NodeInstruction(
                operation="create",
                label=e["label"],
                merge_keys={"name": e["name"], "userId": user_id},
                properties={"name": e["name"]},
                summary=e["name"],
            )
            for e in entities
        ] + [
            NodeInstruction(
                operation="create",
                label="Memory",
                merge_keys={"mid": f"{msg['id']}-{i}", "userId": user_id},
                properties={"predicate": f["predicate"]},
                summary=f["statement"],
            )
            for i, f in enumerate(msg["facts"])
        ]
        temp = {e["ref"]: f"temp_{i}" for i, e in enumerate(entities)}
        rels = [
            RelInstruction(from_ref=f"temp_{len(entities) + i}", to_ref=temp[ref], type="ABOUT")
            for i, f in enumerate(msg["facts"])
            for ref in (f["subject"], f.get("object"))
            if ref in temp
        ]
        return nodes, rels


async def _sdk(corpus: dict[str, Any]) -> dict[str, Any]:
    from engram_memory.client import AsyncMemoryClient
    from engram_memory.config import Config

    config = Config(
        neo4j_uri=corpus["neo4j_uri"],
        neo4j_user="neo4j",
        neo4j_password="unused-auth-disabled",
        embedding_model=corpus["model_path"],
        llm_model="openai/never-called",
        enable_background_tasks=False,
        llm_rate_limit_rpm=10**9,
        llm_rate_limit_burst=10**9,  # its limiter guards the LLM we bypass
    )
    client = AsyncMemoryClient(config)
    client._extractor = _ScriptedExtractor({m["text"]: m for m in corpus["messages"]})
    # Not ``async with client``: its start-up migration rewrites every node of the database that lacks
    # _schemaVersion, other applications' nodes included. Only the vector index is set up.
    await client._index_manager.ensure_vector_index()
    user = corpus["user_id"].replace(".", "-")  # the SDK's user-id pattern has no dots
    start = time.perf_counter()
    created = 0
    for msg in corpus["messages"]:
        result = await client.ingest(user, msg["text"], reference_id=msg["id"])
        created += len(result.nodes_created)
    load_s = time.perf_counter() - start
    await client._driver.execute("CALL db.awaitIndexes(300)")
    times, returned = [], 0.0
    for q in corpus["queries"][:_WARM]:
        await client.recall(user, f"warm-up {q}", top_k=10)
    for q in corpus["queries"][_WARM:]:
        t = time.perf_counter()
        returned += len((await client.recall(user, q, top_k=10)).nodes)
        times.append((time.perf_counter() - t) * 1e3)
    await client._driver.close()
    n = max(1, len(times))
    return {"ok": True, "load_s": load_s, "memories": created, "recall_ms": times, "mean_items": returned / n}


def main() -> None:
    import torch

    # Engram's embedder runs one torch thread per process (ENGRAM_TORCH_THREADS=1): the same for the seeds.
    torch.set_num_threads(1)
    corpus = json.loads(Path(sys.argv[1]).read_text())
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (
            ("engram-ltm", lambda: run_ltm(corpus, Path(tmp))),
            ("engram-memory-sdk", lambda: asyncio.run(_sdk(corpus))),
        ):
            try:
                out[name] = fn()
            except Exception as exc:
                out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
