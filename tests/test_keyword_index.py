"""The in-memory keyword index a snapshot answers keyword search with (``engram_api.storage.snapshot.keywords``):
its analysis, BM25's ordering, the tie-break, the filter, and that an index grown by ``added`` answers
exactly as one built whole. Its agreement with the stores' full-text indexes is the contract suite's
(tests/contract/test_snapshot_keywords.py)."""

from __future__ import annotations

import math
import random
import threading
from concurrent.futures import ThreadPoolExecutor

from engram_api.storage.snapshot.keywords import KeywordIndex, KeywordTable, _stemmer, stems
from engram_api.storage.snapshot.removal import table_without, without_holes


def _all(_: str) -> bool:
    return True


def test_stems_are_the_query_words_porter_stemmed_as_the_stores_analyzers_do() -> None:
    assert stems("Caroline's paintings of sunsets; running the LGBTQ support groups in 2023!") == [
        "carolin", "paint", "sunset", "run", "lgbtq", "support", "group", "2023",
    ]  # fmt: skip
    assert stems("the and of a") == []  # stop words only
    assert stems("Paris") == stems("paris")


def test_a_document_is_found_by_any_form_of_a_word_it_holds_and_only_then() -> None:
    table = KeywordTable.of([("d1", "We were painting the fence"), ("d2", "Nothing to see"), ("d3", "Paints")])
    assert [i for i, _ in table.ranked(stems("painted"), 10, _all)] == ["d3", "d1"]  # shorter document first
    assert table.ranked(stems("sculpture"), 10, _all) == []
    assert table.ranked([], 10, _all) == []
    assert KeywordTable.of([]).ranked(stems("paint"), 10, _all) == []


def test_bm25_orders_by_rarity_frequency_and_length_with_lucenes_idf() -> None:
    docs = [
        ("common-1", "dog walk"),
        ("common-2", "dog park"),
        ("common-3", "dog food"),
        ("common-4", "dog bowl"),
        ("rare", "zebra walk"),
        ("twice", "zebra zebra walk"),
        ("long", "zebra " + " ".join(f"filler{i}" for i in range(20))),
    ]
    table = KeywordTable.of(docs)
    ranked = table.ranked(stems("zebra dog"), 10, _all)
    order = [i for i, _ in ranked]
    assert order[:2] == ["twice", "rare"]  # a rarer word outweighs a common one; more of it counts more
    assert order.index("long") > order.index("rare")  # the same word in a longer document counts less
    assert set(order) == {i for i, _ in docs}
    # The score itself: Lucene's IDF, k1 1.2, b 0.75, over this table's own statistics.
    n, avg = len(docs), sum(len(stems(t)) for _, t in docs) / len(docs)
    idf = math.log(1 + (n - 3 + 0.5) / (3 + 0.5))
    want = idf * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 2 / avg))
    assert math.isclose(dict(ranked)["rare"], want)


def test_ties_go_by_node_id_and_the_filter_refuses_before_k_is_counted() -> None:
    docs = [(f"d{i:03d}", "same words here") for i in range(300)]
    random.Random(3).shuffle(docs)
    table = KeywordTable.of(docs)
    assert [i for i, _ in table.ranked(stems("words"), 5, _all)] == ["d000", "d001", "d002", "d003", "d004"]
    odd = table.ranked(stems("words"), 5, lambda i: int(i[1:]) % 2 == 1)
    assert [i for i, _ in odd] == ["d001", "d003", "d005", "d007", "d009"]
    late = table.ranked(stems("words"), 3, lambda i: int(i[1:]) >= 290)  # past the first 4k ordered
    assert [i for i, _ in late] == ["d290", "d291", "d292"]
    assert table.ranked(stems("words"), 5, lambda i: False) == []


def test_an_index_grown_by_added_answers_exactly_as_one_built_whole() -> None:
    rng = random.Random(11)
    vocab = [f"word{i}" for i in range(60)] + ["user", "likes"]

    def text() -> str:
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 12)))

    chunks = [(f"c{i}", text()) for i in range(200)]
    facts = [(f"f{i}", "User likes " + text()) for i in range(300)]
    grown = KeywordIndex.of(chunks[:50], facts[:100])
    for lo in range(50, 200, 50):
        grown = grown.added(chunks[lo : lo + 50], facts[2 * lo : 2 * lo + 100])
    whole = KeywordIndex.of(reversed(chunks), reversed(facts))  # another order of positions
    for table in (grown.chunks, grown.facts):  # ids merged in as they grew longer ("c49", then "c100")
        held = [i.decode() for i in table.sorted_ids.tolist()]
        assert [table.ids[p] for p in table.by_id] == sorted(table.ids) == held
    for _ in range(50):
        query = [rng.choice(vocab) for _ in range(rng.randint(1, 4))]
        keep = rng.choice([_all, lambda i: i.endswith(("1", "4", "7"))])
        got = grown.search(query, 10, chunk_ok=keep, fact_ok=keep)
        assert got == whole.search(query, 10, chunk_ok=keep, fact_ok=keep)
        assert len([h for h in got if h.kind == "fact"]) <= 10 and len(got) <= 20
        assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)


def _reference(docs: list[tuple[str, str]], query: list[str], k: int, keep: object) -> list[tuple[str, float]]:
    """BM25 as ``keywords`` states it, one document at a time, the rare terms' shares summed first."""
    terms = {i: stems(t) for i, t in docs}
    n, avg = len(docs), sum(len(t) for t in terms.values()) / len(docs)
    df = {w: sum(w in t for t in terms.values()) for w in dict.fromkeys(query)}
    held = [w for w in df if df[w]]
    order = [w for w in held if 4 * df[w] < n] + [w for w in held if 4 * df[w] >= n]
    scored = []
    for i, t in terms.items():
        score, hit = 0.0, False
        for w in order:
            if w in t:
                tf, hit = float(t.count(w)), True
                idf = math.log(1.0 + (n - df[w] + 0.5) / (df[w] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (1.0 - 0.75 + 0.75 * len(t) / avg))
        if hit and keep(i):  # type: ignore[operator]
            scored.append((i, score))
    return sorted(scored, key=lambda d: (-d[1], d[0]))[:k]


def test_words_in_most_documents_rank_as_bm25_whether_or_not_the_rarer_words_settle_the_top() -> None:
    """A word in a quarter of the documents or more is first added only to the documents a rarer word
    found (``ranked``'s shortcut); the answers are BM25's all the same, shortcut taken or not."""
    rng = random.Random(5)
    rare = [f"topic{i}" for i in range(40)]
    docs = []
    for i in range(1_500):
        words = ["user"] * (rng.random() < 0.8) + ["likes"] * (rng.random() < 0.4) + ["weekend"] * (i % 50 == 0)
        words += rng.sample(rare, rng.randint(0, 3)) + ["filler"] * rng.randint(0, 6)
        rng.shuffle(words)
        docs.append((f"f{i:04d}", " ".join(words)))
    table = KeywordTable.of(docs)
    queries = [["user"], ["user", "topic3"], ["topic7", "user", "likes"], ["user", "weekend"], ["likes", "weekend"]]
    queries += [["user", "likes", *rng.sample(rare, rng.randint(1, 3))] for _ in range(25)]
    for words in queries:
        query = stems(" ".join(words))
        for k in (1, 5, 30, 400):
            for keep in (_all, lambda i: i.endswith(("1", "4", "7")), lambda i: int(i[1:]) > 1_400):
                assert table.ranked(query, k, keep) == _reference(docs, query, k, keep), (words, k)


def test_ids_beyond_ascii_break_ties_in_the_order_of_their_characters() -> None:
    """The sorted ids are held as UTF-8 bytes: their order is that of the strings' code points."""
    ids = ["z", "\u00e9t\u00e9", "e", "\u00df", "\U0001f600", "E", "\u00e9"]
    table = KeywordTable.of((i, "same words") for i in ids[:3]).added((i, "same words") for i in ids[3:])
    assert [i for i, _ in table.ranked(stems("same words"), 10, _all)] == sorted(ids)


def test_threads_stem_alike_each_with_its_own_stemmer() -> None:
    """The reader's threads search while another builds a snapshot's index: each thread stems with its own
    PyStemmer object (one is not to be shared), and all of them agree."""
    texts = [f"running {i} painted libraries counselling agencies {i % 7} horses" for i in range(400)]
    want = [stems(t) for t in texts]
    together = threading.Barrier(3)

    def own(_: int) -> int:
        together.wait(timeout=10)  # three threads at once: three stemmers
        return id(_stemmer())

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert list(pool.map(stems, texts)) == want
        assert len(set(pool.map(own, range(3)))) == 3


def test_a_score_shared_by_thousands_at_the_cut_still_ranks_them_by_id() -> None:
    """A common word alone scores a document by its length only, so thousands share the k-th best score:
    only the lowest ids of those are ordered first (``KeywordTable._best``), and the answers stay BM25's by
    (score, id) whatever ``keep`` refuses, in one table and across a base and the documents added since."""
    rng = random.Random(8)
    docs = []
    for i in range(3_000):
        words = ["user"] * (rng.random() < 0.85) + ["likes"] * (rng.random() < 0.3) + ["rare"] * (i % 97 == 0)
        words += ["filler"] * rng.choice([0, 0, 0, 1, 1, 2])  # three lengths: ties by the thousand
        docs.append((f"f{rng.randrange(10**6):06d}-{i}", " ".join(words) or "nothing"))
    table = KeywordTable.of(docs)
    grown = KeywordIndex.of((), docs[:2_000]).added((), docs[2_000:])
    whole = KeywordIndex.of((), docs)
    keeps = (_all, lambda i: i.endswith(("1", "4", "7")), lambda i: i < "f3", lambda i: i.endswith("-2999"))
    for words in (["user"], ["likes"], ["user", "likes"], ["user", "rare"], ["user", "likes", "rare"]):
        query = stems(" ".join(words))
        for k in (1, 7, 40, 600):
            for keep in keeps:
                want = _reference(docs, query, k, keep)
                assert table.ranked(query, k, keep) == want, (words, k)
                got = grown.search(query, k, chunk_ok=keep, fact_ok=keep)
                assert got == whole.search(query, k, chunk_ok=keep, fact_ok=keep)
                assert [(h.node_id, h.score) for h in got] == want, (words, k)


def test_forms_and_dense_lookups_answer_as_bm25_through_holes_additions_and_the_fold() -> None:
    """A search gathers BM25's share of a term from its (frequency, length) forms and looks a common word up
    in the table's ``dense`` forms for the documents a rarer word found: the answers (ids, order, the scores
    to the bit) are BM25's over the documents held, in a base of more than ``_DENSE_MIN`` documents with
    holes, with documents added since, and once folded."""
    rng = random.Random(42)
    rare = [f"topic{i}" for i in range(30)]
    docs = []
    for i in range(2_400):
        words = ["user"] * (rng.random() < 0.8) + ["likes"] * (rng.random() < 0.3) + rng.sample(rare, rng.randint(0, 2))
        words += ["user"] * (rng.random() < 0.1) + ["filler"] * rng.randint(0, 4)  # a frequency of 2 now and then
        docs.append((f"f{i:04d}", " ".join(words) or "nothing"))
    texts = dict(docs)
    base = KeywordIndex.of((), docs[:2_000])
    assert "user" in base.facts.dense and "topic1" not in base.facts.dense
    gone = [d for d, _ in rng.sample(docs[:2_000], 40)]
    holed = KeywordIndex(chunks=base.chunks, facts=table_without(base.facts, {d: texts[d] for d in gone}))
    index = holed.added((), docs[2_000:])
    left = [d for d in docs if d[0] not in gone]
    folded = without_holes(index.merged())
    assert folded.facts.dense.keys() == KeywordTable.of(left).dense.keys() == {"user", "like", "filler"}
    grown = KeywordIndex.of((), docs[:2_000]).facts.joined(KeywordTable.of(docs[2_000:]))  # no holes: no compaction
    assert grown.dense.keys() == KeywordTable.of(docs).dense.keys()
    queries = [["user"], ["likes"], ["user", "topic3"], ["topic7", "user", "likes"], ["user", "likes", "topic1"]]
    queries += [["user", *rng.sample(rare, rng.randint(1, 3))] for _ in range(15)]
    for words in queries:
        query = stems(" ".join(words))
        for k in (1, 10, 40):
            for keep in (_all, lambda i: i.endswith(("1", "4", "7"))):
                want = _reference(left, query, k, keep)
                for got in (index, folded):
                    hits = got.search(words, k, chunk_ok=keep, fact_ok=keep)
                    assert [(h.node_id, h.score) for h in hits] == want, (words, k)
