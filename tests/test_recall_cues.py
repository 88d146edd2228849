"""Query cues (speaker, when, the period a query names) and score normalization: the pure parts of recall's ranking (``reader.cues``,
``reader.scoring.normalized`` and ``by_rank``); the contract suite checks them on real stores."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import engram_api.reader.cues as cues
from engram_api.reader.cues import Period, QueryCues
from engram_api.reader.scoring import by_rank, normalized
from engram_api.storage.snapshot.keywords import TextTerms

SENT = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("query", "speaker", "named"),
    [
        ("When did Melanie sign up for a pottery class?", "Melanie", True),
        ("What is Caroline's identity?", "Caroline", True),
        ("what did melanie paint", "Melanie Smith", True),
        ("When did Melanie sign up?", "Caroline", False),
        ("what company does my brother work for?", "user", False),
        ("what did the user say?", "user", False),
        ("anything", None, False),
    ],
)
def test_a_query_names_a_speaker_by_a_word_of_the_name(query: str, speaker: str | None, named: bool) -> None:
    assert QueryCues.of(query).names(speaker) is named


@pytest.mark.parametrize(
    ("query", "asks"),
    [
        ("When did Caroline go to the LGBTQ support group?", True),
        ("  when is the party", True),
        ("What year did Melanie start painting?", True),
        ("On which day did they meet?", True),
        ("What did Caroline research?", False),
        ("Whenever I cook, what do I like?", False),
    ],
)
def test_a_query_asks_when(query: str, asks: bool) -> None:
    assert QueryCues.of(query).asks_when is asks


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("I just signed up for a pottery class yesterday.", True),
        ("Last Friday I finally took the kids to a workshop.", True),
        ("We went there in May 2022.", True),
        ("I love pottery, it is so calming.", False),
    ],
)
def test_a_turn_says_when(text: str, says: bool) -> None:
    assert QueryCues.of("When did it happen?").answers_when(text, SENT) is says
    assert QueryCues.of("What happened?").answers_when(text, SENT) is False  # not asked


@pytest.mark.parametrize(
    ("query", "period"),
    [
        ("When did Melanie go camping in June?", Period(year=None, month=6)),
        ("What did Mel and her kids paint in July 2023?", Period(year=2023, month=7)),
        ("What painting did Melanie show to Caroline on October 13, 2023?", Period(year=2023, month=10, day=13)),
        ("what did she do on the 13th of October 2023", Period(year=2023, month=10, day=13)),
        ("How many times has Melanie gone to the beach in 2023?", Period(year=2023)),
        ("Who did Maria have dinner with in May?", Period(year=None, month=5)),
        ("May I ask what she likes?", None),  # the verb, not the month
        ("When did Caroline go to the support group?", None),
    ],
)
def test_a_query_names_a_period_to_its_own_precision(query: str, period: Period | None) -> None:
    assert QueryCues.of(query).period == period


@pytest.mark.parametrize(
    ("query", "text", "said", "inside"),
    [
        ("camping in June?", "We went camping.", datetime(2023, 6, 27, tzinfo=UTC), True),  # said in it
        ("camping in June?", "We went camping.", datetime(2022, 6, 2, tzinfo=UTC), True),  # June of any year
        ("camping in June?", "We went camping last week.", datetime(2023, 7, 3, tzinfo=UTC), True),  # resolved
        ("camping in June?", "We went camping yesterday.", datetime(2023, 7, 3, tzinfo=UTC), False),  # July 2
        ("camping in June?", "We went camping.", datetime(2023, 7, 3, tzinfo=UTC), False),
        ("camping in June 2022?", "We went camping.", datetime(2023, 6, 27, tzinfo=UTC), False),  # another year
        ("on May 3, 2023?", "I had dinner with mom yesterday.", datetime(2023, 5, 4, tzinfo=UTC), True),
        ("on May 3, 2023?", "I had dinner with mom.", datetime(2023, 5, 4, tzinfo=UTC), False),
        ("camping?", "We went camping.", datetime(2023, 6, 27, tzinfo=UTC), False),  # no period named
    ],
)
def test_a_turn_is_in_the_period_by_when_it_was_said_or_what_its_words_resolve_to(
    query: str, text: str, said: datetime, inside: bool
) -> None:
    assert QueryCues.of(query).in_period(text, said) is inside


def test_a_turns_dates_are_read_once_in_the_users_memo_and_answer_as_unkept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recall reads ~75 turns a query that asks when or names a period; the resolver's scan of each (~17 us) is
    made once per text and event time in the user's memo of texts, not at every recall."""
    scans: list[str] = []
    annotate = cues.annotate
    monkeypatch.setattr(cues, "annotate", lambda text, at: scans.append(text) or annotate(text, at))
    turns = [
        ("We went camping last week.", datetime(2023, 7, 3, tzinfo=UTC)),
        ("I signed up yesterday.", datetime(2023, 5, 4, tzinfo=UTC)),
        ("I love pottery.", datetime(2023, 6, 27, tzinfo=UTC)),
    ]
    queries = [QueryCues.of(q) for q in ("When did she go camping in June?", "what happened on May 3, 2023?")]
    unkept = [(q.answers_when(t, at), q.in_period(t, at)) for q in queries for t, at in turns]
    scans.clear()
    memo = TextTerms()
    for _ in range(3):  # three recalls of the two queries
        kept = [(q.answers_when(t, at, memo), q.in_period(t, at, memo)) for q in queries for t, at in turns]
        assert kept == unkept
    assert sorted(scans) == sorted(t for t, _ in turns)  # each turn scanned once, by its first recall
    later = datetime(2023, 7, 10, tzinfo=UTC)  # the same words said another day resolve anew
    assert queries[0].in_period(turns[0][0], later, memo) is False
    assert scans[-1] == turns[0][0]


def test_a_memos_other_readings_are_bounded_as_its_terms() -> None:
    memo = TextTerms(limit=4)
    for i in range(5):
        memo.read(("text", i), lambda i=i: i)
    assert memo.read(("text", 4), lambda: -1) == 4
    assert memo.read(("text", 0), lambda: -1) == -1  # the older half went when the memo was full


def test_scores_are_normalized_between_the_best_hit_and_the_floor_of_the_list() -> None:
    assert normalized([], cut=True) == []
    assert normalized([7.5], cut=True) == [1.0]
    assert normalized([2.0, 2.0], cut=False) == [1.0, 1.0]
    # A list cut at k: its worst hit is the floor. A shorter list holds every match: the floor is 0.
    assert normalized([12.0, 9.0, 3.0], cut=True) == pytest.approx([1.0, 2 / 3, 0.0])
    assert normalized([12.0, 9.0, 3.0], cut=False) == pytest.approx([1.0, 0.75, 0.25])
    assert normalized([0.61, 0.42, -0.05], cut=False) == pytest.approx([1.0, 0.47 / 0.66, 0.0])


def test_keyword_hits_share_by_rank_from_one_for_the_best_to_zero_past_the_channels_k() -> None:
    assert by_rank(0, 40) == []
    assert by_rank(3, 4) == pytest.approx([1.0, (3 / 4) ** 3, (2 / 4) ** 3])
    # A list longer than k (a caller's own cut) still ends above 0; the shares fall with the rank.
    shares = by_rank(5, 2)
    assert shares[0] == 1.0 and shares[-1] > 0 and shares == sorted(shares, reverse=True)
