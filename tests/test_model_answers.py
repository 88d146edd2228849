"""What ordinary model answers do to the memory: negations, past states, end dates, plans, other people's facts.

Each case is the answer a competent model gives for the message in its docstring (wording included: the
statement is what the model wrote), applied by the real consolidation to the embedded store with the real
MiniLM (the ``world`` of tests/support/consolidation.py). The cases are the ones issue 43 traced: before, a
negation reinforced the fact it negated, "used to" and "might" moved the user, an end date was lost.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.support.consolidation import T0
from tests.support.consolidation import world as world  # the fixture, brought in under its name
from tests.support.extractions import entity, fact

DAY = timedelta(days=1)


def one(name: str, label: str, subject: str, predicate: str, statement: str, **extra) -> dict:
    return {"entities": [entity("N1", name, label)], "facts": [fact(subject, predicate, "N1", statement, **extra)]}


def facts(graph, user, predicate=None):
    """(predicate, object, valid_from, valid_until) of the user's own facts, oldest first."""
    return [(f.predicate, f.object_name, f.valid_from, f.valid_until) for f in graph.history(user, "user", predicate)]


def current(graph, user):
    return sorted((p, o) for p, o, _, until in facts(graph, user) if until is None)


def test_a_negation_ends_the_fact_it_negates_instead_of_reinforcing_it(world):
    """ "Turns out I'm not allergic to peanuts." (NOT_ALLERGIC_TO embeds within 0.98 of ALLERGIC_TO.)"""
    graph, user, say = world
    say("m1", one("peanuts", "Food", "user", "ALLERGIC_TO", "User is allergic to peanuts"), T0)
    plan = say("m2", one("peanuts", "Food", "user", "NOT_ALLERGIC_TO", "User is not allergic to peanuts"), T0 + DAY)
    assert plan.reinforced_fact_ids == []
    assert facts(graph, user) == [
        ("ALLERGIC_TO", "peanuts", T0, T0 + DAY),
        ("NOT_ALLERGIC_TO", "peanuts", T0 + DAY, None),
    ]


def test_a_negation_the_model_wrote_only_in_words_is_read_from_the_statement(world):
    """The model kept the positive predicate and wrote the negation in the statement; "no longer" too."""
    graph, user, say = world
    say("m1", one("Google", "Organization", "user", "WORKS_AT", "User works at Google"), T0)
    say("m2", one("Google", "Organization", "user", "WORKS_AT", "User no longer works at Google"), T0 + DAY)
    assert current(graph, user) == [("NOT_WORKS_AT", "Google")]
    assert facts(graph, user, "WORKS_AT") == [("WORKS_AT", "Google", T0, T0 + DAY)]


def test_a_positive_fact_after_a_negation_ends_the_negation(world):
    graph, user, say = world
    say("m1", one("cats", "Thing", "user", "DOES_NOT_LIKE", "User does not like cats"), T0)
    say("m2", one("cats", "Thing", "user", "LIKES", "User likes cats now"), T0 + DAY)
    assert current(graph, user) == [("LIKES", "cats")]
    assert facts(graph, user, "NOT_LIKES") == [("NOT_LIKES", "cats", T0, T0 + DAY)]


def test_used_to_ends_the_current_value_and_adds_no_current_fact(world):
    """ "I used to live in Tampa." said while Tampa was the current home: it is history now."""
    graph, user, say = world
    say("m1", one("Tampa", "City", "user", "LIVES_IN", "User lives in Tampa"), T0)
    plan = say("m2", one("Tampa", "City", "user", "LIVES_IN", "User used to live in Tampa"), T0 + 10 * DAY)
    assert plan.reinforced_fact_ids == [] and plan.new_facts == []
    assert facts(graph, user) == [("LIVES_IN", "Tampa", T0, T0 + 10 * DAY)]


def test_an_undated_past_state_with_nothing_to_end_is_history_never_current(world):
    """ "I used to play the guitar." with no such fact stored: kept, as history only."""
    graph, user, say = world
    say("m1", one("Austin", "City", "user", "LIVES_IN", "User lives in Austin"), T0)
    say("m2", one("guitar", "Thing", "user", "PLAYS", "User used to play the guitar"), T0 + DAY)
    say("m3", one("Tampa", "City", "user", "LIVES_IN", "User used to live in Tampa"), T0 + 2 * DAY)
    assert current(graph, user) == [("LIVES_IN", "Austin")]
    assert ("PLAYS", "guitar", T0 + DAY, T0 + DAY) in facts(graph, user)
    # The undated Tampa record is no member of the slot: Austin is neither superseded nor ended by it.
    austin = graph.history(user, "user", "LIVES_IN")[0]
    assert (austin.object_name, austin.valid_until, austin.superseded_by) == ("Austin", None, None)


def test_an_end_date_in_the_past_ends_the_fact_then(world):
    """ "I left Google in 2022." said in 2024: the job ended in 2022, not when it was said."""
    graph, user, say = world
    y2020, y2022, y2024 = (datetime(y, 1, 1, tzinfo=UTC) for y in (2020, 2022, 2024))
    say("m1", one("Google", "Organization", "user", "WORKS_AT", "User works at Google", valid_from=y2020), y2020)
    answer = one("Google", "Organization", "user", "WORKS_AT", "User left Google in 2022", valid_until="2022-01-01")
    plan = say("m2", answer, y2024)
    assert plan.new_facts == []
    assert facts(graph, user) == [("WORKS_AT", "Google", y2020, y2022)]


def test_a_dated_history_and_a_move_in_one_answer_rebuild_the_slot(world):
    """ "I lived in Tampa until 2020, then moved to Austin." with Tampa stored undated (from 2019)."""
    graph, user, say = world
    y2019, y2020, y2024 = (datetime(y, 1, 1, tzinfo=UTC) for y in (2019, 2020, 2024))
    say("m1", one("Tampa", "City", "user", "LIVES_IN", "User lives in Tampa"), y2019)
    answer = {
        "entities": [entity("N1", "Tampa", "City"), entity("N2", "Austin", "City")],
        "facts": [
            fact("user", "LIVES_IN", "N1", "User lived in Tampa until 2020", valid_until="2020-01-01"),
            fact("user", "LIVES_IN", "N2", "User moved to Austin in 2020", valid_from="2020-01-01"),
        ],
    }
    say("m2", answer, y2024)
    assert facts(graph, user) == [("LIVES_IN", "Tampa", y2019, y2020), ("LIVES_IN", "Austin", y2020, None)]


def test_might_is_a_plan_not_a_move(world):
    """ "I might move to Berlin." given as an undated LIVES_IN Berlin."""
    graph, user, say = world
    say("m1", one("Tampa", "City", "user", "LIVES_IN", "User lives in Tampa"), T0)
    say("m2", one("Berlin", "City", "user", "LIVES_IN", "User might move to Berlin"), T0 + DAY)
    assert current(graph, user) == [("LIVES_IN", "Tampa"), ("PLANS_LIVES_IN", "Berlin")]
    assert [f.memory_type for f in graph.history(user, "user", "PLANS_LIVES_IN")] == ["episodic"]


def test_another_persons_value_under_the_users_subject_moves_nobody(world):
    """ "My sister lives in Paris." given with subject "user"."""
    graph, user, say = world
    say("m1", one("Austin", "City", "user", "LIVES_IN", "User lives in Austin"), T0)
    say("m2", one("Paris", "City", "user", "LIVES_IN", "User's sister lives in Paris"), T0 + DAY)
    assert current(graph, user) == [("LIVES_IN", "Austin"), ("RELATED_LIVES_IN", "Paris")]


def test_works_as_and_job_title_are_one_slot(world):
    """ "I work as a nurse." then "I'm a teacher now.": one current job title, not two."""
    graph, user, say = world
    say("m1", one("nurse", "Role", "user", "WORKS_AS", "User works as a nurse"), T0)
    say("m2", one("teacher", "Role", "user", "JOB_TITLE", "User is a teacher now"), T0 + DAY)
    assert facts(graph, user) == [("JOB_TITLE", "nurse", T0, T0 + DAY), ("JOB_TITLE", "teacher", T0 + DAY, None)]


def test_a_similar_fact_with_another_object_is_not_a_restatement(world):
    """Reinforcement needs the same predicate and object, not just close wording."""
    graph, user, say = world
    say("m1", one("jazz", "Thing", "user", "LIKES", "User likes jazz music"), T0)
    plan = say("m2", one("jazz", "Thing", "user", "DISLIKES", "User dislikes jazz music"), T0 + DAY)
    assert plan.reinforced_fact_ids == [] and [f.predicate for f in plan.new_facts] == ["DISLIKES"]
    plan = say("m3", one("blues", "Thing", "user", "LIKES", "User likes blues music"), T0 + 2 * DAY)
    assert plan.reinforced_fact_ids == [] and len(plan.new_facts) == 1
    plan = say("m4", one("jazz", "Thing", "user", "LIKES", "User really likes jazz music"), T0 + 3 * DAY)
    assert len(plan.reinforced_fact_ids) == 1 and plan.new_facts == []
    assert current(graph, user) == [("DISLIKES", "jazz"), ("LIKES", "blues"), ("LIKES", "jazz")]


def test_an_unnamed_relative_is_one_person_however_the_model_words_it(world):
    """ "My sister is visiting." / "Sister called." / "My older sister is a nurse." then she is named."""
    graph, user, say = world
    person = {"label": "Person"}
    say("m1", {"entities": [entity("N1", "my sister", **person)],
               "facts": [fact("user", "HAS_SISTER", "N1", "User has a sister")]}, T0)  # fmt: skip
    say("m2", {"entities": [entity("N1", "sister", **person)],
               "facts": [fact("N1", "CALLED", "user", "User's sister called")]}, T0 + DAY)  # fmt: skip
    say("m3", {"entities": [entity("N1", "User's older sister", **person, summary="User's sister, a nurse")],
               "facts": [fact("N1", "JOB_TITLE", "nurse", "User's sister is a nurse")]}, T0 + 2 * DAY)  # fmt: skip
    say("m4", {"entities": [entity("N1", "Mia", **person, aliases=["my sister"])],
               "facts": [fact("N1", "LIVES_IN", "Porto", "Mia lives in Porto")]}, T0 + 3 * DAY)  # fmt: skip
    sisters = graph.lookup_entities(user, entity_ids=[], norm_names=["sister", "my sister", "mia"])
    assert [(e.name, e.summary) for e in sisters] == [("sister", "User's sister, a nurse")]
    assert {"my sister", "User's older sister", "Mia"} <= set(sisters[0].aliases)
    assert {f.predicate for f in graph.history(user, "Mia", None)} == {"CALLED", "JOB_TITLE", "LIVES_IN"}


def test_a_late_older_message_ended_by_a_known_later_fact_is_history(world):
    """ "I study marine biology now." (2026) applied first; then the late "I study chemistry." (2024): the
    model sees the 2026 fact in its context and ends chemistry there (valid_until after the message time)."""
    graph, user, say = world
    y2024, y2026 = datetime(2024, 5, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    say("m2", one("marine biology", "Subject", "user", "STUDIES", "User studies marine biology now"), y2026)
    late = one("chemistry", "Subject", "user", "STUDIES", "User studies chemistry", valid_until=y2026.isoformat())
    say("m1", late, y2024)
    assert facts(graph, user) == [("STUDIES", "chemistry", y2024, y2026), ("STUDIES", "marine biology", y2026, None)]


def test_an_end_still_ahead_of_the_clock_is_only_announced(world):
    """ "I'm leaving Google next month." said now: the job is still current."""
    graph, user, say = world
    now = datetime.now(UTC).replace(microsecond=0)
    say("m1", one("Google", "Organization", "user", "WORKS_AT", "User works at Google"), now - 30 * DAY)
    leaving = one("Google", "Organization", "user", "WORKS_AT", "User works at Google until next month",
                  valid_until=(now + 30 * DAY).isoformat())  # fmt: skip
    say("m2", leaving, now)
    assert current(graph, user) == [("WORKS_AT", "Google")]
