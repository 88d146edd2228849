"""Offline, deterministic fact extraction: regex rules over first-person English.

This is the fallback when no LLM is configured, so the whole pipeline runs without a network. It
favours precision over recall: a rule fires only on a clause that opens with a known subject ("I",
"my brother Alex", "he", or the subject of the clause before) followed by a known verb phrase. That is
why questions ("where do I live?"), requests to the assistant ("play some jazz") and hypotheticals
("if I lived in Paris") yield nothing instead of a wrong memory.

Per message: normalize (NFKC, quotes, contractions) -> sentences (questions dropped) -> clauses (a
conjunction or comma splits only when what follows can stand on its own, so "English and Spanish"
stays one list while "Austin and work at Dell" becomes two clauses) -> subject -> the first entry of
``_RULES`` whose pattern matches the clause and whose handler accepts it.

Layout, each module importing only those before it: ``lexicon`` (limits, word lists), ``text`` (string
helpers), ``state`` (the per-message fact collector) and ``dates``; ``objects`` (places, names, lists,
roles); ``handlers`` (what a rule's handler is, and the generic ones); one module per rule family
(``places``, ``work``, ``person``, ``tastes``, ``learning``, ``family``, ``habits``); ``table``, the
ordered rule table; ``subjects``, which splits clauses, finds their subject and runs the table; this
module, the entry point (sentences, ``extract_rules``). Where the rules recurse (a name ends where a
rule starts, a relative's clause continues), modules below ``subjects`` call it through the message
state's ``grammar``, which this module gives.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from datetime import datetime

from engram_api.models import Extraction
from engram_workers.extraction.rules.lexicon import _MAX_ITEMS, _MAX_TEXT
from engram_workers.extraction.rules.state import _Grammar, _MessageState, _Subject
from engram_workers.extraction.rules.subjects import _clause, _clauses, _starts_rule

__all__ = ["extract_rules"]

logger = logging.getLogger(__name__)


_QUOTES = str.maketrans({"’": "'", "‘": "'", "ʼ": "'", "`": "'", "“": '"', "”": '"'})
_CONTRACTIONS = (
    (re.compile(r"\bi\s*'\s*m\b|\bim\b", re.I), "I am"),
    (re.compile(r"\bi\s*'\s*ve\b|\bive\b", re.I), "I have"),
    (re.compile(r"\bi\s*'\s*d\b", re.I), "I would"),
    (re.compile(r"\bi\s*'\s*ll\b", re.I), "I will"),
    (re.compile(r"\bcan\s*'?\s*t\b|\bcannot\b", re.I), "can not"),
    (re.compile(r"\bwon'?t\b", re.I), "will not"),
    (re.compile(r"\b(do|does|did|is|was|are|were|have|has|had|could|should|would)n'?t\b", re.I), r"\1 not"),
    (re.compile(r"\b(he|she|who|that|it)'s\b", re.I), r"\1 is"),
    (re.compile(r"\b(you|we|they)'re\b", re.I), r"\1 are"),
)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…])\s+|[\r\n]+")
# Whitespace runs collapse before any rule regex runs: patterns like ``\s+(?:and|is)`` tried at every
# position of a long run made the work quadratic ("I like" + 4,000 spaces took seconds).
_SPACES = re.compile(r"[^\S\n]+")
_LINES = re.compile(r" ?\n[\n ]*")  # linear only after _SPACES: a run here is at most one space long
_TITLE_ABBREVIATION = re.compile(r"\b(?:st|dr|mr|mrs|ms|mt|ft|prof|jr|sr)\.$", re.I)
_WORD = re.compile(r"[^\W\d_][\w'-]*")
_GRAMMAR = _Grammar(starts_rule=_starts_rule, clause=_clause)


def _normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).replace("\r", "\n")
    text = _LINES.sub("\n", _SPACES.sub(" ", text))
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    return text


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for part in _SENTENCE_BREAK.split(text):
        if out and _TITLE_ABBREVIATION.search(out[-1]) and part[:1].isupper():
            out[-1] += " " + part  # "St. Louis", "Dr. Smith"
        else:
            out.append(part)
    return [s.strip() for s in out if s.strip()]


def _is_cased(sentences: list[str]) -> bool:
    """Whether the writer capitalizes: any capital beyond sentence starts and the pronoun "I".

    A cased writer's lowercase words are common nouns ("the city"); an all-lowercase writer's may be
    names ("austin"), which rules then accept and title-case.
    """
    return any(w[0].isupper() and w != "I" for s in sentences for w in _WORD.findall(s)[1:])


def extract_rules(text: str, *, event_time: datetime) -> Extraction:
    """Entities and facts stated in ``text`` (first-person English), without an LLM.

    Never raises: nothing recognizable (or any input at all that trips a rule) gives an empty
    ``Extraction``. ``event_time`` dates facts stated as changes ("I moved to Austin").
    """
    if not isinstance(text, str) or not text.strip():
        return Extraction()
    try:
        return _extract(text, event_time)
    except Exception:  # the offline fallback must never fail a message; a rule bug is logged instead
        logger.exception("rule-based extraction failed; returning an empty extraction")
        return Extraction()


def _extract(text: str, event_time: datetime) -> Extraction:
    sentences = _sentences(_normalize(text[:_MAX_TEXT]))
    if len(text) > _MAX_TEXT:
        sentences = sentences[:-1]  # the cut left its last sentence unfinished ("I live in Aus")
    state = _MessageState(event_time=event_time, cased=_is_cased(sentences), grammar=_GRAMMAR)
    for sentence in sentences:
        if sentence.rstrip(" \"')").endswith("?"):
            continue  # a question states nothing
        previous: _Subject | None = None
        for clause in _clauses(sentence.rstrip(" .!…\"')")):
            previous = _clause(clause, state, previous)
        if len(state.facts) >= _MAX_ITEMS:
            break
    used = {f.subject for f in state.facts} | {f.object for f in state.facts if f.object}
    return Extraction(entities=[e for e in state.entities if e.ref in used], facts=state.facts)
