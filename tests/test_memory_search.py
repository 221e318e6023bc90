"""Honest search: modes and fallbacks, the recall contract, subject isolation, ranking."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import duckdb
import numpy as np
import pytest

from tracemem.memory import (HASHING_CAVEAT, HashingEmbedder, Memory, MemoryInputError, ScoredRecord,
                             SearchResult)

NOW = datetime(2025, 6, 1, 12, 0)


@pytest.fixture
def mem() -> Memory:
    return Memory(duckdb.connect(":memory:"), clock=lambda: NOW)


class FailingEmbedder(HashingEmbedder):
    """Embeds stored texts, fails on queries: an index error at search time."""

    def embed(self, texts):  # noqa: ANN001
        if any("explode" in t for t in texts):
            raise RuntimeError("model server down")
        return super().embed(texts)


# -- modes and fallbacks --------------------------------------------------------------------
def test_hashing_search_reports_its_caveat() -> None:
    mem = Memory(duckdb.connect(":memory:"), embedder=HashingEmbedder())
    mem.remember("u", "User is vegetarian")
    res = mem.search("u", "is the user a vegetarian?")
    assert isinstance(res, SearchResult) and isinstance(res.records[0], ScoredRecord)
    assert (res.mode, res.requested_semantic, res.index_unavailable_reason) == ("semantic", True, None)
    assert res.caveat == HASHING_CAVEAT and res.embedder_id == mem.embedder.embedder_id
    assert res.records[0].similarity is not None and res.records[0].score > 0


def test_literal_on_request_has_no_reason_and_no_caveat(mem: Memory) -> None:
    mem.remember("u", "User is vegetarian")
    res = mem.search("u", "vegetarian", semantic=False)
    assert (res.mode, res.requested_semantic, res.index_unavailable_reason, res.caveat) == ("literal", False, None, None)
    assert res.records[0].similarity is None and not res.degraded


def test_no_embedder_falls_back_and_says_so() -> None:
    mem = Memory(duckdb.connect(":memory:"), embedder=None)
    mem.remember("u", "User is vegetarian")
    res = mem.search("u", "vegetarian")
    assert res.mode == "literal" and res.degraded
    assert res.index_unavailable_reason == "no embedder configured"
    assert [r.text for r in res.records] == ["User is vegetarian"]
    assert "semantic search unavailable: no embedder configured" in res.receipt()


def test_index_error_falls_back_and_says_so() -> None:
    mem = Memory(duckdb.connect(":memory:"), embedder=FailingEmbedder())
    mem.remember("u", "boom box collection")  # stored fine; only the query fails below
    mem.remember("u", "User collects vinyl")
    res = mem.search("u", "boom vinyl explode")
    assert res.mode == "literal"
    assert res.index_unavailable_reason.startswith("index error:") and "model server down" in res.index_unavailable_reason
    assert len(res.records) == 2


def test_no_record_indexed_falls_back() -> None:
    mem = Memory(duckdb.connect(":memory:"), embedder=HashingEmbedder())
    mem.remember("u", "the of and")  # stopwords only: a zero hashing vector, nothing indexable
    res = mem.search("u", "and then")
    assert res.mode == "literal" and "indexed" in res.index_unavailable_reason


def test_no_match_is_distinguishable_from_unavailable(mem: Memory) -> None:
    mem.remember("u", "User plays chess")
    empty = mem.search("u", "kayak")
    assert empty.no_match and not empty.degraded and empty.mode == "semantic" and empty.records == []
    nobody = mem.search("nobody", "chess")
    assert nobody.no_match and nobody.index_unavailable_reason is None
    assert "no match" in empty.receipt()


def test_bad_search_arguments(mem: Memory) -> None:
    with pytest.raises(MemoryInputError, match="query is empty"):
        mem.search("u", "  ")
    with pytest.raises(MemoryInputError, match="limit"):
        mem.search("u", "x", limit=0)
    with pytest.raises(MemoryInputError, match="subject"):
        mem.search("", "x")


# -- the recall contract -------------------------------------------------------------------
def seed(mem: Memory) -> dict[str, str]:
    day = timedelta(days=1)
    ids = {
        "ok": mem.remember("u", "User likes green tea", confidence=90).memory_id,
        "floor": mem.remember("u", "User likes black tea", confidence=60).memory_id,
        "low": mem.remember("u", "User likes iced tea", confidence=59.9).memory_id,
        "stale": mem.remember("u", "User likes mint tea", confidence=95, review_state="stale").memory_id,
        "contra": mem.remember("u", "User hates tea", confidence=95).memory_id,
        "future": mem.remember("u", "User will like oolong tea", confidence=90, valid_from=NOW + day).memory_id,
        "expired": mem.remember("u", "User liked chai tea", confidence=90, valid_until=NOW).memory_id,
        "started": mem.remember("u", "User likes herbal tea", confidence=90, valid_from=NOW).memory_id,
        "other": mem.remember("v", "User likes tea", confidence=100).memory_id,
    }
    mem.supersede(ids["contra"], ids["ok"], reason="says green tea now")
    return ids


def test_recall_excludes_and_counts(mem: Memory) -> None:
    ids = seed(mem)
    res = mem.search("u", "tea", recall=True, limit=None)
    got = {r.memory_id for r in res.records}
    assert got == {ids["ok"], ids["floor"], ids["started"]}  # floor is inclusive, valid_from is inclusive
    assert (res.excluded_flagged, res.excluded_below_floor, res.excluded_out_of_window) == (2, 1, 2)
    assert res.total_before_filter == 8 and len(res.records) + res.excluded_total == res.total_before_filter
    assert res.recall_filtered and res.recall_floor == 60
    reasons = {e.memory_id: e.reason for e in res.excluded}
    assert reasons == {ids["stale"]: "flagged", ids["contra"]: "flagged", ids["low"]: "below_floor",
                       ids["future"]: "out_of_window", ids["expired"]: "out_of_window"}
    text = res.receipt()
    assert "excluded 2 flagged, 1 below floor, 2 out of window" in text and "floor 60" in text
    assert json.loads(json.dumps(res.to_dict()))["excluded_flagged"] == 2


def test_plain_search_returns_flagged_but_never_forgotten(mem: Memory) -> None:
    ids = seed(mem)
    mem.forget(ids["floor"])
    res = mem.search("u", "tea", limit=None)
    got = {r.memory_id for r in res.records}
    assert ids["stale"] in got and ids["low"] in got and ids["floor"] not in got
    assert not res.recall_filtered and res.excluded_total == 0 and res.recall_floor is None


def test_now_moves_the_window(mem: Memory) -> None:
    ids = seed(mem)
    later = mem.search("u", "oolong", recall=True, now=NOW + timedelta(days=2))
    assert [r.memory_id for r in later.records] == [ids["future"]]
    aware = NOW.replace(tzinfo=timezone.utc) + timedelta(days=2)
    assert [r.memory_id for r in mem.search("u", "oolong", recall=True, now=aware).records] == [ids["future"]]


def test_filters_apply_before_the_top_k_cut(mem: Memory) -> None:
    for i in range(30):  # strong matches, all flagged
        mem.remember("u", f"kayak kayak kayak trip {i}", confidence=99, review_state="contradicted")
    weak = mem.remember("u", "User once mentioned a kayak among many other unrelated words", confidence=80)
    res = mem.search("u", "kayak", recall=True, limit=5)
    assert [r.memory_id for r in res.records] == [weak.memory_id]
    assert res.excluded_flagged == 30


def test_limit_cut_is_reported(mem: Memory) -> None:
    for i in range(12):
        mem.remember("u", f"note about cats number {i}", confidence=80)
    res = mem.search("u", "cats", recall=True, limit=5)
    assert len(res.records) == 5 and res.cut_by_limit == 7 and res.total_before_filter == 12
    assert "7 beyond the limit" in res.receipt()


def test_custom_floor(mem: Memory) -> None:
    strict = Memory(mem.con, mem.lock, floor=85)
    seed(strict)
    res = strict.search("u", "tea", recall=True, limit=None)
    assert res.recall_floor == 85 and {r.confidence for r in res.records} == {90}
    with pytest.raises(MemoryInputError, match="floor"):
        Memory(mem.con, floor=120)


# -- subjects never leak --------------------------------------------------------------------
def test_subject_isolation(mem: Memory) -> None:
    mem.remember("alice", "Password hint: the name of my cat", confidence=100)
    mem.remember("bob", "Bob likes dogs", confidence=100)
    for semantic in (True, False):
        for recall in (True, False):
            res = mem.search("bob", "password hint cat", semantic=semantic, recall=recall, limit=None)
            assert all(r.subject == "bob" for r in res.records)
            assert "alice" not in json.dumps(res.to_dict())


# -- ranking --------------------------------------------------------------------------------
def test_ranking_prefers_rare_words_and_sorts(mem: Memory) -> None:
    mem.remember("u", "User went to the store and the park")
    target = mem.remember("u", "User went to a pottery class")
    mem.remember("u", "User went to work")
    res = mem.search("u", "when did the user go to pottery?")
    assert res.records[0].memory_id == target.memory_id
    scores = [r.score for r in res.records]
    assert scores == sorted(scores, reverse=True)


def test_stemming_and_case_fold(mem: Memory) -> None:
    rec = mem.remember("u", "Melanie: I painted a SUNRISE last year")
    for q in ("paintings of sunrises", "Who paints?", "sunrise"):
        assert mem.search("u", q, semantic=False).records[0].memory_id == rec.memory_id


def test_char_ngrams_give_fuzzy_semantic_matches(mem: Memory) -> None:
    rec = mem.remember("u", "User owns a motorbike")
    assert mem.search("u", "motorbikes", semantic=False).records  # stemming
    res = mem.search("u", "motorbiking")  # no shared term, shared word pieces
    assert [r.memory_id for r in res.records] == [rec.memory_id] and res.records[0].lexical_score == 0


def test_feedback_only_reorders_candidates(mem: Memory) -> None:
    for i in range(10):
        mem.remember("u", f"hiking trip number {i} with boots and maps")
    loner = mem.remember("u", "boots maps")  # shares feedback terms, not the query
    res = mem.search("u", "hiking", semantic=False, limit=None)
    assert loner.memory_id not in {r.memory_id for r in res.records} and res.total_before_filter == 10


def test_scores_are_finite_and_vectors_normalized(mem: Memory) -> None:
    for t in ("a b c", "x", "long " * 200):
        mem.remember("u", t + " text")
    res = mem.search("u", "text long", limit=None)
    assert all(np.isfinite(r.score) for r in res.records)


# -- the conversation's stretch (memory/context.py window_lift) ------------------------------------
def _stretch_memory(window: int) -> tuple[Memory, list[str]]:
    """A strong match, a weaker one two records after it, many unrelated records, then a weaker one alone."""
    mem = Memory(duckdb.connect(":memory:"), embedder=None, clock=lambda: NOW, context_window=window)
    texts = ["we talked about sailing boats and the harbour", "filler one", "the harbour festival one",
             *[f"unrelated chatter number {i}" for i in range(30)], "the harbour festival two"]
    recs = mem.remember_many({"subject": "c", "text": t} for t in texts)
    return mem, [r.memory_id for r in recs]


def test_a_match_in_a_stretch_that_matches_well_outranks_an_equal_one_alone() -> None:
    near, far = 2, 33  # "the harbour festival one" / "two": the same score but for the stretch around them
    mem, ids = _stretch_memory(5)
    ranked = [r.memory_id for r in mem.search("c", "sailing harbour festival", semantic=False, limit=None).records]
    assert ranked.index(ids[near]) < ranked.index(ids[far])
    mem, ids = _stretch_memory(0)  # off: the tie goes to the newer record, as before
    ranked = [r.memory_id for r in mem.search("c", "sailing harbour festival", semantic=False, limit=None).records]
    assert ranked.index(ids[far]) < ranked.index(ids[near])


def test_a_flagged_record_lifts_nothing_around_it() -> None:
    mem, ids = _stretch_memory(5)
    mem.flag(ids[0], "contradicted", "a later turn said otherwise")
    result = mem.search("c", "sailing harbour festival", semantic=False, limit=None, recall=True)
    ranked = [r.memory_id for r in result.records]
    assert ids[0] not in ranked and ranked.index(ids[33]) < ranked.index(ids[2])


@pytest.mark.parametrize("bad", [-1, 2.5, "5", True])
def test_a_bad_context_window_says_what_it_takes(bad: object) -> None:
    with pytest.raises(MemoryInputError, match="context_window"):
        Memory(duckdb.connect(":memory:"), context_window=bad)  # type: ignore[arg-type]
