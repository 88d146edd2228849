"""Episodes as memories: how a message becomes recallable chunks, and how keyword queries are formed.

Invariants both backends rely on:
- a chunk is at most ``MAX_CHUNK_CHARS`` of one message, cut at sentence boundaries (a sentence longer
  than that is cut at a word boundary), so an item is never a whole session; chunk ids are derived from
  (user, message, position), so re-planning a message gives the same ids;
- the keyword index is scoped by a per-user token (``user_key``) that is part of every indexed row and
  every keyword query, so a user's top-k is computed over that user's rows only (no global top-k then
  a user filter); the token is digits after a letter, which no analyzer splits or stems;
- keyword queries are built only from the query's words (runs of letters and digits, lower-cased, stop
  words dropped), so user text never reaches a query parser's syntax.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Literal

from engram_api.models import ChunkRecord, Envelope, EpisodeRecord

__all__ = [
    "MAX_CHUNK_CHARS",
    "chunk_envelope",
    "chunk_episode",
    "chunk_id",
    "embedded_texts",
    "episode_text",
    "keyword_terms",
    "own_end",
    "split_chunks",
    "stored_texts",
    "user_key",
    "words",
]

MAX_CHUNK_CHARS = 600
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])\s+|\n+")
_TERM = re.compile(r"[^\W_]+")
MAX_TERMS = 32
_STOP = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "s",
        "t",
        "don",
        "didn",
        "doesn",
        "isn",
        "wasn",
        "ve",
        "ll",
        "re",
        "d",
        "m",
    ]
)


def user_key(user_id: str) -> str:
    """The user's token in the keyword index: 'u' + 20 digits of a hash of the user id."""
    return "u" + str(int.from_bytes(hashlib.blake2b(user_id.encode(), digest_size=8).digest(), "little")).zfill(20)


def words(text: str) -> list[str]:
    """The lower-case words (runs of letters and digits) of ``text`` without stop words, repeats kept, in order:
    what a keyword query is made of and what an in-memory keyword index counts (``keywords``)."""
    return [t for t in _TERM.findall(text.lower()) if t not in _STOP and (len(t) > 1 or t.isdigit())]


def keyword_terms(text: str) -> list[str]:
    """Distinct lower-case words (letters and digits) of ``text`` without stop words, in order (at most 32)."""
    return list(dict.fromkeys(words(text)))[:MAX_TERMS]


def split_chunks(text: str, limit: int = MAX_CHUNK_CHARS) -> list[str]:
    """Sentences packed greedily into pieces of at most ``limit`` characters."""
    pieces: list[str] = []
    for sentence in (s.strip() for s in _SENTENCE_END.split(text)):
        while len(sentence) > limit:
            cut = sentence.rfind(" ", 0, limit)
            cut = cut if cut > limit // 2 else limit
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            pieces.append(sentence)
    out: list[str] = []
    for piece in pieces:
        if out and len(out[-1]) + 1 + len(piece) <= limit:
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return out


def _speaker(envelope: Envelope, message: object, role: str) -> str:
    """The speaker's name when the message (ChatMessage.name) or its metadata carries one, else the role."""
    name = getattr(message, "name", None) or envelope.metadata.get("speaker")
    return str(name).strip()[:100] if isinstance(name, str) and name.strip() else role


def chunk_id(user_id: str, message_id: str, seq: int) -> str:
    """A chunk's id, derived from (user, message, position): re-planning or backfilling gives the same."""
    return "chk_" + hashlib.blake2b("\x1f".join((user_id, message_id, str(seq))).encode(), digest_size=12).hexdigest()


def chunk_episode(episode: EpisodeRecord) -> list[ChunkRecord]:
    """The chunks of a stored episode (the backfill of messages applied before chunks existed).

    Built from the stored text: a message whose speakers were named was stored as "Name: text" lines,
    which stay in the chunk text; the speaker is the metadata's ``speaker`` or the episode's role."""
    name = episode.metadata.get("speaker")
    speaker = name.strip()[:100] if isinstance(name, str) and name.strip() else episode.role
    return [
        _chunk(episode.user_id, episode.id, seq, text, speaker, episode.role, episode.event_time)
        for seq, text in enumerate(split_chunks(episode.content))
    ]


def _chunk(
    user_id: str, episode_id: str, seq: int, text: str, speaker: str | None, role: str, when: datetime
) -> ChunkRecord:
    """One chunk; its id derives from (user, message, seq), so a backfill and the apply stage agree."""
    return ChunkRecord(
        id=chunk_id(user_id, episode_id, seq), user_id=user_id, episode_id=episode_id, seq=seq, text=text,
        speaker=speaker, role=role, event_time=when, created_at=when,
    )  # fmt: skip


def episode_text(envelope: Envelope) -> str:
    """The message as stored in its episode: plain text, or "Name: text" lines once speakers are named (what
    ``chunk_episode`` reads back, and what the extraction prompt shows of an earlier turn)."""
    if not any(m.name for m in envelope.messages):
        return envelope.text
    return "\n".join(f"{m.name or m.role}: {m.content}" for m in envelope.messages)


def chunk_envelope(envelope: Envelope) -> list[ChunkRecord]:
    """The recallable chunks of one message (every chat message of the envelope, in order)."""
    chunks: list[ChunkRecord] = []
    for message in envelope.messages:
        speaker = _speaker(envelope, message, message.role)
        for text in split_chunks(message.content):
            seq = len(chunks)
            chunks.append(
                _chunk(envelope.user_id, envelope.message_id, seq, text, speaker, message.role, envelope.timestamp)
            )
    return chunks


EmbedContext = Literal["none", "other_turn", "prev_turn", "dated"]


def embedded_texts(envelope: Envelope, chunks: list[ChunkRecord], context: EmbedContext) -> list[str]:
    """The text each chunk's vector is made from (the keyword document stays ``indexed_text``).

    ``none``: ``indexed_text``. ``other_turn``: after it, the last turn before the chunk's message that
    another speaker said (the question a short answer answers), from the envelope's own earlier messages
    or, before them, its ``earlier`` turns; ``prev_turn``: the turn right before, whoever said it;
    ``dated``: the message's date before it. Only what the envelope carries is used, so the text is the
    same however the user's messages are batched or ordered at apply."""
    turns = [(m.name or m.role, m.content) for m in envelope.earlier]
    messages: list[tuple[str, str, list[ChunkRecord]]] = []
    for message in envelope.messages:
        at = sum(len(run) for _, _, run in messages)
        run = chunks[at : at + len(split_chunks(message.content))]
        messages.append((_speaker(envelope, message, message.role), message.content, run))
    return _in_context(turns, messages, context)


REPLY = "\n(replying to "  # where an embedded text's own words end and the turn it answers begins


def own_end(embedded: str) -> int:
    """Where a chunk's own words end in its embedded text (``embedded_texts``): before the turn it answers,
    else at its end (late interaction keeps the states of those words only, ``storage.embedding.states``)."""
    at = embedded.find(REPLY)
    return len(embedded) if at < 0 else at


def stored_texts(chunks: list[ChunkRecord], before: list[ChunkRecord], context: EmbedContext) -> list[str]:
    """``embedded_texts`` from what a store holds (the re-embedding of stored chunks): ``chunks`` are one
    stored message's (an episode's, by ``seq``), ``before`` the chunks of the message stored right before it
    in the user's conversation order (empty for the first). The envelope's turns are not stored, so its
    messages are the runs of one speaker's chunks (words joined by a space) and its one earlier turn is the
    last such run of ``before``. Equal to what apply made when the client's ``earlier`` turns were the
    user's preceding stored messages, each one speaker's whole turn of single-spaced sentences (a chat
    ingested turn by turn); otherwise the nearest the store can give."""
    return _in_context([(s, w) for s, w, _ in _runs(before)[-1:]], _runs(chunks), context)


def _runs(chunks: list[ChunkRecord]) -> list[tuple[str, str, list[ChunkRecord]]]:
    """Consecutive chunks of one speaker as (speaker, their words joined, the chunks)."""
    runs: list[tuple[str, str, list[ChunkRecord]]] = []
    for chunk in chunks:
        if runs and runs[-1][0] == chunk.speaker:
            speaker, words, run = runs[-1]
            runs[-1] = (speaker, f"{words} {chunk.text}", [*run, chunk])
        else:
            runs.append((chunk.speaker, chunk.text, [chunk]))
    return runs


def _in_context(
    turns: list[tuple[str, str]], messages: list[tuple[str, str, list[ChunkRecord]]], context: EmbedContext
) -> list[str]:
    """Each message's chunks (``messages``: speaker, words, chunks) in ``context``, after ``turns`` (the
    earlier turns as speaker, words): ``embedded_texts``'s rule, whatever the turns were read from."""
    chunks = [c for _, _, run in messages for c in run]
    if context == "none":
        return [c.indexed_text for c in chunks]
    if context == "dated":
        return [f"[{c.event_time.date().isoformat()}] {c.indexed_text}" for c in chunks]
    turns = list(turns)
    out: list[str] = []
    for speaker, words, run in messages:
        before = next((t for t in reversed(turns) if context == "prev_turn" or t[0] != speaker), None)
        reply = "" if before is None else f"{REPLY}{before[0]}: {before[1][:300]})"
        out.extend(c.indexed_text + reply for c in run)
        turns.append((speaker, words))
    return out
