"""Property tests: random interleavings of remember/update/flag/forget/search against a model."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracemem.memory import FLAGGED_STATES, Memory
from tracemem.memory.text import terms

NOW = datetime(2025, 6, 1, 12, 0)
SUBJECTS = ["alice", "bob", "carol"]
WORDS = ["tea", "coffee", "berlin", "paris", "cat", "dog", "chess", "piano", "hiking", "paint"]
STATES = ["fresh", "reviewed", "stale", "contradicted"]

text_st = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(lambda ws: "user likes " + " ".join(ws))
window_st = st.sampled_from([(None, None), (-2, None), (1, None), (None, -1), (None, 1), (-3, -1), (-1, 2), (0, 1)])
remember_st = st.tuples(st.just("remember"), st.sampled_from(SUBJECTS), text_st,
                        st.sampled_from([0, 30, 59, 59.99, 60, 61, 80, 100]), window_st, st.sampled_from(STATES))
flag_st = st.tuples(st.just("flag"), st.integers(0, 50), st.sampled_from(STATES))
forget_st = st.tuples(st.just("forget"), st.integers(0, 50))
update_st = st.tuples(st.just("update"), st.integers(0, 50), text_st, st.sampled_from([40, 70]))
search_st = st.tuples(st.just("search"), st.sampled_from(SUBJECTS), st.sampled_from(WORDS + ["likes", "zebra"]),
                      st.booleans(), st.booleans(), st.sampled_from([None, 1, 3]))
ops_st = st.lists(st.one_of(remember_st, flag_st, forget_st, update_st, search_st), min_size=1, max_size=35)

PROP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _at(days: int | None) -> datetime | None:
    return None if days is None else NOW + timedelta(days=days)


def _excluded_reason(rec: dict) -> str | None:
    if rec["review_state"] in FLAGGED_STATES:
        return "flagged"
    if rec["confidence"] < 60:
        return "below_floor"
    vf, vu = rec["valid_from"], rec["valid_until"]
    if (vf is not None and vf > NOW) or (vu is not None and vu <= NOW):
        return "out_of_window"
    return None


def run_ops(mem: Memory, ops: list[tuple]) -> None:
    model: dict[str, dict] = {}  # memory_id -> expected live state
    order: list[str] = []
    changes: dict[str, int] = {}
    for op in ops:
        kind = op[0]
        if kind == "remember":
            _, subject, text, conf, (f, u), state = op
            rec = mem.remember(subject, text, confidence=conf, valid_from=_at(f), valid_until=_at(u),
                               review_state=state)
            model[rec.memory_id] = dict(subject=subject, text=text, confidence=conf, valid_from=_at(f),
                                        valid_until=_at(u), review_state=state, forgotten=False)
            order.append(rec.memory_id)
            changes[rec.memory_id] = 1
        elif kind in ("flag", "forget", "update") and order:
            mid = order[op[1] % len(order)]
            m = model[mid]
            if m["forgotten"]:
                continue
            if kind == "flag":
                if m["review_state"] != op[2]:
                    changes[mid] += 1
                mem.flag(mid, op[2], "property test")
                m["review_state"] = op[2]
            elif kind == "forget":
                mem.forget(mid)
                m["forgotten"] = True
                changes[mid] += 1
            else:
                if (m["text"], m["confidence"]) != (op[2], op[3]):
                    changes[mid] += 1
                mem.update(mid, text=op[2], confidence=op[3])
                m["text"], m["confidence"] = op[2], op[3]
        elif kind == "search":
            _, subject, word, semantic, recall, limit = op
            res = mem.search(subject, word, semantic=semantic, recall=recall, limit=limit, now=NOW)
            live = {mid: m for mid, m in model.items() if m["subject"] == subject and not m["forgotten"]}
            # never another subject's record, never a forgotten one
            assert all(r.subject == subject and r.memory_id in live for r in res.records)
            assert res.mode == ("semantic" if semantic else "literal")
            assert res.index_unavailable_reason is None
            if not semantic:  # the literal path is exactly "shares a content term"
                qt = set(terms(word))
                matching = {mid for mid, m in live.items() if qt & set(terms(m["text"]))}
                assert res.total_before_filter == len(matching)
                assert {r.memory_id for r in res.records} <= matching
            if recall:
                for r in res.records:
                    assert _excluded_reason(model[r.memory_id]) is None
                for e in res.excluded:
                    assert _excluded_reason(model[e.memory_id]) == e.reason
                assert len(res.excluded) == res.excluded_total
            else:
                assert res.excluded_total == 0 and not res.excluded
            if res.cut_by_limit == 0:
                assert len(res.records) + res.excluded_total == res.total_before_filter
            else:
                assert limit is not None and len(res.records) == limit
    # history records every change, in order, and nothing else
    for mid, n in changes.items():
        hist = mem.history(mid)
        assert len(hist) == n, (mid, [e.event for e in hist])
        assert hist[0].event == "remember"
        assert [e.event_id for e in hist] == sorted(e.event_id for e in hist)
    # the index agrees with a rebuild from DuckDB
    for subject in SUBJECTS:
        a = mem.search(subject, "user likes", limit=None, recall=True, now=NOW)
        mem.rebuild_index()
        b = mem.search(subject, "user likes", limit=None, recall=True, now=NOW)
        assert {r.memory_id for r in a.records} == {r.memory_id for r in b.records}
        assert (a.total_before_filter, a.excluded_total) == (b.total_before_filter, b.excluded_total)


@PROP
@given(ops_st)
def test_random_interleavings_keep_every_rule(ops: list[tuple]) -> None:
    run_ops(Memory(duckdb.connect(":memory:"), clock=lambda: NOW), ops)


@PROP
@given(st.lists(remember_st, min_size=1, max_size=10), st.sampled_from(WORDS), st.booleans())
def test_literal_fallback_always_states_its_reason(items: list[tuple], word: str, recall: bool) -> None:
    mem = Memory(duckdb.connect(":memory:"), embedder=None, clock=lambda: NOW)
    for _, subject, text, conf, (f, u), state in items:
        mem.remember(subject, text, confidence=conf, valid_from=_at(f), valid_until=_at(u), review_state=state)
    for subject in SUBJECTS:
        res = mem.search(subject, word, recall=recall, now=NOW)
        assert res.mode == "literal" and res.degraded
        assert res.index_unavailable_reason == "no embedder configured"
        assert "semantic search unavailable" in res.receipt()
        asked_literal = mem.search(subject, word, semantic=False, recall=recall, now=NOW)
        assert asked_literal.index_unavailable_reason is None and not asked_literal.degraded
        assert [r.memory_id for r in asked_literal.records] == [r.memory_id for r in res.records]


@pytest.mark.parametrize("seed_ops", [[("remember", "alice", "user likes tea", 80, (None, None), "fresh"),
                                       ("search", "bob", "tea", True, True, None)]])
def test_example_interleaving(seed_ops: list[tuple]) -> None:
    run_ops(Memory(duckdb.connect(":memory:"), clock=lambda: NOW), seed_ops)
