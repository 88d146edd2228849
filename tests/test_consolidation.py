"""Consolidation decisions on a real (embedded SQLite) graph store with the real MiniLM embedder."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from tests.support.consolidation import T0
from tests.support.consolidation import world as world  # the fixture, brought in under its name
from tests.support.extractions import entity, fact, lives_in


def chain(graph, user):
    return [(f.object_name, f.valid_from, f.valid_until) for f in graph.history(user, "user", "LIVES_IN")]


def test_a_late_message_with_an_older_event_time_lands_in_the_past(world):
    graph, user, say = world
    say("m2", lives_in("Austin"), T0 + timedelta(days=30))
    say("m1", lives_in("Tampa"), T0)
    assert chain(graph, user) == [("Tampa", T0, T0 + timedelta(days=30)), ("Austin", T0 + timedelta(days=30), None)]


def test_a_late_message_lands_in_the_middle_of_the_history(world):
    """Arrival order 0, 2, 1: the late move splits the interval that was open between the other two."""
    graph, user, say = world
    days = [T0, T0 + timedelta(days=30), T0 + timedelta(days=60)]
    for i in (0, 2, 1):
        say(f"m{i}", lives_in(["Tampa", "Austin", "Denver"][i]), days[i])
    assert chain(graph, user) == [("Tampa", days[0], days[1]), ("Austin", days[1], days[2]), ("Denver", days[2], None)]
    history = graph.history(user, "user", "LIVES_IN")
    assert [f.superseded_by for f in history] == [history[1].id, history[2].id, None]
    assert graph.stats(user).current_facts == 1


def test_the_same_message_twice_is_written_once(world):
    """The stage's idempotency: a redelivered message finds its write in the graph and changes nothing."""
    graph, user, say = world
    say("m1", lives_in("Austin"), T0)
    before = (graph.stats(user), graph.user_version(user), chain(graph, user))
    say("m1", lives_in("Austin"), T0, again=True)
    assert (graph.stats(user), graph.user_version(user), chain(graph, user)) == before


def test_restating_the_current_value_reinforces_instead_of_adding(world):
    graph, user, say = world
    say("m1", lives_in("Austin"), T0)
    plan = say("m2", lives_in("Austin"), T0 + timedelta(days=5))
    assert plan.new_facts == [] and len(plan.reinforced_fact_ids) == 1
    facts = graph.history(user, "user", "LIVES_IN")
    assert len(facts) == 1 and facts[0].source_ids == ["m1", "m2"]


def test_moving_back_opens_a_new_interval(world):
    graph, user, say = world
    for i, city in enumerate(["Tampa", "Austin", "Tampa"]):
        say(f"m{i}", lives_in(city), T0 + timedelta(days=30 * i))
    assert [c[0] for c in chain(graph, user)] == ["Tampa", "Austin", "Tampa"]
    assert [c[2] is None for c in chain(graph, user)] == [False, False, True]


def test_entities_resolve_by_name_and_alias_within_the_user(world):
    graph, user, say = world
    say("m1", {"entities": [entity("e1", "Alexander", "Person", aliases=["Alex"])],
               "facts": [fact("user", "HAS_BROTHER", "e1", "User's brother is Alexander")]}, T0)  # fmt: skip
    plan = say("m2", {"entities": [entity("e1", "alex", "Person")],
                      "facts": [fact("e1", "WORKS_AT", None, "Alex works at a bank")]}, T0)  # fmt: skip
    assert plan.new_entities == []
    assert graph.stats(user).entities == 2  # the user and Alexander


def test_near_identical_multi_valued_facts_are_reinforced_not_duplicated(world):
    graph, user, say = world
    say("m1", {"entities": [entity("e1", "jazz")], "facts": [fact("user", "LIKES", "e1", "User likes jazz music")]}, T0)
    plan = say(
        "m2", {"entities": [entity("e1", "jazz")], "facts": [fact("user", "LIKES", "e1", "User likes jazz music.")]}, T0
    )
    assert plan.new_facts == [] and len(plan.reinforced_fact_ids) == 1
    assert graph.stats(user).facts == 1


def test_an_updates_hint_supersedes_the_context_fact(world):
    graph, user, say = world
    first = say(
        "m1",
        {"entities": [entity("e1", "tennis")], "facts": [fact("user", "PLAYS", "e1", "User plays tennis weekly")]},
        T0,
    )
    old_id = first.new_facts[0].id
    second = say("m2", {"entities": [entity("e1", "tennis")],
                        "facts": [fact("user", "PLAYS", "e1", "User stopped playing tennis", updates=old_id)]},
                 T0 + timedelta(days=3))  # fmt: skip
    old = graph.get_facts(user, [old_id])[0]
    assert old.valid_until == T0 + timedelta(days=3) and old.superseded_by == second.new_facts[0].id
    assert graph.stats(user).current_facts == 1


def test_store_reads_per_message_do_not_grow_with_its_names_and_hits(world):
    """One entity lookup, one fact read by id, one slot read per message: however many entities, bare
    names, context ids and near-duplicate hits it carries (the reads used to be one per hit and per name)."""
    graph, user, say = world
    first = say("m1", {"entities": [entity("e1", "Alexander", "Person", aliases=["Alex"]), entity("e2", "jazz"),
                                     entity("e3", "Acme Corp", "Organization")],
                       "facts": [fact("user", "HAS_BROTHER", "e1", "User's brother is Alexander"),
                                 fact("user", "LIKES", "e2", "User likes jazz music"),
                                 fact("user", "WORKS_AT", "e3", "User works at Acme Corp", single_valued=True),
                                 fact("user", "PLAYS", "tennis", "User plays tennis")]}, T0)  # fmt: skip
    acme = next(e.id for e in first.new_entities if e.name == "Acme Corp")
    plays = next(f.id for f in first.new_facts if f.predicate == "PLAYS")
    graph.reads.clear()
    plan = say("m2", {"entities": [entity("e1", "alex", "Person"), entity("e2", "Jazz"), entity(acme, "Acme Corp"),
                                   entity("e4", "Denver", "City"), entity("e5", "Bob", "Person")],
                      "facts": [fact("e1", "LIVES_IN", "e4", "Alex lives in Denver", single_valued=True),
                                fact("user", "LIKES", "e2", "User likes jazz music."),
                                fact("user", "KNOWS", "e5", "User knows Bob"),
                                fact("e5", "WORKS_AT", acme, "Bob works at Acme Corp"),
                                fact("user", "OWNS", "guitar", "User owns a guitar"),
                                fact("Tennis", "IS_A", "sport", "Tennis is a sport")],
                      "ends": [plays]}, T0 + timedelta(days=1))  # fmt: skip
    assert graph.reads == Counter({"lookup_entities": 1, "facts_and_slots": 1})
    by_name = {e.name for e in plan.new_entities}
    assert by_name == {"Denver", "Bob", "guitar", "sport"}  # alex, jazz, Acme Corp and tennis were known
    assert len(plan.reinforced_fact_ids) == 1 and [c.id for c in plan.fact_changes] == [plays]
    assert graph.stats(user).entities == 1 + 4 + 4  # the user, the first message's four, the new four
