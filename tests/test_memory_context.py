"""Conversation context in ranking (memory/context.py) and the default embedder (memory/default.py)."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from tracemem.memory import HashingEmbedder, Memory
from tracemem.memory.context import neighbour_lift
from tracemem.memory.default import LazyMiniLM, default_embedder, minilm_installed


def test_lift_takes_the_better_live_neighbour_and_never_lowers() -> None:
    scores = np.array([0.9, 0.1, -0.5, 0.2, 0.0])
    alive = np.array([True, True, True, False, True])
    lift = neighbour_lift(scores, alive, np.array([0, 1, 2, 4]), 0.5)
    # row 1: max(0.9, -0.5); row 2: max(0.1, row 4 (row 3 is dead)); row 0: its only neighbour; row 4: row 2 < 0
    assert lift.tolist() == pytest.approx([0.05, 0.45, 0.05, 0.0])
    assert not neighbour_lift(scores, alive, np.array([0, 1]), 0.0).any()


def conversation(context_weight: float) -> tuple[Memory, list[str]]:
    mem = Memory(duckdb.connect(":memory:"), embedder=HashingEmbedder(), context_weight=context_weight)
    texts = ["Dana: the bakery on the corner closed", "Sam: how many years have you been married, Dana?",
             "Dana: 5 years already! time flies", "Sam: many years ago my cousin studied there",
             "Dana: so many years of surfing"]
    return mem, [r.memory_id for r in mem.remember_many({"subject": "dana", "text": t} for t in texts)]


def test_an_answer_rises_with_the_question_before_it() -> None:
    query = "how many years has Dana been married"
    flat, ids = conversation(0.0)
    lifted, lids = conversation(0.5)
    before, after = flat.search("dana", query), lifted.search("dana", query)
    assert [r.memory_id for r in after.records][:2] == [lids[1], lids[2]]  # the question, then its answer
    assert [r.memory_id for r in before.records].index(ids[2]) == 3  # without context: behind both distractors
    # context only re-orders the records that match: the same matches, counted the same
    assert before.total_before_filter == after.total_before_filter
    assert {r.text for r in before.records} == {r.text for r in after.records}


def test_a_flagged_record_is_still_never_injected() -> None:
    mem, ids = conversation(0.5)
    mem.flag(ids[1], "stale", "asked long ago")  # a change moves the record to the end: it no longer lifts the answer
    res = mem.search("dana", "how many years has Dana been married", recall=True)
    assert ids[1] not in [r.memory_id for r in res.records] and res.excluded_flagged == 1
    assert len(res.records) + res.excluded_total == res.total_before_filter


def test_context_survives_reopening_and_rebuilding() -> None:
    mem, ids = conversation(0.5)
    mem.update(ids[4], confidence=90)  # a change moves the record to the end, in the index and on rebuild
    before = [r.memory_id for r in mem.search("dana", "married years", limit=None).records]
    mem.rebuild_index()
    assert [r.memory_id for r in mem.search("dana", "married years", limit=None).records] == before


def test_default_embedder_follows_the_store() -> None:
    assert isinstance(default_embedder(HashingEmbedder().embedder_id), HashingEmbedder)
    assert isinstance(default_embedder(LazyMiniLM.embedder_id), LazyMiniLM)  # loads only when it embeds
    fresh = default_embedder(None)
    assert isinstance(fresh, LazyMiniLM if minilm_installed() else HashingEmbedder)
    con = duckdb.connect(":memory:")
    Memory(con, embedder=HashingEmbedder()).remember("u", "bound to hashing")
    assert isinstance(Memory(con).embedder, HashingEmbedder)  # an existing store keeps its embedder
