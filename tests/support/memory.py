"""Build a user's memory in the test process through the apply stage's own write (no workers needed), and
read it back: the embedded memory by text, checked against the user's FAISS file."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from engram_api import MemoryClient
from engram_api.models import Envelope, Extraction, Usage
from engram_api.producer import build_envelope
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.graph.episodes import EmbedContext
from engram_api.storage.writer.userwrite import UserWrite, UserWrites
from engram_workers.consolidation.plan import Incoming, Planned
from engram_workers.extraction.rules import extract_rules
from engram_workers.middleware import Hooks, Middleware, build_hooks
from engram_workers.stages.writing import Done, Member, write_members

if TYPE_CHECKING:
    import pytest

    from tests.support.stack import Stack


def scripted_stack(
    request: pytest.FixtureRequest,
    *,
    redis_url: str,
    llm_standin: Any,
    tmp_path_factory: pytest.TempPathFactory,
    answers: Mapping[str, dict[str, Any]],
    name: str,
) -> Iterator[Stack]:
    """A stack without workers on the backend ``request.param`` names ("neo4j" or "sqlite"), its LLM stand-in
    answering each message text with ``answers`` (an empty extraction otherwise)."""
    from engram_testing.llm_standin import Reply
    from tests.support.extractions import message_text
    from tests.support.stack import engram_stack

    llm_standin.script(lambda req: Reply.json(answers.get(message_text(req), {"entities": [], "facts": []})))
    neo4j_uri = request.getfixturevalue("neo4j_uri") if request.param == "neo4j" else None
    data_dir = tmp_path_factory.mktemp(f"{name}-{request.param}")
    with engram_stack(
        redis_url=redis_url, data_dir=data_dir, neo4j_uri=neo4j_uri, llm_url=llm_standin.url, workers=False
    ) as s:
        yield s


def write_one(
    write: UserWrite,
    envelope: Envelope,
    extraction: Extraction,
    usage: Usage,
    *,
    graph: GraphStore,
    embedder: Embedder,
    hooks: Hooks | None = None,
    embed_context: EmbedContext = "other_turn",
) -> Done:
    """What the apply stage writes for one message, in this process: its one write path (``write_members``),
    the message a batch of one, inside ``write``; the message's error raised as its task raises it.
    ``embed_context``: the worker's ``ENGRAM_CHUNK_EMBED_CONTEXT``."""
    member = Member(Incoming.of(envelope, extraction, usage, embed_context))
    written = write_members(write, [member], trigger=member, graph=graph, embedder=embedder, hooks=hooks or Hooks(()))
    if written.trigger_error is not None:
        raise written.trigger_error
    return written.done[envelope.message_id]


def apply_message(
    writes: UserWrites,
    graph: GraphStore,
    embedder: Embedder,
    middleware: Sequence[Middleware] | Hooks,
    envelope: Envelope,
    extraction: Extraction,
    usage: Usage | None = None,
    embed_context: EmbedContext = "other_turn",
) -> Done:
    """What the apply stage does with one message, minus Celery and Redis bookkeeping: ``write_one`` (plan,
    idempotent graph write, hooks, FAISS index, published stamp) inside the user's fenced ``UserWrite``. The
    one in-process apply of the suite: every test that builds memory without workers comes through here, so
    it follows the stage step by step."""
    hooks = middleware if isinstance(middleware, Hooks) else Hooks(middleware)
    return writes.run(
        envelope.user_id,
        lambda write: write_one(
            write, envelope, extraction, usage or Usage(), graph=graph, embedder=embedder, hooks=hooks,
            embed_context=embed_context,
        ),
        wait=30.0,
    )  # fmt: skip


def apply_extraction(
    client: MemoryClient, envelope: Envelope, extraction: Extraction, usage: Usage | None = None
) -> Planned:
    """``apply_message`` through ``client``'s own store, embedder and the configured hooks; the message
    must be new to the graph."""
    reader = client.reader
    written = apply_message(
        reader.writes, client.graph, reader.embedder, build_hooks(client.settings), envelope, extraction, usage
    )
    assert written.outcome.applied, f"{envelope.message_id} of {envelope.user_id} was written before"
    return written.planned


def apply_in_process(
    client: MemoryClient,
    user: str,
    message_id: str,
    text: str,
    when: datetime,
    extraction: Mapping[str, Any] | None = None,
) -> None:
    """One message of ``text`` at ``when`` through ``apply_extraction``: ``extraction`` is the model's
    answer, or the offline rules' when None."""
    envelope = build_envelope(client.settings, user, text, message_id=message_id, timestamp=when)
    answer = extract_rules(text, event_time=when) if extraction is None else Extraction.model_validate(extraction)
    apply_extraction(
        client, envelope, answer, Usage(prompt_tokens=100, completion_tokens=20, cost_usd=0.0005, llm_calls=1)
    )


def remember(client: MemoryClient, user: str, texts: list[str], start: datetime) -> None:
    """Ingest plain first-person sentences with the offline rule extractor (no LLM, no workers), one
    every 30 days from ``start``, as messages ``seed-0``, ``seed-1``, ..."""
    for i, text in enumerate(texts):
        apply_in_process(client, user, f"seed-{i}", text, start + timedelta(days=30 * i))


class Recording:
    """The real embedder; records the texts it is asked to encode (one list per call)."""

    def __init__(self, real: Embedder) -> None:
        self._real = real
        self.calls: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return self._real.encode(texts)

    def encode_cached(self, texts: list[str], *, user_id: str | None = None) -> np.ndarray:
        self.calls.append(list(texts))  # what was asked for: the process-wide cache may answer some of it
        return self._real.encode_cached(texts, user_id=user_id)

    def encode_cached_states(
        self, texts: list[str], ends: Mapping[str, int], *, user_id: str | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.calls.append(list(texts))  # as ``encode_cached``: the chunks' states come from the same call
        return self._real.encode_cached_states(texts, ends, user_id=user_id)

    def encode_states(self, texts: list[str], ends: list[int] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        self.calls.append(list(texts))
        return self._real.encode_states(texts, ends)

    def encode_one(self, text: str, *, user_id: str | None = None) -> np.ndarray:
        self.calls.append([text])
        return self._real.encode_one(text, user_id=user_id)

    def texts(self) -> list[str]:
        return [t for call in self.calls for t in call]


def memory(stack: Stack, user: str) -> dict[tuple[str, str], np.ndarray]:
    """The user's embedded memory by (kind, text), from the graph; the FAISS index must hold the same."""
    graph = stack.client.graph
    items, _ = graph.vectors(user)
    ids = {kind: [i.node_id for i in items if i.kind == kind] for kind in ("fact", "entity", "episode")}
    text = {f.id: f.statement for f in graph.get_facts(user, ids["fact"])}
    text |= {e.id: e.name for e in graph.get_entities(user, ids["entity"])}
    text |= {c.id: c.indexed_text for c in graph.get_chunks(user, ids["episode"])}
    index = VectorStore(root=stack.settings.index_dir, dim=stack.client.reader.embedder.dim).load(user)
    assert index is not None and index.node_ids() == {i.node_id for i in items}
    on_disk = index.vectors_for(index.node_ids())
    for item in items:
        assert np.allclose(on_disk[item.node_id], item.embedding, atol=1e-6), item.node_id
    return {(i.kind, text[i.node_id]): np.asarray(i.embedding, dtype=np.float32) for i in items}
