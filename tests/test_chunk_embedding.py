"""What an episode chunk's vector is made from (``episodes.embedded_texts``): its words, and the turn it
answers when the envelope carries one; the keyword document (``indexed_text``) is unchanged by it."""

from __future__ import annotations

from datetime import UTC, datetime

from engram_api.models import ChatMessage, Envelope
from engram_api.storage.graph.episodes import chunk_envelope, embedded_texts

WHEN = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


def _envelope(messages: list[ChatMessage], earlier: list[ChatMessage], speaker: str | None = None) -> Envelope:
    metadata = {"speaker": speaker} if speaker else {}
    return Envelope(
        user_id="u1", message_id="m1", messages=messages, timestamp=WHEN, metadata=metadata, earlier=earlier
    )


def test_a_short_answer_carries_the_question_of_the_other_speaker_it_answers() -> None:
    earlier = [
        ChatMessage(role="user", name="Melanie", content="Where did you move last year?"),
        ChatMessage(role="user", name="Caroline", content="Guess!"),
    ]
    envelope = _envelope([ChatMessage(role="user", content="Austin.")], earlier, speaker="Caroline")
    chunks = chunk_envelope(envelope)
    assert embedded_texts(envelope, chunks, "other_turn") == [
        "Caroline: Austin.\n(replying to Melanie: Where did you move last year?)"
    ]
    assert embedded_texts(envelope, chunks, "prev_turn") == ["Caroline: Austin.\n(replying to Caroline: Guess!)"]
    assert embedded_texts(envelope, chunks, "dated") == ["[2023-05-08] Caroline: Austin."]
    assert embedded_texts(envelope, chunks, "none") == ["Caroline: Austin."] == [c.indexed_text for c in chunks]


def test_the_turns_of_one_envelope_answer_each_other_and_a_first_turn_has_no_context() -> None:
    messages = [
        ChatMessage(role="user", content="Which city do I live in?"),
        ChatMessage(role="assistant", content="You said Austin."),
    ]
    envelope = _envelope(messages, [])
    assert embedded_texts(envelope, chunk_envelope(envelope), "other_turn") == [
        "Which city do I live in?",
        "You said Austin.\n(replying to user: Which city do I live in?)",
    ]


def test_every_chunk_of_a_long_message_carries_its_question_cut_to_300_characters() -> None:
    question = "q" * 400
    long = " ".join(f"Sentence {i} is about the trip to Austin and what we saw there." for i in range(20))
    earlier = [ChatMessage(role="assistant", content=question)]
    envelope = _envelope([ChatMessage(role="user", content=long)], earlier)
    chunks = chunk_envelope(envelope)
    texts = embedded_texts(envelope, chunks, "other_turn")
    assert len(chunks) > 1 and len(texts) == len(chunks)
    assert all(t == f"{c.text}\n(replying to assistant: {'q' * 300})" for c, t in zip(chunks, texts, strict=True))
