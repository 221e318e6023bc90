"""Long threads and big stores: the same answers, computed cheaply.

- a thread is found by `runs.thread_id` (and walked for runs recorded before it existed);
- runs load several at a time (`store.runs_by_id`), and a backtrack through a thread reads its turns
  in windows; what it finds is what a live walk finds;
- `resume=<run id>` starts from a kept state (no replay), equal to the replayed one;
- a live thread's runs do not keep each other alive when a store holds them;
- `store.runs()` counts steps of the runs it returns only, and its cut-off never changes the answer;
- every run table is indexed on run_id (schema v6).
"""
from __future__ import annotations

import gc
import json
import weakref
from datetime import datetime, timedelta
from typing import Any

import duckdb
import pytest
from pydantic import BaseModel

from tracemem import Pipeline, TracememError, decide
from tracemem.store import Store
from tracemem.store import tables as store_schema


class Chat(BaseModel):
    user: str = ""
    messages: list[dict[str, str]] = []
    reply: str = ""
    notes: dict[str, Any] = {}
    mood: str = "calm"


def respond(s: Chat) -> None:
    history = s.messages
    s.messages.append({"role": "user", "content": s.user})
    s.reply = f"reply {len(history) // 2} to {s.user}"
    s.messages.append({"role": "assistant", "content": s.reply})
    if "note" in s.user:
        s.notes.setdefault("seen", {})[s.user] = len(history)


def route(s: Chat) -> str:
    return decide(s, [("asks", lambda x: "?" in x.user, "ask")], default="talk")


def ask(s: Chat) -> None:
    s.mood = "curious " + s.mood[:10]


def talk(s: Chat) -> None:
    s.mood = "chatty"


def boom(s: Chat) -> None:
    if "fail" in s.user:
        s.mood = "bad"
        raise RuntimeError("boom")


def trim(s: Chat) -> None:
    s.messages = s.messages[-4:]
    s.messages[0] = {"role": "system", "content": "trimmed"}
    del s.messages[1]


CHAT = Pipeline("scale-chat", Chat).then(respond).branch(route, {"ask": ask, "talk": talk}).then(boom).build()
TRIM = Pipeline("scale-trim", Chat).then(trim).build()


def turn(i: int) -> tuple[Any, dict[str, Any]]:
    if i in (9, 17):
        return TRIM, {}
    user = f"turn {i}" + ("?" if i % 3 == 0 else "") + (" fail" if i in (5, 13) else "") + \
        (" note" if i % 4 == 2 else "")
    return CHAT, {"user": user}


def state(output: Any) -> dict[str, Any]:
    return json.loads(output.model_dump_json())


def build(store: Store, turns: int) -> list[Any]:
    runs, previous = [], None
    for i in range(turns):
        flow, inputs = turn(i)
        previous = flow.run(inputs, store=store, resume=previous, raise_on_error=False)
        runs.append(previous)
    return runs


def test_a_thread_records_its_first_run_and_loads_in_bulk(tmp_path):
    with Store(str(tmp_path / "t.duckdb")) as store:
        runs = build(store, 12)
        ids = [r.run_id for r in runs]
        rows = dict(store.sql("SELECT run_id, thread_id FROM runs WHERE parent_run_id IS NULL").fetchall())
        assert rows[ids[0]] is None and {rows[i] for i in ids[1:]} == {ids[0]}
        loaded = store.runs_by_id(ids[::-1] + ["not-a-run"])
        assert set(loaded) == set(ids)  # missing ids are left out
        for rid in ids:
            one, many = store.run(rid), loaded[rid]
            assert (one.steps, one.reads, one.writes, one.decisions, one.rows) == \
                (many.steps, many.reads, many.writes, many.decisions, many.rows)
            assert one.thread_id == many.thread_id == (None if rid == ids[0] else ids[0])
        assert [t.run_id for t in store.thread(ids[-1])] == ids


def test_resume_by_id_starts_from_the_state_replay_gives(tmp_path):
    path = str(tmp_path / "r.duckdb")
    with Store(path) as store:
        runs = build(store, 20)
        by_id, previous = [], runs[-1].run_id
        for i in range(20, 30):  # each turn continued by id: from the kept states, no replay
            flow, inputs = turn(i)
            previous = flow.run(inputs, store=store, resume=previous, raise_on_error=False).run_id
            by_id.append(previous)
        kept = {rid: state(store.resume_point(rid).output) for rid in by_id}
        # a branch: an earlier turn continued again gives the same state as before
        again = CHAT.run({"user": "branch"}, store=store, resume=by_id[3])
        assert again.output.messages[:-2] == store.run(by_id[3], scope=Chat).output.messages
        assert state(store.resume_point(by_id[3]).output) == kept[by_id[3]]
    with Store(path) as store:  # a fresh store: nothing kept, every state replayed from the file
        for rid, expected in kept.items():
            assert state(store.resume_point(rid).output) == expected
            assert state(store.run(rid, scope=Chat).output) == expected
        assert store.resume_point(by_id[-1]).thread_id == runs[0].run_id


def test_a_resumed_state_is_never_changed_by_later_turns(tmp_path):
    with Store(str(tmp_path / "c.duckdb")) as store:
        first = CHAT.run({"user": "a note"}, store=store)
        second = CHAT.run({"user": "b note"}, store=store, resume=first.run_id)
        point = store.resume_point(first.run_id)
        before = state(point.output)
        point.output.messages.append({"role": "user", "content": "tampered"})
        point.output.notes["seen"]["x"] = 1
        third = CHAT.run({"user": "c note"}, store=store, resume=second.run_id)
        assert state(store.resume_point(first.run_id).output) == before
        assert len(third.output.messages) == 6 and "x" not in third.output.notes["seen"]


def test_resume_by_id_of_an_unknown_run_says_so(tmp_path):
    with Store(str(tmp_path / "u.duckdb")) as store:
        with pytest.raises(TracememError, match="no run 'nope'"):
            CHAT.run({"user": "x"}, store=store, resume="nope")


def test_a_live_thread_in_a_store_does_not_keep_its_runs_alive(tmp_path):
    with Store(str(tmp_path / "h.duckdb")) as store:
        first = CHAT.run({"user": "one"}, store=store)
        ref = weakref.ref(first)
        previous = first
        del first
        for i in range(5):
            previous = CHAT.run({"user": f"t{i}"}, store=store, resume=previous)
        store.flush()  # the writer's queue let go of them
        gc.collect()
        assert ref() is None  # only the store holds the earlier turns now
        assert previous.previous().previous().run_id  # ... and they load from it on demand
        assert len(previous.state_at().messages) == 12
    no_store = CHAT.run({"user": "one"})
    later = CHAT.run({"user": "two"}, resume=no_store)
    assert later.previous() is no_store  # without a store the live run is the only record: held


def test_a_live_thread_without_a_store_keeps_one_final_state_and_replays_the_others():
    runs, states, finals, previous = [], [], [], None
    for i in range(20):  # failed turns, trims, in-place notes: replay must give each run's own final state
        flow, inputs = turn(i)
        previous = flow.run(inputs, resume=previous, raise_on_error=False)
        runs.append(previous)
        states.append(state(previous.output))
        finals.append(weakref.ref(previous.output))
    gc.collect()
    assert [ref() is None for ref in finals] == [True] * 19 + [False]  # a run held in memory grows the heap
    #                                            by its own record only, not by a copy of the thread's state
    last = runs[-1].output
    assert [state(run.output) for run in runs] == states  # the earlier ones rebuilt by replay, equal
    assert runs[-1].output is last  # the latest keeps its own (the next turn starts from it)
    assert [r.continues for r in runs[1:]] == [r.run_id for r in runs[:-1]]


def test_backtrack_from_the_file_matches_the_live_walk(tmp_path):
    with Store(str(tmp_path / "b.duckdb")) as store:
        runs = build(store, 150)  # live runs, all held: the walk reads them, not the file
        live = {p: runs[-1].backtrack(p).to_json() for p in ("reply", "messages[-1]", "messages[3]", "mood")}
        loaded = store.run(runs[-1].run_id, scope=Chat)
        for path, expected in live.items():
            got = loaded.backtrack(path).to_json()
            assert got == expected, path
        assert len(loaded.backtrack("reply", max_depth=400, max_nodes=100_000).runs()) > 100


def test_threads_recorded_before_thread_id_still_load(tmp_path):
    path = str(tmp_path / "old.duckdb")
    with Store(path) as store:
        runs = build(store, 8)
        expected = state(store.run(runs[-1].run_id, scope=Chat).output)
        store.sql("UPDATE runs SET thread_id = NULL")  # as a file migrated from schema < 6 holds them
    with Store(path) as store:
        assert [t.run_id for t in store.thread(runs[-1].run_id)] == [r.run_id for r in runs]
        assert state(store.run(runs[-1].run_id, scope=Chat).output) == expected
        newer = CHAT.run({"user": "after the upgrade"}, store=store, resume=runs[-1].run_id)
    with Store(path) as store:
        assert [t.run_id for t in store.thread(newer.run_id)] == [r.run_id for r in runs] + [newer.run_id]
        assert state(store.run(newer.run_id, scope=Chat).output) == state(newer.output)


def test_a_big_store_is_indexed_a_small_one_is_not_also_after_migrating(tmp_path):
    path = str(tmp_path / "v2.duckdb")
    con = duckdb.connect(path)
    store_schema.create(con, version=2)
    con.execute("INSERT INTO steps (run_id, step, stage, kind, status, logs) VALUES "
                "('r1', 1, 'sub', 'subflow', 'ok', ['subflow outputs {\"a\": \"b\"}'])")
    con.execute("INSERT INTO runs (run_id, pipeline, status) VALUES ('r1', 'p', 'ok')")
    con.close()
    with Store(path) as store:  # v3's UPDATE commits before any index is built
        assert store.sql("SELECT outputs FROM subflows").fetchall() == [('{"a": "b"}',)]
        assert not store.indexed
        assert store.sql("SELECT count(*) FROM duckdb_indexes() WHERE table_name <> 'memory_events'").fetchall() == [(0,)]
        with store.lock:
            assert store_schema.index(store.con, at_least=1)  # what a store of INDEX_FROM runs does
        indexed = {r[0] for r in store.sql("SELECT table_name FROM duckdb_indexes() "
                                           "WHERE table_name <> 'memory_events'").fetchall()}
        assert set(store_schema.RUN_TABLES) - {"step_journal", "run_embeddings"} | {"messages", "message_chains"} \
            == indexed
        assert store.run("r1").steps[0].stage == "sub"
    with Store(path) as store:
        assert not store.indexed  # one run: below INDEX_FROM, nothing built at open (what exists stays)


def test_runs_lists_the_newest_with_their_own_step_counts_whatever_was_inserted_last(tmp_path):
    with Store(str(tmp_path / "l.duckdb")) as store:
        flow = Pipeline("p", Chat).then(respond).then(talk).build()
        for i in range(30):
            flow.run({"user": f"u{i}"}, store=store, subject="ana" if i % 2 else "bo")
        # an old run inserted last: the cut-off guessed from the last rows must not hide newer runs
        store.sql("INSERT INTO runs (run_id, pipeline, status, started_at) VALUES ('old', 'p', 'ok', ?)",
                  [datetime(2000, 1, 1)])

        def reference(where: str = "TRUE", limit: int = 100) -> list[tuple]:
            return store.sql(f"SELECT run_id, (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) FROM runs r "
                             f"WHERE parent_run_id IS NULL AND {where} ORDER BY started_at DESC, run_id "
                             f"LIMIT {limit}").fetchall()

        assert [(r["run_id"], r["steps"]) for r in store.runs()] == reference()
        assert [(r["run_id"], r["steps"]) for r in store.runs(limit=5)] == reference(limit=5)
        assert [r["run_id"] for r in store.runs(subject="ana", limit=7)] == \
            [r[0] for r in reference("subject = 'ana'", 7)]
        since = store.runs()[10]["started_at"]
        assert [r["run_id"] for r in store.runs(since=since)] == [r[0] for r in reference()][:11]
        assert store.runs(limit=0) == [] and store.runs()[-1]["run_id"] == "old"
        assert store.runs(limit=1)[0]["steps"] == 2


def test_a_resume_point_of_a_failed_run_drops_its_failed_step(tmp_path):
    with Store(str(tmp_path / "f.duckdb")) as store:
        ok = CHAT.run({"user": "fine"}, store=store)
        failed = CHAT.run({"user": "now fail"}, store=store, resume=ok, raise_on_error=False)
        assert failed.status == "failed"
        assert store.resume_point(failed.run_id).output.mood != "bad"
        assert state(store.resume_point(failed.run_id).output) == state(store.run(failed.run_id, scope=Chat).output)


def test_prune_cut_off_by_date_still_keeps_thread_turns(tmp_path):
    with Store(str(tmp_path / "d.duckdb")) as store:
        runs = build(store, 6)
        cut = datetime.utcnow() + timedelta(days=1)
        report = store.prune(older_than=cut, keep_last=2, dry_run=True)
        assert report.runs == [] and set(report.kept_cited) == {r.run_id for r in runs[:4]}


def test_kept_states_are_bounded(tmp_path):
    from tracemem.store.write.listener import Recent

    with Store(str(tmp_path / "k.duckdb")) as store:
        runs = build(store, 6)
        recent = Recent(size=3)
        for run in runs:
            recent.add(run)
        assert [recent.get(r.run_id) is not None for r in runs] == [False] * 3 + [True] * 3
        assert store.resume_point(runs[0].run_id).output == runs[0].output  # evicted ones: replayed from the file
