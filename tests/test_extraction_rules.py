"""The offline extractors: the rule-based fact extractor and the trivial-message filter."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from engram_api.models import SELF_REF, ExtractedEntity, ExtractedFact, Extraction
from engram_api.naming import LABELS, is_single_valued, sanitize_predicate
from engram_workers.extraction import rules
from engram_workers.extraction.rules import extract_rules
from engram_workers.extraction.trivial import is_trivial

T = datetime(2024, 5, 10, 15, 30, tzinfo=UTC)


def check_valid(ex: Extraction) -> None:
    """What every extraction must satisfy, whatever the input."""
    assert isinstance(ex, Extraction)
    Extraction.model_validate(ex.model_dump())
    refs = [e.ref for e in ex.entities]
    assert len(refs) == len(set(refs)), "entity refs are unique"
    assert SELF_REF not in refs, "the user is never an entity"
    assert len(ex.entities) <= 100 and len(ex.facts) <= 100
    used = {f.subject for f in ex.facts} | {f.object for f in ex.facts if f.object}
    assert set(refs) <= used, "no entity without a fact"
    for e in ex.entities:
        assert e.label in LABELS
        assert e.name.strip() == e.name and e.name
    for f in ex.facts:
        assert f.subject == SELF_REF or f.subject in refs
        assert f.object is None or f.object in refs
        assert sanitize_predicate(f.predicate) == f.predicate
        assert f.single_valued is is_single_valued(f.predicate)
        assert 0.5 <= f.importance <= 0.9
        assert f.statement.strip() and f.statement[0].isupper()
        assert f.updates is None


def run(text: str) -> Extraction:
    ex = extract_rules(text, event_time=T)
    check_valid(ex)
    return ex


def entity(ex: Extraction, ref: str | None) -> ExtractedEntity:
    return next(e for e in ex.entities if e.ref == ref)


def name_of(ex: Extraction, ref: str | None) -> str | None:
    if ref is None:
        return None
    return "user" if ref == SELF_REF else entity(ex, ref).name


def triples(ex: Extraction) -> set[tuple[str | None, str, str | None]]:
    """(subject name, predicate, object name): what the extraction says, refs resolved."""
    return {(name_of(ex, f.subject), f.predicate, name_of(ex, f.object)) for f in ex.facts}


def only(ex: Extraction, predicate: str) -> ExtractedFact:
    found = [f for f in ex.facts if f.predicate == predicate]
    assert len(found) == 1, f"expected one {predicate}, got {[(f.predicate, f.statement) for f in ex.facts]}"
    return found[0]


def object_of(ex: Extraction, predicate: str) -> ExtractedEntity:
    fact = only(ex, predicate)
    assert fact.object is not None
    return entity(ex, fact.object)


@contextmanager
def no_logged_errors() -> Iterator[list[logging.LogRecord]]:
    """The extractor's safety net logs instead of raising; a test must see neither."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(level=logging.ERROR)
    log = logging.getLogger(rules.__name__)
    log.addHandler(handler)
    try:
        yield records
    finally:
        log.removeHandler(handler)
    assert not records, records[0].getMessage()


# ------------------------------------------------------------------------------------------- where one lives


@pytest.mark.parametrize(
    ("text", "place"),
    [
        ("I live in Austin", "Austin"),
        ("I live in Austin.", "Austin"),
        ("I'm living in San Francisco!", "San Francisco"),
        ("I am living in Berlin", "Berlin"),
        ("i live in austin", "Austin"),
        ("im based in new york", "New York"),
        ("I've lived in Chicago for 10 years.", "Chicago"),
        ("I currently live in Lisbon with my girlfriend", "Lisbon"),
        ("I live in a small town in Texas", "Texas"),
        ("I live in St. Louis.", "St. Louis"),
        ("I live in München", "München"),
    ],
)
def test_lives_in(text: str, place: str) -> None:
    ex = run(text)
    fact = only(ex, "LIVES_IN")
    obj = entity(ex, fact.object)
    assert (fact.subject, obj.name, obj.label) == (SELF_REF, place, "Place")
    assert fact.single_valued is True
    assert fact.statement == f"User lives in {place}"
    assert fact.memory_type == "semantic"
    assert fact.valid_from is None  # a standing fact, not a change
    assert fact.importance >= 0.8


def test_the_article_is_stripped_from_the_name_but_kept_in_the_statement() -> None:
    ex = run("I live in the Bay Area.")
    assert object_of(ex, "LIVES_IN").name == "Bay Area"
    assert only(ex, "LIVES_IN").statement == "User lives in the Bay Area"


@pytest.mark.parametrize("text", ["I moved to Denver", "I just moved to Denver last week.", "I relocated to Denver"])
def test_a_move_is_a_dated_change_of_residence(text: str) -> None:
    ex = run(text)
    fact = only(ex, "LIVES_IN")
    assert name_of(ex, fact.object) == "Denver"
    assert fact.valid_from == T
    assert fact.single_valued is True


def test_moved_from_x_to_y_lives_in_y_only() -> None:
    ex = run("I just moved from Boston to Denver.")
    assert triples(ex) == {("user", "LIVES_IN", "Denver"), ("user", "MOVED_FROM", "Boston")}
    moved = only(ex, "MOVED_FROM")
    assert moved.single_valued is False
    assert moved.memory_type == "episodic"
    assert moved.statement == "User moved from Boston to Denver"
    assert only(ex, "LIVES_IN").valid_from == T


def test_from_is_not_single_valued() -> None:
    ex = run("I'm from Ohio.")
    fact = only(ex, "FROM")
    assert name_of(ex, fact.object) == "Ohio"
    assert fact.single_valued is False
    assert fact.statement == "User is from Ohio"


def test_past_homes_and_birthplaces() -> None:
    assert ("user", "LIVED_IN", "London") in triples(run("I used to live in London."))
    assert ("user", "GREW_UP_IN", "Ohio") in triples(run("I grew up in Ohio"))
    assert ("user", "BORN_IN", "Madrid") in triples(run("I was born in Madrid."))
    assert only(run("I was born in 1990"), "BIRTH_YEAR").statement == "User was born in 1990"


@pytest.mark.parametrize(
    "text",
    [
        "I live in an apartment.",
        "I live in the city.",
        "I live here.",
        "I don't live in Austin anymore.",
        "I no longer live in Austin.",
        "I'm moving to Seattle next month.",
        "If I lived in Paris, I would be happy.",
        "We live in Austin.",
    ],
)
def test_no_residence_from_housing_negation_future_or_hypothesis(text: str) -> None:
    assert not [f for f in run(text).facts if f.predicate == "LIVES_IN"]


# ------------------------------------------------------------------------------------------------- work


@pytest.mark.parametrize(
    ("text", "org"),
    [
        ("I work at Google", "Google"),
        ("I work for Acme Corp.", "Acme Corp"),
        ("i work at dell", "Dell"),
        ("I've been working at Shopify for 3 years", "Shopify"),
        ("I work remotely for GitLab", "GitLab"),
        ("I work at the University of Texas", "University of Texas"),
    ],
)
def test_works_at(text: str, org: str) -> None:
    ex = run(text)
    fact = only(ex, "WORKS_AT")
    obj = entity(ex, fact.object)
    assert (fact.subject, obj.name, obj.label) == (SELF_REF, org, "Organization")
    assert fact.single_valued is True
    assert fact.valid_from is None
    assert fact.statement.startswith("User works at ")


@pytest.mark.parametrize(
    ("text", "org"),
    [
        ("I started a new job at Stripe.", "Stripe"),
        ("I just joined Microsoft", "Microsoft"),
        ("I got a job at Apple!", "Apple"),
        ("I started working at Netflix", "Netflix"),
        ("I got hired at Spotify last week", "Spotify"),
    ],
)
def test_a_new_job_is_dated(text: str, org: str) -> None:
    ex = run(text)
    fact = only(ex, "WORKS_AT")
    assert name_of(ex, fact.object) == org
    assert fact.valid_from == T


@pytest.mark.parametrize(
    ("text", "role"),
    [
        ("I'm a nurse", "Nurse"),
        ("I am an engineer.", "Engineer"),
        ("I work as a teacher", "Teacher"),
        ("I work as a dog walker", "Dog Walker"),
        ("i'm a software engineer", "Software Engineer"),
        ("I'm a PhD student.", "PhD Student"),
    ],
)
def test_works_as(text: str, role: str) -> None:
    ex = run(text)
    fact = only(ex, "WORKS_AS")
    obj = entity(ex, fact.object)
    assert (fact.subject, obj.name, obj.label) == (SELF_REF, role, "Role")
    assert fact.single_valued is True


def test_role_at_company_gives_both_facts() -> None:
    ex = run("I'm a software engineer at Google.")
    assert triples(ex) == {("user", "WORKS_AS", "Software Engineer"), ("user", "WORKS_AT", "Google")}
    assert only(ex, "WORKS_AS").statement == "User works as a software engineer"
    assert only(ex, "WORKS_AT").statement == "User works at Google"


def test_company_then_role() -> None:
    ex = run("I work for Google as a data scientist.")
    assert triples(ex) == {("user", "WORKS_AT", "Google"), ("user", "WORKS_AS", "Data Scientist")}


def test_executive_of_company() -> None:
    assert triples(run("I'm the CEO of Acme.")) == {("user", "WORKS_AS", "CEO"), ("user", "WORKS_AT", "Acme")}
    assert triples(run("I'm the VP of Engineering at Stripe")) == {
        ("user", "WORKS_AS", "VP of Engineering"),
        ("user", "WORKS_AT", "Stripe"),
    }


def test_joining_a_club_is_a_membership_not_a_job() -> None:
    ex = run("I joined a gym.")
    assert triples(ex) == {("user", "MEMBER_OF", "gym")}
    assert only(ex, "MEMBER_OF").single_valued is False


def test_lowercase_writers_get_capitalized_names_and_cased_writers_keep_theirs() -> None:
    assert triples(run("i work at google and live in new york")) == {
        ("user", "WORKS_AT", "Google"),
        ("user", "LIVES_IN", "New York"),
    }
    assert triples(run("I work at eBay and live in NYC")) == {("user", "WORKS_AT", "eBay"), ("user", "LIVES_IN", "NYC")}
    assert run("i live in /usr/local").facts == []


def test_past_job() -> None:
    ex = run("I used to work at IBM.")
    assert triples(ex) == {("user", "WORKED_AT", "IBM")}
    assert only(ex, "WORKED_AT").single_valued is False


@pytest.mark.parametrize(
    "text",
    ["I'm a good cook.", "I'm a morning person.", "I'm an aspiring writer", "I work from home.", "I work at home."],
)
def test_not_a_job(text: str) -> None:
    assert not {f.predicate for f in run(text).facts} & {"WORKS_AS", "WORKS_AT"}


# ------------------------------------------------------------------------------------- family and friends


def test_relative_and_what_they_do_in_one_clause() -> None:
    ex = run("My brother Alex works at Amazon.")
    alex = next(e for e in ex.entities if e.name == "Alex")
    assert alex.label == "Person"
    assert alex.summary == "User's brother"
    assert triples(ex) == {("user", "HAS_BROTHER", "Alex"), ("Alex", "WORKS_AT", "Amazon")}
    works = only(ex, "WORKS_AT")
    assert works.subject == alex.ref  # the fact is about Alex, not the user
    assert works.statement == "Alex works at Amazon"
    assert works.single_valued is True
    assert only(ex, "HAS_BROTHER").statement == "User has a brother named Alex"
    assert only(ex, "HAS_BROTHER").single_valued is False
    assert object_of(ex, "WORKS_AT").label == "Organization"


def test_wife_who_is_a_nurse() -> None:
    ex = run("my wife Sarah is a nurse")
    assert triples(ex) == {("user", "HAS_WIFE", "Sarah"), ("Sarah", "WORKS_AS", "Nurse")}
    sarah = object_of(ex, "HAS_WIFE")
    assert "user's wife" in sarah.aliases
    assert only(ex, "WORKS_AS").statement == "Sarah works as a nurse"
    assert only(ex, "WORKS_AS").importance < 0.8  # about someone else: less than the user's own job


@pytest.mark.parametrize(
    "text",
    [
        "My brother, Alex, works at Amazon.",
        "my brother alex works at amazon",
        "My brother is named Alex and he works at Amazon.",
        "I have a brother named Alex who works at Amazon.",
        "My brother Alex just started working at Amazon",
    ],
)
def test_relative_phrasings(text: str) -> None:
    ex = run(text)
    assert ("user", "HAS_BROTHER", "Alex") in triples(ex)
    assert ("Alex", "WORKS_AT", "Amazon") in triples(ex)


def test_several_facts_about_a_relative() -> None:
    ex = run("My older sister Mia lives in Paris, works at Airbus and speaks French.")
    assert triples(ex) == {
        ("user", "HAS_SISTER", "Mia"),
        ("Mia", "LIVES_IN", "Paris"),
        ("Mia", "WORKS_AT", "Airbus"),
        ("Mia", "SPEAKS", "French"),
    }
    assert only(ex, "HAS_SISTER").statement == "User has an older sister named Mia"


def test_unnamed_relative_and_a_pronoun_in_the_next_sentence() -> None:
    ex = run("My sister is a doctor. She lives in Denver.")
    assert triples(ex) == {
        ("user", "HAS_SISTER", "User's sister"),
        ("User's sister", "WORKS_AS", "Doctor"),
        ("User's sister", "LIVES_IN", "Denver"),
    }


def test_a_relative_alone_with_nothing_said_about_them_is_no_fact() -> None:
    assert run("My brother is great.").facts == []


def test_relative_by_reverse_phrasing() -> None:
    assert triples(run("Alex is my brother.")) == {("user", "HAS_BROTHER", "Alex")}


def test_two_relatives_in_one_clause() -> None:
    ex = run("I have an older sister named Mia and a younger brother named Sam.")
    assert triples(ex) == {("user", "HAS_SISTER", "Mia"), ("user", "HAS_BROTHER", "Sam")}


def test_only_one_of_a_kind_relations_get_a_relation_alias() -> None:
    # Consolidation resolves entities by alias, so two brothers must not share "user's brother".
    ex = run("My brother Alex lives in Denver. My brother Sam lives in Boston. My mom Linda lives in Ohio.")
    alex, sam = (next(e for e in ex.entities if e.name == n) for n in ("Alex", "Sam"))
    assert alex.ref != sam.ref
    assert alex.aliases == [] and sam.aliases == []
    assert next(e for e in ex.entities if e.name == "Linda").aliases == ["user's mother"]


def test_married_to() -> None:
    ex = run("I'm married to Jessica.")
    fact = only(ex, "MARRIED_TO")
    jessica = entity(ex, fact.object)
    assert (jessica.name, jessica.label) == ("Jessica", "Person")
    assert fact.single_valued is True
    assert fact.statement == "User is married to Jessica"


def test_relationship_status() -> None:
    fact = only(run("I'm single."), "RELATIONSHIP_STATUS")
    assert (fact.object, fact.statement, fact.single_valued) == (None, "User is single", True)


# ------------------------------------------------------------------------------------------- preferences


def test_likes_a_list() -> None:
    ex = run("I like pizza, sushi and hiking.")
    assert triples(ex) == {("user", "LIKES", "pizza"), ("user", "LIKES", "sushi"), ("user", "LIKES", "hiking")}
    labels = {e.name: e.label for e in ex.entities}
    assert labels == {"pizza": "Food", "sushi": "Food", "hiking": "Activity"}
    assert all(not f.single_valued and f.memory_type == "semantic" for f in ex.facts)


@pytest.mark.parametrize(
    ("text", "thing"),
    [
        ("I love hiking", "hiking"),
        ("I really enjoy jazz.", "jazz"),
        ("I'm into rock climbing", "rock climbing"),
        ("I'm a big fan of Star Wars", "Star Wars"),
        ("I love to hike", "hiking"),
        ("I like rock and roll", "rock and roll"),
    ],
)
def test_likes(text: str, thing: str) -> None:
    assert triples(run(text)) == {("user", "LIKES", thing)}


def test_a_statement_keeps_the_detail_the_entity_drops() -> None:
    ex = run("I like hiking in the mountains.")
    assert object_of(ex, "LIKES").name == "hiking"
    assert only(ex, "LIKES").statement == "User likes hiking in the mountains"


@pytest.mark.parametrize(
    ("text", "thing"),
    [
        ("I don't like cilantro.", "cilantro"),
        ("I do not like mushrooms", "mushrooms"),
        ("I hate mornings", "mornings"),
        ("I dislike country music", "country music"),
        ("I can't stand traffic", "traffic"),
        ("I'm not a fan of horror movies", "horror movies"),
    ],
)
def test_dislikes(text: str, thing: str) -> None:
    assert triples(run(text)) == {("user", "DISLIKES", thing)}


@pytest.mark.parametrize(
    "text",
    ["I like it.", "I love it when it rains", "I like that idea", "I love you", "I love my job", "I'd like a coffee"],
)
def test_no_pronoun_or_possessive_entities(text: str) -> None:
    ex = run(text)
    assert ex.facts == [] and ex.entities == []


def test_prefers_over() -> None:
    ex = run("I prefer tea over coffee.")
    assert triples(ex) == {("user", "PREFERS", "tea")}
    assert object_of(ex, "PREFERS").label == "Drink"
    assert only(ex, "PREFERS").statement == "User prefers tea over coffee"


def test_prefers_an_activity() -> None:
    assert only(run("I prefer to work from home"), "PREFERS").statement == "User prefers working from home"


@pytest.mark.parametrize(
    ("text", "predicate", "thing", "label"),
    [
        ("My favorite color is blue.", "FAVORITE_COLOR", "blue", "Concept"),
        ("my favourite colour is green", "FAVORITE_COLOR", "green", "Concept"),
        ("My favorite food is sushi", "FAVORITE_FOOD", "sushi", "Food"),
        ("Sushi is my favorite food.", "FAVORITE_FOOD", "sushi", "Food"),
        ("My favorite movie is The Matrix", "FAVORITE_MOVIE", "Matrix", "Media"),
        ("my favorite city is paris", "FAVORITE_CITY", "Paris", "Place"),
    ],
)
def test_favorites(text: str, predicate: str, thing: str, label: str) -> None:
    ex = run(text)
    fact = only(ex, predicate)
    obj = entity(ex, fact.object)
    assert (obj.name, obj.label) == (thing, label)
    assert fact.single_valued is is_single_valued(predicate)
    assert fact.statement.startswith("User's favorite")


def test_plural_favorites_are_likes_not_a_single_valued_slot() -> None:
    ex = run("My favorite foods are pizza and tacos.")
    assert triples(ex) == {("user", "LIKES", "pizza"), ("user", "LIKES", "tacos")}


def test_allergies() -> None:
    ex = run("I'm allergic to peanuts and shellfish.")
    assert triples(ex) == {("user", "ALLERGIC_TO", "peanuts"), ("user", "ALLERGIC_TO", "shellfish")}
    assert all(f.importance >= 0.8 and f.statement.startswith("User is allergic to ") for f in ex.facts)
    assert triples(run("I have a severe peanut allergy")) == {("user", "ALLERGIC_TO", "peanut")}


@pytest.mark.parametrize(
    ("text", "statement"),
    [
        ("I'm vegetarian.", "User follows a vegetarian diet"),
        ("I am a vegan", "User follows a vegan diet"),
        ("im gluten free", "User follows a gluten-free diet"),
    ],
)
def test_diet_is_an_attribute(text: str, statement: str) -> None:
    ex = run(text)
    fact = only(ex, "DIET")
    assert (fact.object, fact.statement) == (None, statement)
    assert ex.entities == []
    assert not [f for f in ex.facts if f.predicate == "WORKS_AS"]


def test_not_vegetarian() -> None:
    assert run("I'm not vegetarian.").facts == []


# --------------------------------------------------------------------------------------------- studies


def test_studies_subject_at_school() -> None:
    ex = run("I study computer science at MIT.")
    assert triples(ex) == {("user", "STUDIES", "computer science"), ("user", "STUDIES_AT", "MIT")}
    assert object_of(ex, "STUDIES").label == "Subject"
    assert object_of(ex, "STUDIES_AT").label == "Organization"
    assert only(ex, "STUDIES_AT").single_valued is True
    assert only(ex, "STUDIES").single_valued is False


def test_studying() -> None:
    assert triples(run("I'm studying biology")) == {("user", "STUDIES", "biology")}


def test_student_of_field_at_school() -> None:
    ex = run("I'm a PhD student in physics at MIT.")
    assert triples(ex) == {
        ("user", "WORKS_AS", "PhD Student"),
        ("user", "STUDIES", "physics"),
        ("user", "STUDIES_AT", "MIT"),
    }


def test_graduated() -> None:
    ex = run("I graduated from Stanford in 2015 with a degree in history.")
    assert triples(ex) == {("user", "GRADUATED_FROM", "Stanford"), ("user", "STUDIED", "history")}
    assert only(ex, "GRADUATED_FROM").statement == "User graduated from Stanford in 2015"
    assert only(ex, "GRADUATED_FROM").single_valued is False


# ------------------------------------------------------------------------------------------------ pets


def test_pet_named() -> None:
    ex = run("I have a dog named Max.")
    fact = only(ex, "HAS_PET")
    max_ = entity(ex, fact.object)
    assert (max_.name, max_.label, max_.summary) == ("Max", "Pet", "dog")
    assert fact.statement == "User has a dog named Max"
    assert fact.single_valued is False


def test_pet_and_what_it_likes() -> None:
    ex = run("My cat Luna loves tuna.")
    assert triples(ex) == {("user", "HAS_PET", "Luna"), ("Luna", "LIKES", "tuna")}
    assert object_of(ex, "HAS_PET").summary == "cat"


def test_two_pets() -> None:
    ex = run("I have two cats named Luna and Milo")
    assert triples(ex) == {("user", "HAS_PET", "Luna"), ("user", "HAS_PET", "Milo")}


def test_adopted_pet_is_dated() -> None:
    ex = run("I just adopted a puppy named Biscuit!")
    assert only(ex, "HAS_PET").valid_from == T
    assert object_of(ex, "HAS_PET").name == "Biscuit"


# ------------------------------------------------------------------------------------- languages, hobbies


def test_speaks_languages() -> None:
    ex = run("I speak English, Spanish and a little French.")
    assert triples(ex) == {("user", "SPEAKS", lang) for lang in ("English", "Spanish", "French")}
    assert {e.label for e in ex.entities} == {"Language"}


def test_language_names_are_capitalized() -> None:
    assert triples(run("i speak german")) == {("user", "SPEAKS", "German")}


def test_learning() -> None:
    ex = run("I'm learning Japanese.")
    assert triples(ex) == {("user", "LEARNING", "Japanese")}
    assert object_of(ex, "LEARNING").label == "Language"
    assert only(ex, "LEARNING").statement == "User is learning Japanese"
    assert triples(run("I'm learning to code")) == {("user", "LEARNING", "coding")}


@pytest.mark.parametrize("text", ["I speak my mind.", "I speak quickly", "I speak to my mom."])
def test_no_language_without_one(text: str) -> None:
    assert run(text).facts == []


def test_plays() -> None:
    ex = run("I play guitar and tennis.")
    assert triples(ex) == {("user", "PLAYS", "guitar"), ("user", "PLAYS", "tennis")}
    assert {e.label for e in ex.entities} == {"Activity"}
    assert run("I play with my kids.").facts == []


def test_hobby() -> None:
    ex = run("My hobby is knitting.")
    assert triples(ex) == {("user", "HAS_HOBBY", "knitting")}
    assert only(ex, "HAS_HOBBY").statement == "User enjoys knitting as a hobby"


# ------------------------------------------------------------------------------------- age and birthday


@pytest.mark.parametrize("text", ["I'm 34 years old.", "I'm 34.", "I am 34", "im 34 yrs old", "I'm 34, btw"])
def test_age_is_an_attribute(text: str) -> None:
    ex = run(text)
    fact = only(ex, "AGE")
    assert fact.object is None
    assert fact.statement == "User is 34 years old"
    assert fact.single_valued is True
    assert ex.entities == []


def test_turned_is_dated() -> None:
    fact = only(run("I turned 30 yesterday."), "AGE")
    assert (fact.statement, fact.valid_from) == ("User is 30 years old", T)


@pytest.mark.parametrize("text", ["I'm 5 minutes away", "I'm 250 years old", "I'm 0"])
def test_not_an_age(text: str) -> None:
    assert not [f for f in run(text).facts if f.predicate == "AGE"]


def test_birthday() -> None:
    fact = only(run("My birthday is March 3rd."), "BIRTHDAY")
    assert (fact.object, fact.statement, fact.single_valued) == (None, "User's birthday is March 3rd", True)
    assert only(run("my birthday is today"), "BIRTHDAY").statement == "User's birthday is May 10"
    assert run("My birthday is soon.").facts == []


def test_name() -> None:
    assert only(run("My name is Sam Johnson."), "NAME").statement == "User's name is Sam Johnson"
    assert only(run("call me sam"), "NAME").statement == "User's name is Sam"


# ----------------------------------------------------------------------------------- events and habits


def test_trip_last_week_is_episodic() -> None:
    ex = run("I went to Paris last week.")
    fact = only(ex, "VISITED")
    assert name_of(ex, fact.object) == "Paris"
    assert fact.memory_type == "episodic"
    assert fact.statement == "User visited Paris last week"
    assert fact.valid_from is None  # "last week" names no single day


def test_trip_with_a_day_precise_date() -> None:
    fact = only(run("I was in London yesterday."), "VISITED")
    assert fact.valid_from == T - timedelta(days=1)
    assert fact.statement == "User visited London on 2024-05-09"


def test_errands_are_not_trips() -> None:
    assert run("I went to the store yesterday.").facts == []
    assert run("I went to bed late last night.").facts == []


def test_habit_is_procedural() -> None:
    ex = run("I usually drink coffee in the morning.")
    fact = only(ex, "HAS_HABIT")
    assert fact.memory_type == "procedural"
    assert fact.object is None
    assert fact.statement == "User usually drinks coffee in the morning"


def test_habit_statement_is_in_the_third_person() -> None:
    assert only(run("I walk my dog every morning"), "HAS_HABIT").statement == "User walks their dog every morning"


def test_habit_keeps_the_activity_fact() -> None:
    assert triples(run("I play tennis every Sunday.")) == {("user", "HAS_HABIT", None), ("user", "PLAYS", "tennis")}


def test_a_negated_habit_is_no_preference() -> None:
    assert triples(run("I never eat meat.")) == {("user", "HAS_HABIT", None)}
    assert not [f for f in run("I never like mornings").facts if f.predicate == "LIKES"]


def test_a_routine_does_not_replace_where_one_works() -> None:
    ex = run("I usually work at the library on Sundays.")
    assert not [f for f in ex.facts if f.single_valued]
    assert only(ex, "HAS_HABIT").statement == "User usually works at the library on Sundays"


# --------------------------------------------------------------------------------- several facts at once


def test_two_facts_in_one_sentence() -> None:
    ex = run("I live in Austin and work at Dell.")
    assert triples(ex) == {("user", "LIVES_IN", "Austin"), ("user", "WORKS_AT", "Dell")}


def test_many_facts_in_one_message() -> None:
    ex = run(
        "Hi! I'm 34, I live in Austin, and I love hiking. I'm from Ohio but work at Dell now.\n"
        "My wife Sarah is a teacher and we have a dog named Rex. Where do I work?"
    )
    assert triples(ex) == {
        ("user", "AGE", None),
        ("user", "LIVES_IN", "Austin"),
        ("user", "LIKES", "hiking"),
        ("user", "FROM", "Ohio"),
        ("user", "WORKS_AT", "Dell"),
        ("user", "HAS_WIFE", "Sarah"),
        ("Sarah", "WORKS_AS", "Teacher"),
    }


def test_a_list_stays_one_clause_but_a_new_verb_starts_another() -> None:
    ex = run("I speak English and Spanish and play the piano")
    assert triples(ex) == {("user", "SPEAKS", "English"), ("user", "SPEAKS", "Spanish"), ("user", "PLAYS", "piano")}


def test_same_name_twice_is_one_entity() -> None:
    ex = run("I live in Austin. My brother Alex also lives in Austin.")
    austins = [e for e in ex.entities if e.name == "Austin"]
    assert len(austins) == 1
    assert triples(ex) == {
        ("user", "LIVES_IN", "Austin"),
        ("user", "HAS_BROTHER", "Alex"),
        ("Alex", "LIVES_IN", "Austin"),
    }
    assert [f.object for f in ex.facts if f.predicate == "LIVES_IN"] == [austins[0].ref] * 2


def test_restating_a_fact_does_not_duplicate_it() -> None:
    ex = run("I live in Austin. I live in Austin!")
    assert len(ex.facts) == 1 and len(ex.entities) == 1


# -------------------------------------------------------------------------------------------- negatives


@pytest.mark.parametrize(
    "text",
    [
        "Where do I live?",
        "Do I like sushi?",
        "what's my favorite color?",
        "Can you remind me where I work",
        "What is my brother's name?",
        "Play some jazz",
        "Tell me about Paris.",
        "Speak Spanish please",
        "I think so.",
        "I wonder if I like it",
        "The weather is nice today.",
        "You live in Austin?",
    ],
)
def test_nothing_from_questions_and_requests(text: str) -> None:
    ex = run(text)
    assert ex.facts == [] and ex.entities == []


@pytest.mark.parametrize(
    "text",
    ["", "   ", "\n\n", "?!?", "😂😂", "I", "my", "I am", "my brother", "I live in", "I'm a", "\x00\x01", "I " * 5000],
)
def test_empty_or_meaningless_input(text: str) -> None:
    with no_logged_errors():
        ex = run(text)
    assert ex.facts == [] and ex.entities == []


def test_non_text_input_gives_an_empty_extraction() -> None:
    assert extract_rules(None, event_time=T) == Extraction()  # type: ignore[arg-type]


@pytest.mark.timeout(120)  # a runaway regex shows as a timeout; how fast it is, the benchmarks say
def test_huge_input_is_bounded() -> None:
    text = "".join(f"My friend Person{i} lives in City{i}. " for i in range(3000)) + "x" * 1_000_000
    with no_logged_errors():
        ex = run(text)
    assert len(ex.facts) == 100 and len(ex.entities) <= 100


def test_a_cut_message_does_not_yield_a_truncated_name() -> None:
    ex = run("I live in Austin. " * 5000)
    assert {e.name for e in ex.entities} == {"Austin"}


# -------------------------------------------------------------------------------------------- properties

# Words the rules react to, plus odd characters: random mixes reach deep into the rule table.
_VOCABULARY = """
    I I'm i im my My brother sister wife dog cat named called Alex alex Sarah live lives in at work works for as a an
    the and , . ? ! like love hate don't prefer over to moved from started joined job new speak learning play study
    studying graduated allergic vegetarian 34 years old birthday is favorite food color hobby married have two who he
    she usually always never every day went was visited Paris Austin Google nurse engineer student PhD of with 's —
    ... 😂 東京 é İ ﬁ
"""
_WORDS = (*_VOCABULARY.split(), "\n")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_never_raises_on_arbitrary_text(text: str) -> None:
    with no_logged_errors():
        check_valid(extract_rules(text, event_time=T))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_WORDS), max_size=40).map(" ".join))
def test_never_raises_on_sentence_like_text(text: str) -> None:
    with no_logged_errors():
        check_valid(extract_rules(text, event_time=T))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(_WORDS), max_size=30).map(" ".join))
def test_deterministic(text: str) -> None:
    assert extract_rules(text, event_time=T) == extract_rules(text, event_time=T)


# Adversarial inputs at the message limit: long runs of what the clause splitter and the rule patterns
# look at. Each may cost a few times a normal message of the same length, never more: no input pattern
# may make the work grow faster than the text (it was quadratic on whitespace runs: ~25 s at 20,000).
_LIMIT = 20_000
_RUN_UNITS = (" ", "\t", "\u00a0", " \n", ", ", " ,", " and", " - ", "I ", "my ", "'s ", ".", " is", " and I", "a, ")
_BUDGET_RATIO = 12  # CPU time of an adversarial message / that of a normal one of the same length


def _cpu_seconds(text: str) -> float:
    """Best of three CPU times of this thread (not wall clock, and not the process's: other processes on
    the machine and the session's other threads, the LLM stand-in's server or a driver's, do not count)."""
    best = float("inf")
    for _ in range(3):
        started = time.thread_time()
        extract_rules(text, event_time=T)
        best = min(best, time.thread_time() - started)
    return best


@functools.cache
def _normal_message_cpu() -> float:
    chat = "We talked about the game last night and my brother said it was the best one this year. "
    return max(_cpu_seconds((chat * (_LIMIT // len(chat) + 1))[:_LIMIT]), 1e-4)


@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.generate])  # no shrinking: slow on a miss
@given(
    st.sampled_from(("I like", "My brother Alex", "I", "")),
    st.one_of(st.sampled_from(_RUN_UNITS), st.text(min_size=1, max_size=3)),
)
@example("I like", " ")
@example("My brother Alex", ", ")
def test_adversarial_message_costs_a_bounded_multiple_of_a_normal_one(prefix: str, unit: str) -> None:
    text = (prefix + unit * _LIMIT)[: _LIMIT - 1] + "x"
    with no_logged_errors():
        check_valid(extract_rules(text, event_time=T))
    ratio = _cpu_seconds(text) / _normal_message_cpu()
    assert ratio < _BUDGET_RATIO, f"{prefix!r} + {unit!r} * n costs {ratio:.1f}x a normal message"


# ----------------------------------------------------------------------------------------- trivial filter


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "ok",
        "OK!",
        "ok thanks",
        "Ok, thank you so much!!",
        "thx",
        "lol",
        "hahaha",
        "lmao 😂",
        "👍",
        "🙏🙏",
        "...",
        "?!",
        "Sounds good!",
        "sounds good, thanks",
        "Hi",
        "hello there :)",
        "Good morning!",
        "bye",
        "See you later!",
        "got it",
        "Okkk",
        "cooool",
        "yes please",
        "no worries",
        "You're welcome",
        "Have a nice day!",
    ],
)
def test_trivial(text: str) -> None:
    assert is_trivial(text) is True


@pytest.mark.parametrize(
    "text",
    [
        "thanks, I moved to Austin",
        "I live in Austin",
        "ok so my brother Alex works at Amazon",
        "no",
        "I like it",
        "42",
        "Paris",
        "ok ok ok ok ok ok ok ok ok ok",
        "hi, I'm Sam and I'm a nurse",
    ],
)
def test_not_trivial(text: str) -> None:
    assert is_trivial(text) is False


@settings(deadline=None)  # no per-example time limit: tests never assert wall-clock times
@given(st.text(max_size=200))
def test_trivial_never_raises(text: str) -> None:
    assert isinstance(is_trivial(text), bool)
