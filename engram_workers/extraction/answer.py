"""A model's answer text, read tolerantly into ``Extraction`` (``read_answer``): what a real model's
slightly-off answer still yields.

Tolerance rules (each one is a test, and the corpus in tests/support/off_spec.py measures them together):
- the answer object is found by ``repair.answer_object`` (its keys, not the first inner object that
  decodes; lenient decoding; a cut-off answer closed at its last complete item; ``<think>`` blocks gone);
- entities and facts are validated one by one: a bad one is skipped with a note, never the whole message
  (unless no item at all is usable: then the answer is an error); lone surrogates are replaced by U+FFFD;
  item keys are read case-insensitively; refs are read by ``repair.fact_refs`` (the owner's stray names,
  ``{"name": ..}`` refs, "E1 Tampa"; an assistant's fact or an unlisted ``N3`` skipped with a note) and a
  missing statement is written from the triple;
- importance on a 1-10 or 0-100 scale is scaled down, anything else is clamped to 0..1; memory_type is
  matched case-insensitively (unknown -> semantic); ``valid_from`` is read by ``dates.read_date`` (years,
  year-months, month names; epochs refused), a date it cannot read is dropped ("last week").

Invariant: an answer is an error (``LLMError``, not transient, with the raw text) only when it gives items
and none is usable; otherwise every item that cannot be read is named in a note, never dropped silently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from engram_api.errors import LLMError
from engram_api.models import ExtractedEntity, ExtractedFact, Extraction
from engram_workers.extraction.dates import read_date
from engram_workers.extraction.repair import (
    ENTITY_KEYS,
    FACT_KEYS,
    answer_items,
    answer_object,
    blank,
    end_ref,
    fact_refs,
    item_keys,
    triple_item,
)

__all__ = ["parse_extraction", "read_answer"]

_MEMORY_TYPES = ("semantic", "episodic", "procedural")
_LIST_CAP = 100  # Extraction's own bound on entities and facts
_SURROGATE = re.compile("[\ud800-\udfff]")


def _importance(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip().rstrip("%"))
        except ValueError:
            return 0.5
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.5
    if 10 < value <= 100:
        value = value / 100  # a 0-100 scale (or a percentage)
    elif 1 < value <= 10:
        value = value / 10  # a 1-10 scale
    return min(1.0, max(0.0, float(value)))


def _date_or_none(value: Any) -> datetime | None:
    read = read_date(value)
    return read[0] if read else None


def _repaired(value: Any) -> Any:
    """Lone surrogates (JSON escapes like "\\ud800") become U+FFFD: no store, tokenizer or Bolt takes them."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    if isinstance(value, dict):
        return {k: _repaired(v) for k, v in value.items()}
    return value


def _clean_fact(item: dict[str, Any]) -> dict[str, Any]:
    out = dict(item)
    if "importance" in out:
        out["importance"] = _importance(out["importance"])
    if out.get("memory_type") is not None:
        kind = str(out["memory_type"]).strip().lower()
        out["memory_type"] = kind if kind in _MEMORY_TYPES else "semantic"
    for key in ("object", "updates", "valid_from", "valid_until", "statement"):
        if key in out and blank(out[key]):
            out[key] = None
    for key in ("valid_from", "valid_until"):
        if out.get(key) is not None:
            out[key] = _date_or_none(out[key])
    return out


def _clean_entity(item: dict[str, Any]) -> dict[str, Any]:
    out = dict(item)
    aliases = out.get("aliases")
    if isinstance(aliases, str):
        out["aliases"] = [aliases]
    elif isinstance(aliases, list):
        out["aliases"] = [a for a in aliases if isinstance(a, str) and a.strip()][:20]
    if isinstance(out.get("summary"), str):
        out["summary"] = out["summary"][:1000]
    if not isinstance(out.get("label"), str) or len(out["label"]) > 100:
        out.pop("label", None)
    return out


def _note(kind: str, i: int, exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{kind}.{i}.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"


def read_answer(raw: str, names: Mapping[str, str] | None = None) -> tuple[Extraction, list[str]]:
    """The answer as an ``Extraction`` and a note per skipped item; ``LLMError`` when nothing is usable.
    ``names`` are the names of the context handles the prompt showed (for statements the model left out)."""
    data, cut = answer_object(raw)  # an object with at least one of entities, facts, ends
    skipped: list[str] = []
    entities: list[ExtractedEntity] = []
    for i, item in enumerate(answer_items(data, "entities", raw)[:_LIST_CAP]):
        if not isinstance(item, dict):
            skipped.append(f"entities.{i}: not an object")
            continue
        try:
            entities.append(ExtractedEntity.model_validate(_clean_entity(item_keys(_repaired(item), ENTITY_KEYS))))
        except ValidationError as exc:
            skipped.append(_note("entities", i, exc))
    listed = {e.ref: e.name for e in entities}
    facts: list[ExtractedFact] = []
    for i, given in enumerate(answer_items(data, "facts", raw)[:_LIST_CAP]):
        item = triple_item(given)
        if not isinstance(item, dict):
            skipped.append(f"facts.{i}: not an object")
            continue
        fact = item_keys(_repaired(item), FACT_KEYS)
        refused = fact_refs(fact, listed, names)
        if refused:
            skipped.append(f"facts.{i}.{refused}")
            continue
        try:
            facts.append(ExtractedFact.model_validate(_clean_fact(fact)))
        except ValidationError as exc:
            skipped.append(_note("facts", i, exc))
    if cut:
        skipped.append("answer cut off: its last, incomplete item was dropped")
    ends = [e for e in (end_ref(h) for h in answer_items(data, "ends", raw)) if e]
    extraction = Extraction(entities=entities, facts=facts, ends=ends[:50])
    if skipped and not (extraction.entities or extraction.facts or extraction.ends):
        # Items were given and none is usable: that is a bad answer (retried once, then dead-lettered with
        # the raw text for an operator), not "nothing worth remembering".
        raise LLMError(f"model answer breaks the schema at {skipped[0]}", transient=False, raw=raw)
    return extraction, skipped


def parse_extraction(raw: str) -> Extraction:
    return read_answer(raw)[0]
