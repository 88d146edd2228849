"""Per-message extraction state: the parsed object and subject types and ``_MessageState``, which collects
facts.

``_MessageState`` is the one place facts and entities are added: it enforces the 100-item limits, gives each
normalized name one ref, and drops a fact stated twice in a message.

The rules recurse: a name ends where a rule's verb phrase starts ("alex works at ..."), and a relative
introduced mid-clause carries on as a clause of its own ("a brother named Alex who works at Amazon"). The
parsers and handlers below the rule table reach it through ``_MessageState.grammar`` (``_Grammar``, given
by the entry point), never by importing the modules above them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from engram_api.models import SELF_REF, ExtractedEntity, ExtractedFact, MemoryType
from engram_api.naming import is_single_valued, normalize_name
from engram_workers.extraction.rules.lexicon import (
    _FAMILY_PREDICATES,
    _IMPORTANCE,
    _IMPORTANCE_DEFAULT,
    _IMPORTANCE_FAMILY,
    _IMPORTANCE_FLOOR,
    _MAX_ITEMS,
)


class _Obj(NamedTuple):
    """A parsed object: the entity to create and how a statement quotes it."""

    name: str
    label: str
    phrase: str  # "the Bay Area", "a hospital", "hiking in the mountains"
    summary: str = ""
    aliases: tuple[str, ...] = ()


@dataclass
class _Subject:
    """Who a clause is about. Relatives and pets met in passing get an entity only once a fact needs one."""

    name: str  # how statements refer to it: "User", "Alex", "User's brother"
    ref: str | None = None
    intro: _Intro | None = None

    @property
    def is_user(self) -> bool:
        return self.ref == SELF_REF


class _Intro(NamedTuple):
    """The user->relative (or pet) fact that introduces a subject, plus its entity."""

    predicate: str
    statement: str
    entity: _Obj
    valid_from: datetime | None = None


class _Grammar(NamedTuple):
    """The clause grammar above the rule table (``subjects``), for the parsers and handlers under it."""

    starts_rule: Callable[[str], bool]  # whether text opens with a verb phrase some rule knows
    clause: Callable[[str, _MessageState, _Subject | None], _Subject | None]  # extract from one clause


_USER_NAME = "User"


@dataclass
class _MessageState:
    """One message being read: its time and casing, the rule grammar, what was found so far (entities,
    facts, refs) and what the next clause may refer back to."""

    event_time: datetime
    cased: bool  # whether the writer capitalizes proper nouns (see _is_cased)
    grammar: _Grammar
    entities: list[ExtractedEntity] = field(default_factory=list)
    facts: list[ExtractedFact] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=dict)  # normalized name -> ref
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    last_animate: _Subject | None = None  # what "he"/"she"/"who" refers to
    routine: bool = False  # the clause describes a routine: its facts must not retire standing ones

    def user(self) -> _Subject:
        return _Subject(_USER_NAME, SELF_REF)

    def entity(self, obj: _Obj) -> str | None:
        key = normalize_name(obj.name) or obj.name.casefold()
        if key in self.refs:
            return self.refs[key]
        if len(self.entities) >= _MAX_ITEMS:
            return None
        ref = f"e{len(self.entities) + 1}"
        aliases = [a for a in dict.fromkeys(obj.aliases) if a.casefold() != obj.name.casefold()][:20]
        self.entities.append(
            ExtractedEntity(ref=ref, name=obj.name[:200], label=obj.label, aliases=aliases, summary=obj.summary)
        )
        self.refs[key] = ref
        if obj.label in ("Person", "Pet"):
            self.last_animate = _Subject(obj.name, ref)
        return ref

    def subject_ref(self, subject: _Subject) -> str | None:
        if subject.ref is None and subject.intro is not None:
            intro = subject.intro
            ref = self.entity(intro.entity)
            if ref is not None:
                self._add(self.user(), intro.predicate, intro.statement, ref, "semantic", intro.valid_from)
                subject.ref = ref
                self.last_animate = subject
        return subject.ref

    def emit(
        self,
        subject: _Subject,
        predicate: str,
        statement: str,
        obj: _Obj | None = None,
        *,
        memory_type: MemoryType = "semantic",
        valid_from: datetime | None = None,
    ) -> None:
        """Add one fact, creating its subject (a relative met in passing) and object entities as needed."""
        if (self.routine and is_single_valued(predicate)) or len(self.facts) >= _MAX_ITEMS:
            return
        if self.subject_ref(subject) is None:
            return
        object_ref = self.entity(obj) if obj is not None else None
        if obj is None or object_ref is not None:
            self._add(subject, predicate, statement, object_ref, memory_type, valid_from)

    def _add(
        self,
        subject: _Subject,
        predicate: str,
        statement: str,
        object_ref: str | None,
        memory_type: MemoryType,
        valid_from: datetime | None,
    ) -> None:
        if len(self.facts) >= _MAX_ITEMS or subject.ref is None:
            return
        text = " ".join(statement.split())[:1000]
        # Attribute facts (no object) differ only by their statement.
        key = (subject.ref, predicate, object_ref or text.casefold())
        if key in self.seen:
            return
        self.seen.add(key)
        importance = _IMPORTANCE.get(
            predicate, _IMPORTANCE_FAMILY if predicate in _FAMILY_PREDICATES else _IMPORTANCE_DEFAULT
        )
        if not subject.is_user:
            # Facts about people around the user matter less than facts about the user.
            importance = max(_IMPORTANCE_FLOOR, importance - 0.1)
        self.facts.append(
            ExtractedFact(
                subject=subject.ref,
                predicate=predicate,
                object=object_ref,
                statement=text,
                memory_type=memory_type,
                importance=round(importance, 2),
                valid_from=valid_from,
                single_valued=is_single_valued(predicate),
            )
        )
