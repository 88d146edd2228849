"""A model's answer text -> the JSON object it meant as its extraction (issue 43: tolerant reading).

Steps, each only when the ones before found no answer:
1. reasoning blocks (``<think>..</think>``, ``<thinking>``, ``<reasoning>``) and code fences are removed;
2. the whole text, decoded strictly (a key given twice with two lists keeps both lists);
3. every complete JSON value in the text, strictly (prose around it): the first that holds an answer wins.
   An answer is an object with ``facts``, ``entities`` or ``ends`` (any casing), also under a wrapper
   (``{"result": {...}}``, a tool call's ``arguments`` string) or a list of fact-shaped objects; an inner
   object that merely decodes (a fact quoted in the prose) is never taken for the answer;
4. a cut-off answer (brackets still open at the end) is cut back to its last complete list item and
   closed, so the incomplete item is dropped and the complete ones are kept;
5. lenient decoding (``json_repair``: trailing commas, single quotes, Python literals, comments, raw
   newlines, unquoted keys, missing commas) of the text from its first bracket.
Nothing found: ``LLMError`` with the strict decoder's own error on the text's first object, so the retry
tells the model what is really wrong. Bounds: hostile answers cost bounded work (``_SCAN_TRIES`` start
positions; the cut-off repair and lenient decoding only up to ``_LENIENT_MAX`` characters nested at most
``_DEPTH_MAX`` deep).

The items of the answer are read here too (``item_keys``, ``fact_refs``, ``end_ref``, ``triple_item``):
keys in any casing, the owner's stray names as ``SELF_REF``, handles written with their names, a missing
statement written from the triple; what cannot be read is named in a note by the caller, never dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import json_repair

from engram_api.errors import LLMError
from engram_api.models import SELF_REF
from engram_api.naming import SELF_WORDS, normalize_name

__all__ = [
    "ENTITY_KEYS",
    "FACT_KEYS",
    "Found",
    "answer_items",
    "answer_object",
    "blank",
    "end_ref",
    "fact_refs",
    "item_keys",
    "triple_item",
]

_ANSWER_KEYS = ("entities", "facts", "ends")
_FACT_SHAPE = frozenset({"subject", "predicate", "relation", "statement"})
_REASONING = re.compile(r"<(think|thinking|reasoning)>.*?(?:</\1>|\Z)", re.IGNORECASE | re.DOTALL)
_FENCE = re.compile(r"```[A-Za-z]*")
_LANG_WORD = re.compile(r"^\s*json\s*\n", re.IGNORECASE)
_SCAN_TRIES = 20  # start positions tried in a prose-wrapped answer
_LENIENT_MAX = 50_000  # characters handed to the lenient decoder (an answer of 3000 tokens is ~12K)
_DEPTH_MAX = 64
_WRAPPER_DEPTH = 3

Found = tuple[dict[str, Any], bool]  # the answer object, and whether it was cut back (an item was lost)


def _merge_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A key given twice keeps both lists ("facts": [..], "facts": [..]); otherwise the last value wins."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if isinstance(out.get(key), list) and isinstance(value, list):
            out[key] = [*out[key], *value]
        else:
            out[key] = value
    return out


_DECODER = json.JSONDecoder(object_pairs_hook=_merge_pairs)


def _is_fact(value: Any) -> bool:
    return isinstance(value, dict) and bool(_FACT_SHAPE & {str(k).lower() for k in value})


def _answer_in(value: Any, depth: int = 0) -> dict[str, Any] | None:
    """The answer object in a decoded value: itself, under a wrapper, or a list of facts as ``facts``."""
    if isinstance(value, dict):
        lowered = {str(k).strip().lower(): v for k, v in value.items()}
        if any(k in lowered for k in _ANSWER_KEYS):
            return lowered
        if depth < _WRAPPER_DEPTH:
            for inner in value.values():
                if isinstance(inner, str) and inner.lstrip()[:1] in ("{", "["):
                    try:
                        inner = _DECODER.decode(inner)
                    except ValueError:
                        continue
                found = _answer_in(inner, depth + 1) if isinstance(inner, dict | list) else None
                if found is not None:
                    return found
        return None
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        inner = next((a for a in (_answer_in(x, depth + 1) for x in value) if a is not None), None)
        if inner is not None:
            return inner
        if any(_is_fact(x) for x in value):
            return {"facts": value}  # a list of facts, or facts one per line (items are validated one by one)
    return None


def _strict_scan(text: str) -> dict[str, Any] | None:
    """The first complete JSON object in the text that holds an answer (outermost first, prose skipped),
    else fact objects given one after another (one per line) as the facts. An object before them that
    failed to decode, or is no fact, means they are the inside of a broken answer: left to the lenient
    step, which keeps that answer's entities too."""
    loose: list[dict[str, Any]] = []
    end, broken = 0, False
    for tries, match in enumerate(re.finditer(r"\{", text)):
        if tries >= _SCAN_TRIES:
            break
        if match.start() < end:
            continue  # inside a value already decoded: its inner objects are not the answer
        gap = text[end : match.start()]
        try:
            value, end = _DECODER.raw_decode(text, match.start())
        except (RecursionError, ValueError):
            broken = True
            continue
        if _is_fact(value):
            if not broken and (not loose or not gap.strip(" \t\r\n,")):
                loose.append(value)
            continue
        found = _answer_in(value)
        if found is not None:
            return found
        broken = True  # an object of some other shape (an entity): the facts after it belong to it
    return {"facts": loose} if loose else None


def _structure(text: str) -> Iterator[tuple[int, str]]:
    """The brackets outside strings, and each string's closing quote, with their positions: what the
    cut-off repair and the depth guard read (a bracket inside a string is text, not structure)."""
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                yield i, ch
        elif ch == '"':
            in_string = True
        elif ch in "{[]}":
            yield i, ch


def _cut_back(text: str) -> str | None:
    """A cut-off answer ended at its last complete list item and closed; None when nothing is left open
    (or nothing complete can be kept, or it nests deeper than ``_DEPTH_MAX``)."""
    stack: list[str] = []
    cut: tuple[int, str] | None = None
    for i, ch in _structure(text):
        if ch in "{[":
            stack.append(ch)
            if len(stack) > _DEPTH_MAX:
                return None
            continue
        if ch != '"':
            if not stack:
                return None
            stack.pop()
        if stack and stack[-1] == "[":
            cut = (i + 1, "".join(stack))  # a complete item of a list: an object, a list or a string
    if not stack or cut is None:
        return None
    pos, open_at_cut = cut
    closers = "".join("]" if c == "[" else "}" for c in reversed(open_at_cut))
    return text[:pos] + closers


def _shallow(text: str) -> bool:
    """Brackets nest at most ``_DEPTH_MAX`` deep: the lenient decoder recurses, and took seconds on a
    hostile "{{{{..." that no model answer resembles."""
    depth = 0
    for _, ch in _structure(text):
        depth += 1 if ch in "{[" else -1 if ch in "]}" else 0
        if depth > _DEPTH_MAX:
            return False
    return True


def _lenient(text: str) -> Any:
    if len(text) > _LENIENT_MAX or not _shallow(text):
        return None
    try:
        return json_repair.loads(text)
    except Exception:  # the repairer's own failure on hostile text: no answer here, not a crash
        return None


def _decode_error(text: str) -> str:
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return "model answer holds no JSON object"
    try:
        value, _ = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        return f"model answer is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except (RecursionError, ValueError) as exc:
        return f"model answer is not usable JSON: {type(exc).__name__}"
    if isinstance(value, dict):
        return "model answer has none of entities, facts, ends"
    return "model answer is not a JSON object"


def answer_object(raw: str) -> Found:
    """The answer object with lower-cased top-level keys, and whether a cut-off item was dropped;
    ``LLMError`` (not transient, the raw text kept) when the text holds none."""
    text = _LANG_WORD.sub("", _FENCE.sub("", _REASONING.sub("", raw))).strip()
    try:
        whole = _DECODER.decode(text)
    except json.JSONDecodeError:
        whole = None
    except (RecursionError, ValueError) as exc:
        # Nesting too deep, or a number too long to convert: unusable, and repairing it would not help.
        raise LLMError(f"model answer is not usable JSON: {type(exc).__name__}", transient=False, raw=raw) from None
    if isinstance(whole, str) and whole.lstrip()[:1] in ("{", "["):
        try:  # the answer double-encoded as one JSON string (each level is shorter: the recursion ends)
            return answer_object(whole)
        except LLMError as exc:
            raise LLMError(str(exc), transient=False, raw=raw) from None
    found = _answer_in(whole) if whole is not None else _strict_scan(text)
    if found is not None or whole is not None:
        if found is None:
            raise LLMError(_decode_error(text), transient=False, raw=raw)
        return found, False
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=0)
    closed = _cut_back(text[start:]) if len(text) <= _LENIENT_MAX else None
    if closed is not None:
        try:
            found = _answer_in(_DECODER.decode(closed))
        except (RecursionError, ValueError):
            found = _answer_in(_lenient(closed))
        if found is not None:
            return found, True
    # An answer without its outer braces ("entities": [..], "facts": [..]) is one object's inside.
    bare = text.startswith('"') and text.endswith(("]", "}"))
    found = _answer_in(_lenient("{" + text + "}" if bare else text[start:]))
    if found is not None:
        return found, False
    raise LLMError(_decode_error(text), transient=False, raw=raw)


# ------------------------------------------------------------------------------------- items of the answer

# Item keys models write for ours (after lower-casing): a synonym is read as the key it stands for.
FACT_KEYS = {"relation": "predicate", "relationship": "predicate", "fact": "statement", "text": "statement"}
ENTITY_KEYS = {"id": "ref", "type": "label"}
_ASSISTANT = frozenset({"assistant", "the assistant", "ai assistant", "chatbot"})
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
# The prompt's handles: N1.. for new entities (the answer must list them), E1.. for known ones (resolution
# refuses one the prompt did not show). Other letters are names ("K2", "F1 racing", "B2 Bomber").
_NEW_REF = re.compile(r"^N\d{1,4}$")
_ENTITY_HANDLE = re.compile(r"^E\d{1,4}$")
_HANDLE_AND_NAME = re.compile(r"^([EN]\d{1,4})\b[\]):.\s-]+\S")
_LEADING_HANDLE = re.compile(r"^\W*((?:ent|fact)_[0-9a-f]{4,}|[A-Za-z]\d{1,4})\b[\]):.\s-]*")


def item_keys(item: dict[str, Any], synonyms: Mapping[str, str]) -> dict[str, Any]:
    """Keys in lower snake case ("Subject", "validFrom" -> "subject", "valid_from"), synonyms read as ours
    (ours win when both are given)."""
    out: dict[str, Any] = {}
    for key, value in item.items():
        low = _CAMEL.sub("_", str(key).strip()).lower()
        if low in synonyms and synonyms[low] not in item:
            out.setdefault(synonyms[low], value)
        else:
            out[low] = value
    return out


def triple_item(item: Any) -> Any:
    """A fact written as a list, ``["user", "LIVES_IN", "Austin"]``, as the object it stands for."""
    if isinstance(item, list) and len(item) in (2, 3) and all(isinstance(x, str) for x in item):
        return dict(zip(("subject", "predicate", "object"), item, strict=False))
    return item


def blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none"))


def _ref(value: Any, listed: Mapping[str, str], shown: Mapping[str, str] | None) -> Any:
    """A subject or object as one ref: ``{"ref"|"id"|"name": ..}`` read as its ref, the owner's stray
    names ("me", "the user") as ``SELF_REF``, a handle written with its name ("N1 Austin", "E1: Austin")
    as the handle when the answer lists it or the prompt showed it (``shown``; None: not known, any E
    handle). Anything else is returned unchanged."""
    if isinstance(value, dict):
        low = item_keys(value, {})
        value = next((low[k] for k in ("ref", "id", "name") if isinstance(low.get(k), str) and low[k].strip()), value)
    if not isinstance(value, str):
        return value
    text = value.strip()
    if normalize_name(text) in SELF_WORDS:
        return SELF_REF
    match = _LEADING_HANDLE.match(text)
    if match and match.end() < len(text):
        handle = match[1]
        if handle in listed or (handle in shown if shown is not None else bool(_ENTITY_HANDLE.match(handle))):
            return handle
    return text


def fact_refs(item: dict[str, Any], listed: Mapping[str, str], shown: Mapping[str, str] | None) -> str | None:
    """Subject and object read as refs in place, the statement built from them when the model left it
    out; the reason to skip the fact when it has one (an assistant's fact, an unlisted new ref).
    ``shown``: the names of the entity handles the prompt showed (None when not known)."""
    for key in ("subject", "object"):
        if key in item:
            item[key] = _ref(item[key], listed, shown)
        ref = item.get(key)
        if not isinstance(ref, str):
            continue
        if key == "subject" and ref.lower() in _ASSISTANT:
            return "subject: the assistant is not the memory owner (facts are about the owner or people)"
        if _NEW_REF.match(ref) and ref not in listed:
            return f"{key}: {ref} is not an entity the answer lists"
        if named := _HANDLE_AND_NAME.match(ref):  # not read as a handle above: one nobody showed or listed
            return f"{key}: {named[1]} (in {ref!r}) is not a handle the prompt showed or the answer lists"
    subject, predicate, obj = item.get("subject"), item.get("predicate"), item.get("object")
    parts = (subject, predicate, obj)
    if blank(item.get("statement")) and all(isinstance(p, str) and p.strip() for p in parts):
        # "LIVES_IN" -> "lives in": the statement a model would have written, from the triple's names.
        said = {**(shown or {}), **listed, SELF_REF: "User"}
        words = str(predicate).replace("_", " ").strip().lower()
        item["statement"] = f"{said.get(str(subject), subject)} {words} {said.get(str(obj), obj)}"
    return None


def answer_items(data: dict[str, Any], key: str, raw: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if isinstance(value, dict):
        # One item given as an object, or items keyed by a made-up id ({"f1": {..}, "f2": {..}}).
        values = list(value.values())
        return values if values and all(isinstance(v, dict) for v in values) else [value]
    if key == "ends" and isinstance(value, str | int):
        return [value]
    if not isinstance(value, list):
        raise LLMError(f"model answer breaks the schema at {key}: must be a list", transient=False, raw=raw)
    return value


def end_ref(value: Any) -> str | None:
    """An ``ends`` entry as the handle or id it starts with ("F1: User lives in Tampa" -> "F1")."""
    if isinstance(value, dict):
        value = next((v for k, v in item_keys(value, {}).items() if k in ("ref", "id", "handle", "fact")), None)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value).strip()
    match = _LEADING_HANDLE.match(text)
    return match[1] if match else (text[:100] or None)
