"""A corpus of realistic off-spec model answers (issue 43), each with what a competent reader keeps.

Every case is a raw answer text as a real model gives it for a short message (fences, prose, trailing
commas, Python literals, cut-off answers, ``<think>`` blocks, a triple without its statement, ``{"name": ..}``
refs, 0-100 importance, wrong casing, wrappers, duplicated keys, stray subjects, whole-line ``ends``, dates
in words) and the facts that must survive reading: ``(subject, predicate, object)`` after reading, with
``SELF_REF`` for the owner. ``notes`` are words a skipped-item note must contain when the answer also holds
an item a reader must refuse (so nothing is dropped silently).

``score(read)`` runs a reader (``read_answer``'s signature) over the corpus: tests/test_off_spec_answers.py
asserts on it and ``ops/bench/bench_parse.py`` prints it, for this parser or another one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engram_api.errors import LLMError
from engram_api.models import SELF_REF, Extraction
from engram_api.naming import sanitize_predicate

Triple = tuple[str, str, str | None]


@dataclass(frozen=True)
class Case:
    name: str
    raw: str
    facts: tuple[Triple, ...]
    ends: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # words the skipped notes must hold (a refused item is named, not dropped)
    dates: tuple[str | None, ...] = ()  # the facts' valid_from as ISO text, when the case is about dates


U = SELF_REF
AUSTIN = {"ref": "N1", "name": "Austin", "label": "Place", "aliases": [], "summary": ""}
GOOGLE = {"ref": "N2", "name": "Google", "label": "Organization", "aliases": [], "summary": ""}
LIVES = {
    "subject": "user",
    "predicate": "LIVES_IN",
    "object": "N1",
    "statement": "User lives in Austin",
    "memory_type": "semantic",
    "importance": 0.7,
    "valid_from": None,
    "updates": None,
}
WORKS = {**LIVES, "predicate": "WORKS_AT", "object": "N2", "statement": "User works at Google"}
BOTH = {"entities": [AUSTIN, GOOGLE], "facts": [LIVES, WORKS], "ends": []}
ONE = {"entities": [AUSTIN], "facts": [LIVES], "ends": []}
T_LIVES: Triple = (U, "LIVES_IN", "N1")
T_WORKS: Triple = (U, "WORKS_AT", "N2")
COMPACT = json.dumps(BOTH)
PRETTY = json.dumps(BOTH, indent=2)
PRETTY_ONE = json.dumps(ONE, indent=2)


def _with(**changes: Any) -> str:
    """ONE's answer with fields of its one fact changed (None removes the field)."""
    fact = {k: v for k, v in {**LIVES, **changes}.items() if not (k in changes and changes[k] is None)}
    return json.dumps({"entities": [AUSTIN], "facts": [fact], "ends": []})


def _dated(value: Any) -> str:
    return json.dumps({"entities": [AUSTIN], "facts": [{**LIVES, "valid_from": value}], "ends": []})


CASES: list[Case] = [
    # ---- wrapping: fences and prose
    Case("fence-json", f"```json\n{PRETTY}\n```", (T_LIVES, T_WORKS)),
    Case("fence-bare", f"```\n{PRETTY}\n```", (T_LIVES, T_WORKS)),
    Case(
        "fence-and-prose",
        f"Here is the extraction:\n\n```json\n{PRETTY}\n```\n\nI kept only lasting facts.",
        (T_LIVES, T_WORKS),
    ),
    Case("prose-before", f"Sure! Here is the JSON object:\n{COMPACT}", (T_LIVES, T_WORKS)),
    Case("prose-after", f"{COMPACT}\n\nLet me know if you need anything else.", (T_LIVES, T_WORKS)),
    Case(
        "markdown-heading",
        f"**Extracted memory**\n\n{PRETTY}\n\n*Note: the move date was not given.*",
        (T_LIVES, T_WORKS),
    ),
    Case("json-word-prefix", f"json\n{PRETTY}", (T_LIVES, T_WORKS)),
    Case(
        "prose-quotes-an-item-first",
        'The key fact is {"subject": "user", "predicate": "LIVES_IN"}; the full answer:\n' + COMPACT,
        (T_LIVES, T_WORKS),
    ),
    Case(
        "prose-item-then-broken-answer",
        'I will write {"ref": "N1"} for Austin.\n{"entities": [{"ref": "N1", "name": "Austin", "label": "Place",}],\n'
        ' "facts": [{"subject": "user", "predicate": "LIVES_IN", "object": "N1", "statement": "User lives in Austin",}],}',
        (T_LIVES,),
    ),
    Case("byte-order-mark", "\ufeff" + COMPACT, (T_LIVES, T_WORKS)),
    Case("xml-tags", f"<answer>\n{PRETTY}\n</answer>", (T_LIVES, T_WORKS)),
    Case("double-encoded", json.dumps(COMPACT), (T_LIVES, T_WORKS)),
    Case(
        "two-objects-answer-first",
        COMPACT + '\nAn empty answer would be {"entities": [], "facts": [], "ends": []}.',
        (T_LIVES, T_WORKS),
    ),
    # ---- lenient decoding
    Case(
        "trailing-comma-list", PRETTY_ONE.replace('"summary": ""\n    }\n  ]', '"summary": ""\n    },\n  ]'), (T_LIVES,)
    ),
    Case("trailing-comma-object", COMPACT.replace('"updates": null}', '"updates": null,}'), (T_LIVES, T_WORKS)),
    Case("trailing-comma-top", COMPACT[:-1] + ",}", (T_LIVES, T_WORKS)),
    Case("single-quotes", str(BOTH).replace("None", "'null'"), (T_LIVES, T_WORKS)),
    Case("python-repr", str(BOTH), (T_LIVES, T_WORKS)),
    Case(
        "python-literals",
        COMPACT.replace("null", "None").replace('"importance": 0.7', '"single_valued": True, "importance": 0.7'),
        (T_LIVES, T_WORKS),
    ),
    Case(
        "raw-newline-in-string",
        COMPACT.replace("User lives in Austin", "User lives in Austin\n(moved recently)"),
        (T_LIVES, T_WORKS),
    ),
    Case("raw-tab-in-string", COMPACT.replace("User works at Google", "User works at\tGoogle"), (T_LIVES, T_WORKS)),
    Case("line-comments", PRETTY_ONE.replace('"facts": [', '"facts": [ // one fact: the home'), (T_LIVES,)),
    Case("block-comment", COMPACT.replace('"facts":', '/* facts about the owner */ "facts":'), (T_LIVES, T_WORKS)),
    Case(
        "unquoted-keys",
        '{entities: [{ref: "N1", name: "Austin", label: "Place"}], facts: [{subject: "user", predicate: "LIVES_IN", object: "N1", statement: "User lives in Austin"}]}',
        (T_LIVES,),
    ),
    Case(
        "smart-quotes-in-text",
        COMPACT.replace("User lives in Austin", "User “loves” living in Austin"),
        (T_LIVES, T_WORKS),
    ),
    Case("nan-importance", COMPACT.replace('"importance": 0.7', '"importance": NaN', 1), (T_LIVES, T_WORKS)),
    Case("missing-comma-between-items", COMPACT.replace('}, {"subject"', '} {"subject"'), (T_LIVES, T_WORKS)),
    # ---- cut off (finish_reason "length"): the complete items are kept
    Case("cut-in-second-fact", COMPACT[: COMPACT.index("User works at") + 5], (T_LIVES,)),
    Case("cut-in-second-fact-key", COMPACT[: COMPACT.index('"predicate": "WORKS_AT"') + 8], (T_LIVES,)),
    Case("cut-after-first-fact", COMPACT[: COMPACT.index(', {"subject": "user", "predicate": "WORKS_AT"')], (T_LIVES,)),
    Case("cut-in-ends", COMPACT[:-2] + '"F1", "F', (T_LIVES, T_WORKS), ("F1",)),
    Case("cut-pretty", PRETTY[: PRETTY.index('"WORKS_AT"') + 3], (T_LIVES,)),
    Case("cut-in-fence", "```json\n" + PRETTY[: PRETTY.index('"WORKS_AT"') + 3], (T_LIVES,)),
    # ---- thinking models
    Case(
        "think-block",
        f"<think>\nThe user says they live in Austin. I should use N1.\n</think>\n{COMPACT}",
        (T_LIVES, T_WORKS),
    ),
    Case(
        "think-with-braces", '<think>Maybe {"facts": []}? No, there are facts.</think>\n' + COMPACT, (T_LIVES, T_WORKS)
    ),
    Case("think-upper", f"<THINK>short</THINK>```json\n{PRETTY}\n```", (T_LIVES, T_WORKS)),
    Case("thinking-tag", f"<thinking>Two facts here.</thinking>\n{COMPACT}", (T_LIVES, T_WORKS)),
    Case(
        "think-then-nothing",
        '<think>Just thanks, nothing to keep.</think>\n{"entities": [], "facts": [], "ends": []}',
        (),
    ),
    # ---- item shapes
    Case("no-statement", _with(statement=None), (T_LIVES,)),
    Case("empty-statement", _with(statement=""), (T_LIVES,)),
    Case("null-statement", _with(statement="null"), (T_LIVES,)),
    Case("object-name-object", _with(object={"name": "Austin"}), ((U, "LIVES_IN", "Austin"),)),
    Case("object-ref-object", _with(object={"ref": "N1", "name": "Austin"}), (T_LIVES,)),
    Case("subject-ref-object", _with(subject={"ref": "user", "name": "User"}), (T_LIVES,)),
    Case("object-id-object", _with(object={"id": "N1"}), (T_LIVES,)),
    Case("bare-name-object-no-statement", _with(object="Austin", statement=None), ((U, "LIVES_IN", "Austin"),)),
    Case("importance-0-100", _with(importance=80), (T_LIVES,)),
    Case("importance-percent", _with(importance="80%"), (T_LIVES,)),
    Case("importance-word", _with(importance="high"), (T_LIVES,)),
    Case("memory-type-casing", _with(memory_type="Semantic"), (T_LIVES,)),
    Case(
        "entity-id-not-ref",
        json.dumps({"entities": [{"id": "N1", "name": "Austin", "type": "Place"}], "facts": [LIVES]}),
        (T_LIVES,),
    ),
    Case("relation-not-predicate", _with(predicate=None, relation="LIVES_IN"), (T_LIVES,)),
    Case(
        "facts-keyed-by-id",
        json.dumps({"entities": [AUSTIN, GOOGLE], "facts": {"f1": LIVES, "f2": WORKS}}),
        (T_LIVES, T_WORKS),
    ),
    Case("facts-one-object", json.dumps({"entities": [AUSTIN], "facts": LIVES}), (T_LIVES,)),
    Case(
        "facts-as-triples",
        json.dumps({"entities": [], "facts": [["user", "LIVES_IN", "Austin"], ["user", "WORKS_AT", "Google"]]}),
        ((U, "LIVES_IN", "Austin"), (U, "WORKS_AT", "Google")),
    ),
    Case(
        "entities-as-strings",
        json.dumps({"entities": ["Austin"], "facts": [{**LIVES, "object": "Austin"}]}),
        ((U, "LIVES_IN", "Austin"),),
    ),
    Case("predicate-words", _with(predicate="lives in"), (T_LIVES,)),
    Case(
        "camel-case-keys",
        json.dumps(
            {
                "entities": [AUSTIN],
                "facts": [{**LIVES, "valid_from": None, "validFrom": "2023-06-01", "memoryType": "episodic"}],
            }
        ),
        (T_LIVES,),
        dates=("2023-06-01T00:00:00+00:00",),
    ),
    # ---- casing and wrappers
    Case(
        "key-casing",
        COMPACT.replace('"facts"', '"Facts"').replace('"entities"', '"Entities"').replace('"subject"', '"Subject"'),
        (T_LIVES, T_WORKS),
    ),
    Case("key-upper", COMPACT.replace('"facts"', '"FACTS"').replace('"predicate"', '"PREDICATE"'), (T_LIVES, T_WORKS)),
    Case("wrapper-result", json.dumps({"result": BOTH}), (T_LIVES, T_WORKS)),
    Case("wrapper-extraction", json.dumps({"extraction": BOTH, "confidence": 0.9}), (T_LIVES, T_WORKS)),
    Case("wrapper-two-levels", json.dumps({"data": {"memory": BOTH}}), (T_LIVES, T_WORKS)),
    Case("wrapper-tool-call", json.dumps({"name": "json_tool_call", "arguments": COMPACT}), (T_LIVES, T_WORKS)),
    Case("wrapper-string", json.dumps({"response": COMPACT}), (T_LIVES, T_WORKS)),
    Case(
        "top-level-fact-list",
        json.dumps([{**LIVES, "object": "Austin"}, {**WORKS, "object": "Google"}]),
        ((U, "LIVES_IN", "Austin"), (U, "WORKS_AT", "Google")),
    ),
    Case("top-level-answer-list", json.dumps([BOTH]), (T_LIVES, T_WORKS)),
    Case(
        "one-fact-per-line",
        json.dumps({**LIVES, "object": "Austin"}) + "\n" + json.dumps({**WORKS, "object": "Google"}),
        ((U, "LIVES_IN", "Austin"), (U, "WORKS_AT", "Google")),
    ),
    Case(
        "duplicated-facts-key",
        '{"entities": '
        + json.dumps([AUSTIN, GOOGLE])
        + ', "facts": ['
        + json.dumps(LIVES)
        + '], "facts": ['
        + json.dumps(WORKS)
        + "]}",
        (T_LIVES, T_WORKS),
    ),
    Case(
        "duplicated-entities-key",
        '{"entities": ['
        + json.dumps(AUSTIN)
        + '], "entities": ['
        + json.dumps(GOOGLE)
        + '], "facts": '
        + json.dumps([LIVES, WORKS])
        + "}",
        (T_LIVES, T_WORKS),
    ),
    Case("no-outer-braces", COMPACT[1:-1], (T_LIVES, T_WORKS)),
    # ---- stray strings
    Case("subject-me", _with(subject="me"), (T_LIVES,)),
    Case("subject-I", _with(subject="I"), (T_LIVES,)),
    Case("subject-the-user", _with(subject="the user"), (T_LIVES,)),
    Case("subject-User", _with(subject="User"), (T_LIVES,)),
    Case("subject-myself", _with(subject="myself"), (T_LIVES,)),
    Case("subject-memory-owner", _with(subject="memory owner"), (T_LIVES,)),
    Case(
        "subject-assistant",
        json.dumps(
            {
                "entities": [AUSTIN],
                "facts": [
                    LIVES,
                    {
                        **LIVES,
                        "subject": "assistant",
                        "predicate": "RECOMMENDED",
                        "statement": "Assistant recommended Austin",
                    },
                ],
            }
        ),
        (T_LIVES,),
        notes=("assistant",),
    ),
    Case("object-handle-and-name", _with(object="N1 Austin"), (T_LIVES,)),
    Case("object-handle-colon-name", _with(object="N1: Austin"), (T_LIVES,)),
    Case("context-handle-and-name", _with(object="E1 Austin"), ((U, "LIVES_IN", "E1"),)),
    Case(
        "unlisted-new-ref",
        json.dumps({"entities": [AUSTIN], "facts": [LIVES, {**WORKS, "object": "N3"}]}),
        (T_LIVES,),
        notes=("N3",),
    ),
    Case(
        "ends-whole-line",
        json.dumps({"entities": [AUSTIN], "facts": [LIVES], "ends": ["F1: User lives in Tampa"]}),
        (T_LIVES,),
        ("F1",),
    ),
    Case(
        "ends-context-line",
        json.dumps(
            {"entities": [AUSTIN], "facts": [LIVES], "ends": ["F2 [LIVES_IN] User lives in Tampa (since 2024-02-01)"]}
        ),
        (T_LIVES,),
        ("F2",),
    ),
    Case(
        "ends-objects",
        json.dumps({"entities": [AUSTIN], "facts": [LIVES], "ends": [{"ref": "F1"}, {"id": "F3"}]}),
        (T_LIVES,),
        ("F1", "F3"),
    ),
    Case("ends-one-string", json.dumps({"entities": [AUSTIN], "facts": [LIVES], "ends": "F1"}), (T_LIVES,), ("F1",)),
    # ---- dates (valid_from as models write them)
    Case("date-year-string", _dated("2024"), (T_LIVES,), dates=("2024-01-01T00:00:00+00:00",)),
    Case("date-year-number", _dated(2024), (T_LIVES,), dates=("2024-01-01T00:00:00+00:00",)),
    Case("date-compact", _dated("20240301"), (T_LIVES,), dates=("2024-03-01T00:00:00+00:00",)),
    Case("date-year-month", _dated("2025-03"), (T_LIVES,), dates=("2025-03-01T00:00:00+00:00",)),
    Case("date-month-words", _dated("March 2024"), (T_LIVES,), dates=("2024-03-01T00:00:00+00:00",)),
    Case("date-month-abbrev", _dated("Mar 2024"), (T_LIVES,), dates=("2024-03-01T00:00:00+00:00",)),
    Case("date-epoch-refused", _dated(1709251200), (T_LIVES,), dates=(None,)),
    Case("date-in-words-dropped", _dated("last spring"), (T_LIVES,), dates=(None,)),
]


@dataclass
class Score:
    """What a reader made of the corpus: cases whose facts all survived, and any dropped silently."""

    total: int = 0
    survived: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # case -> why (an error, a missing fact, a wrong date)
    silent: list[str] = field(default_factory=list)  # facts lost with no error and no note naming why

    @property
    def share(self) -> float:
        return len(self.survived) / self.total if self.total else 0.0

    def line(self) -> str:
        return f"off-spec answers: {len(self.survived)}/{self.total} kept their facts ({self.share:.0%}), {len(self.silent)} dropped silently"


def _triples(extraction: Extraction) -> set[Triple]:
    return {(f.subject, sanitize_predicate(f.predicate), f.object) for f in extraction.facts}


def judge(case: Case, read: Callable[[str], tuple[Extraction, list[str]]]) -> tuple[bool, str, bool]:
    """(survived, why not, silent): a reader's result on one case."""
    try:
        extraction, skipped = read(case.raw)
    except LLMError as exc:
        return False, f"error: {exc}", False
    except Exception as exc:  # a crash is a failure too, and never a silent one
        return False, f"crash: {type(exc).__name__}: {exc}", False
    missing = {(s, sanitize_predicate(p), o) for s, p, o in case.facts} - _triples(extraction)
    notes = " ".join(skipped)
    why = ""
    if missing:
        why = f"missing {sorted(missing, key=str)}; kept {sorted(_triples(extraction), key=str)}"
    elif list(case.ends) != extraction.ends[: len(case.ends)] or (not case.ends and extraction.ends):
        why = f"ends {extraction.ends} != {list(case.ends)}"
    elif any(w not in notes for w in case.notes):
        why = f"no note naming {case.notes}: {skipped}"
    elif case.dates and [f.valid_from.isoformat() if f.valid_from else None for f in extraction.facts] != list(
        case.dates
    ):
        why = f"dates {[f.valid_from for f in extraction.facts]} != {list(case.dates)}"
    # Lost facts must be named: an error (handled above) or a note per item left out.
    silent = bool(missing) and len(skipped) == 0
    return not why, why, silent


def score(read: Callable[[str], tuple[Extraction, list[str]]]) -> Score:
    out = Score(total=len(CASES))
    for case in CASES:
        ok, why, silent = judge(case, read)
        if ok:
            out.survived.append(case.name)
        else:
            out.failed[case.name] = why
        if silent:
            out.silent.append(case.name)
    return out
