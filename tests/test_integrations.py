"""The framework integrations (``engram_integrations``) and their examples (``examples/*.py``) on a real fleet
on the embedded default (SQLite, the offline rule extractor); the chat model the examples call is the LLM
stand-in, answering only from what its prompt holds.

Each example runs two sessions of one conversation. The second starts with an empty transcript, and its
prompt (on the wire, at the stand-in) carries where the user lives and works, which only the first session
said: memory carried across sessions by Engram, not by the framework.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from engram_api.errors import InvalidInputError
from engram_integrations import ConversationMemory
from engram_integrations.langchain import EngramChatMessageHistory, EngramRetriever
from engram_testing import LLMStandin
from tests.support.stack import SETTLE_S, Stack, engram_stack

ROOT = Path(__file__).resolve().parents[1]
REMEMBERED = ("Austin", "Dell")  # what the examples' first session says
QUESTION = "Where do I live these days, and who do I work for?"  # the examples' second session
_SERVICES = ("REDIS_URL", "NEO4J_URI", "LLM_MODEL", "LLM_API_KEY", "LLM_API_BASE")


def answer_from_prompt(body: dict[str, Any]) -> str:
    """A model that knows only its prompt: it names the remembered words the messages before the last hold."""
    messages = body.get("messages", [])
    seen = " ".join(str(m.get("content")) for m in messages[:-1])
    found = [word for word in REMEMBERED if word in seen]
    return f"I remember: {', '.join(found)}." if found else "I don't know yet."


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("integrations")
    with engram_stack(redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=None) as stack:
        yield stack


@pytest.mark.timeout(900)  # cold workers and imports on a loaded machine; nothing here measures time
@pytest.mark.parametrize("example", ["chat_loop.py", "langchain_history.py", "llamaindex_memory.py"])
def test_each_example_carries_memory_into_a_second_session(
    example: str, fleet: Stack, llm_standin: LLMStandin, tmp_path: Path
) -> None:
    llm_standin.responder = answer_from_prompt
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k not in _SERVICES}
    env.update({k: v for k, v in fleet.env.items() if v})
    env.update(CHAT_MODEL="openai/standin", CHAT_API_BASE=llm_standin.url, CHAT_API_KEY="test-key")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # this checkout's code
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=840,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    # The first session starts knowing nothing; the second starts with an empty transcript...
    assert re.search(r"^\[\w+-1\] assistant: I don't know yet\.$", out, re.MULTILINE), out
    memory = re.search(r"^\[\w+-2\] memory: (.*)$", out, re.MULTILINE)
    assert memory is not None, out
    for word in REMEMBERED:  # ...and Engram hands it what the first session said
        assert word in memory.group(1), out
    assert re.search(r"^\[\w+-2\] assistant: I remember: Austin, Dell\.$", out, re.MULTILINE), out
    # On the wire: the second session's one request held the memory, though no turn of that session said it.
    (asked,) = [r for r in llm_standin.requests if str(r.messages[-1].get("content")) == QUESTION]
    assert [m["role"] for m in asked.messages] == ["system", "user"]
    assert all(word in asked.messages[0]["content"] for word in REMEMBERED), asked.messages


def test_langchain_history_enqueues_each_exchange_and_clear_forgets_it(fleet: Stack, user_id: str) -> None:
    history = EngramChatMessageHistory(ConversationMemory(fleet.client, user_id, "s1"))
    history.add_messages([HumanMessage("I live in Lisbon"), AIMessage("Lovely city!")])
    assert history.messages == [HumanMessage("I live in Lisbon"), AIMessage("Lovely city!")]
    (receipt,) = history.memory.receipts
    with pytest.raises(InvalidInputError) as refused:
        history.add_messages([ToolMessage("42", tool_call_id="t1")])
    assert refused.value.field == "messages[0]"
    assert len(history.memory.receipts) == 1 and len(history.messages) == 2  # nothing enqueued
    assert history.memory.wait(timeout=SETTLE_S).applied == [receipt.message_id]

    retriever = EngramRetriever(client=fleet.client, user_id=user_id, k=5)
    docs = retriever.invoke("where does the user live?")
    fact = next(d for d in docs if d.metadata["kind"] == "fact" and "Lisbon" in d.page_content)
    assert fact.metadata["current"] is True and fact.metadata["id"]

    history.clear()  # forgets the session's messages in Engram, not only the transcript
    assert history.messages == []
    assert not [d for d in retriever.invoke("where does the user live?") if "Lisbon" in d.page_content]


def test_llamaindex_memory_puts_each_message_and_gets_the_context_of_earlier_sessions(
    fleet: Stack, user_id: str
) -> None:
    # Imported here: llama-index takes seconds to import, which every collection of the suite would pay.
    from llama_index.core.llms import ChatMessage, MessageRole

    from engram_integrations.llamaindex import EngramMemory

    first = EngramMemory.from_defaults(fleet.client, user_id, "s1")
    first.put(ChatMessage(role=MessageRole.USER, content="I live in Porto"))
    first.put(ChatMessage(role=MessageRole.ASSISTANT, content="Noted!"))
    with pytest.raises(InvalidInputError):
        first.put(ChatMessage(role=MessageRole.TOOL, content="42"))
    assert [m.content for m in first.get_all()] == ["I live in Porto", "Noted!"]
    assert first.memory.wait(timeout=SETTLE_S).done

    second = EngramMemory.from_defaults(fleet.client, user_id, "s2")
    second.put(ChatMessage(role=MessageRole.USER, content="Where do I live?"))
    head, *turns = second.get()  # no input: the query is the last user turn, as chat engines call it
    assert head.role == MessageRole.SYSTEM and "Porto" in (head.content or "")
    assert [(m.role, m.content) for m in turns] == [(MessageRole.USER, "Where do I live?")]

    first.reset()  # the first session is forgotten in Engram: the second no longer sees it
    assert first.get_all() == []
    assert "Porto" not in "".join(m.content or "" for m in second.get())
