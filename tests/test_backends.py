"""The same store, memory and backtracking tests against both backends: a DuckDB file and PostgreSQL.

`store_factory` (tests/pg_fixtures.py) is parametrised over ["duckdb", "postgres"]; every test here
runs once per backend against a real database (a file on disk, a real server in a temp directory).
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from pg_fixtures import pg_server, pg_url, reader_login, store_factory  # noqa: F401
from stages.demo import SESSIONS, SUBJECT, build_flow, models
from tracemem import Pipeline, RunFailed, TracememError, decide
from tracemem.store import SCHEMA_VERSION
from tracemem.store.write.journal import read_entries


class S(BaseModel):
    question: str = ""
    score: int = 0
    answer: str = ""
    notes: list[str] = []
    facts: dict[str, str] = {}


def score(s):
    s.score = len(s.question)
    s.notes.append("scored")


def route(s):
    return decide(s, [("longer than 5", lambda v: v.score > 5, "long")], default="short")


def long_answer(s, ctx):
    ctx.log("answering long")
    s.facts["kind"] = "long"
    s.answer = f"long:{s.question}"


def short_answer(s):
    s.answer = "short"


def boom(s):
    raise ValueError("stage exploded")


def flow():
    return (Pipeline("qa", S, query="question").then(score)
            .branch(route, {"long": long_answer, "short": short_answer}).build())


def test_a_run_round_trips_with_every_step_read_write_and_decision(store_factory):
    store = store_factory()
    run = flow().run({"question": "what is tracemem?"}, store=store, subject="ana")
    loaded = store.run(run.run_id)
    assert [(s.step, s.stage, s.status, s.logs) for s in loaded.steps] == \
           [(s.step, s.stage, s.status, s.logs) for s in run.steps]
    assert loaded.writes == run.writes and loaded.reads == run.reads
    assert [(d.step, d.chosen, d.evidence) for d in loaded.decisions] == \
           [(d.step, d.chosen, d.evidence) for d in run.decisions]
    assert loaded.output.answer == "long:what is tracemem?" and loaded.output.facts == {"kind": "long"}
    assert loaded.subject == "ana" and loaded.status == "ok"
    assert abs(loaded.started_at - run.started_at) < 1000  # PostgreSQL keeps microseconds
    assert str(loaded.backtrack("answer")) == str(run.backtrack("answer"))


def test_a_failed_run_keeps_its_finished_steps_and_the_error(store_factory):
    store = store_factory()
    bad = Pipeline("bad", S).then(score).then(boom).build()
    with pytest.raises(RunFailed) as caught:
        bad.run({"question": "x"}, store=store)
    loaded = store.run(caught.value.run.run_id)
    assert loaded.status == "failed" and "stage exploded" in loaded.error
    assert [(s.stage, s.status) for s in loaded.steps] == [("score", "ok"), ("boom", "failed")]
    assert loaded.output.score == 1


def test_runs_lists_and_filters_and_sql_returns_the_same_shapes(store_factory):
    store = store_factory()
    f = flow()
    for i, subject in enumerate(["ana", "bo", "ana"]):
        f.run({"question": "q" * (i * 4 + 1)}, store=store, subject=subject)
    runs = store.runs()
    assert len(runs) == 3 and runs[0]["started_at"] >= runs[-1]["started_at"]
    assert {r["subject"] for r in store.runs(subject="ana")} == {"ana"} and len(store.runs(subject="ana")) == 2
    assert all(isinstance(r["duration_ms"], float) and r["steps"] == 3 for r in runs)
    assert store.runs(since=datetime.utcnow() + timedelta(days=1)) == []
    rel = store.sql("SELECT stage, count(*) AS n FROM steps GROUP BY stage ORDER BY stage")
    assert rel.columns == ["stage", "n"]
    assert rel.fetchall() == [("long_answer", 1), ("route", 3), ("score", 3), ("short_answer", 2)]
    table = store.sql("SELECT run_id, input FROM runs WHERE subject = ? ORDER BY started_at", ["bo"]).to_arrow_table()
    assert store.sql("SELECT run_id FROM runs").arrow().read_all().num_rows == 3
    assert table.num_rows == 1 and json.loads(table.column("input")[0].as_py())["question"] == "qqqqq"
    recipe = store.sql("SELECT json_extract_string(input, '$.question') AS q, "
                       "epoch_us(ended_at) - epoch_us(started_at) >= 0 AS forward FROM runs ORDER BY q").fetchall()
    assert recipe == [("q", True), ("qqqqq", True), ("qqqqqqqqq", True)]


def test_both_backends_hold_the_same_tables_and_columns(store_factory, tmp_path):
    from tracemem.store import Store

    store = store_factory()
    with Store(str(tmp_path / "reference.duckdb")) as reference:
        want = {t: {c for (c,) in reference.sql(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [t]).fetchall()}
            for t in reference.tables()}
    have_tables = store.tables()
    assert have_tables == set(want)
    schema = "main" if store_factory.kind == "duckdb" else "current_schema()"
    quoted = f"'{schema}'" if schema == "main" else schema
    extra = {"step_journal": {"lease"}, "run_embeddings": {"seq"}}  # PostgreSQL's own
    for table, columns in want.items():
        have = {c for (c,) in store.sql("SELECT column_name FROM information_schema.columns "
                                        f"WHERE table_name = ? AND table_schema = {quoted}", [table]).fetchall()}
        assert have - extra.get(table, set()) == columns - extra.get(table, set()), table
    assert store.sql("SELECT value FROM tracemem_meta WHERE key = 'schema_version'").fetchall() == \
           [(str(SCHEMA_VERSION),)]


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_a_reopened_store_has_everything(store_factory, durability):
    store = store_factory(durability=durability)
    ids = [flow().run({"question": f"question {i}"}, store=store).run_id for i in range(20)]
    store.close()
    again = store_factory()
    assert sorted(r["run_id"] for r in again.runs(limit=100)) == sorted(ids)
    assert again.sql("SELECT count(*) FROM step_journal").fetchall() == [(0,)]
    assert again.run(ids[3]).output.answer == "long:question 3"


def test_stage_durability_puts_each_finished_stage_in_the_database_at_once(store_factory):
    store = store_factory(durability="stage")
    seen: list[int] = []

    def look(s, ctx):
        # a second look at the database, mid-run: the run's row and its finished stage are there
        seen.append(store.sql("SELECT count(*) FROM steps WHERE run_id = ?", [ctx.run_id]).fetchall()[0][0])
        seen.append(store.sql("SELECT count(*) FROM runs WHERE run_id = ? AND status = 'running'",
                              [ctx.run_id]).fetchall()[0][0])

    Pipeline("look", S).then(score).then(look).build().run({"question": "x"}, store=store)
    assert seen == [1, 1]


def test_flush_interval_zero_has_the_run_in_the_database_when_run_returns(store_factory):
    store = store_factory(flush_interval=0)
    run = flow().run({"question": "right now"}, store=store)
    con = store.backend.cursor()  # no flush: what is in the database (or its run journal) as flow.run returns
    if store.backend.writes.journal is not None and not store.backend.writes.journal_rows:  # a DuckDB file: its run journal
        journaled = sum(e is not None and e[0] == run.run_id for e, _, _ in read_entries(store.backend.writes.journal.path, 0))
    else:
        journaled = con.execute("SELECT count(*) FROM step_journal WHERE run_id = ?", [run.run_id]).fetchall()[0][0]
    in_runs = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run.run_id]).fetchall()[0][0]
    assert journaled + in_runs >= 1
    store.flush()
    assert store.run(run.run_id).output.answer == "long:right now"


def test_a_thread_continues_and_reloads(store_factory):
    store = store_factory()

    class Chat(BaseModel):
        question: str = ""
        history: list[str] = []

    def remember(c):
        c.history.append(c.question)

    chat = Pipeline("chat", Chat).then(remember).build()
    first = chat.run({"question": "one"}, store=store)
    second = chat.run({"question": "two"}, store=store, resume=first.run_id)
    third = chat.run({"question": "three"}, store=store, resume=second.run_id)
    assert third.output.history == ["one", "two", "three"]
    thread = store.thread(third.run_id)
    assert [t.run_id for t in thread] == [first.run_id, second.run_id, third.run_id]
    assert store.run(third.run_id).output.history == ["one", "two", "three"]


def test_memory_contract_holds(store_factory):
    store = store_factory()
    m = store.memory
    tea = m.remember("ana", "Ana drinks green tea every morning", confidence=90, tags=["drinks"])
    low = m.remember("ana", "Ana might like black tea", confidence=40)
    old = m.remember("ana", "Ana drank tea with milk", confidence=90, valid_until=datetime(2000, 1, 1))
    m.remember("bo", "Bo drinks green tea too", confidence=95)
    found = m.search("ana", "what tea does Ana drink", recall=True)
    assert [r.memory_id for r in found.records] == [tea.memory_id]
    assert {e.memory_id: e.reason for e in found.excluded} == {low.memory_id: "below_floor",
                                                                old.memory_id: "out_of_window"}
    assert all(r.subject == "ana" for r in m.search("ana", "green tea").records)  # subjects never leak
    assert [r.memory_id for r in m.list("ana", tag="drinks")] == [tea.memory_id]
    m.flag(tea.memory_id, "stale", "she switched to coffee")
    assert m.search("ana", "green tea", recall=True).records == []
    assert m.search("ana", "green tea", recall=True).excluded_flagged == 1
    m.update(tea.memory_id, text="Ana drinks coffee every morning", review_state="reviewed")
    assert [r.text for r in m.search("ana", "coffee", recall=True).records] == ["Ana drinks coffee every morning"]
    m.forget(tea.memory_id, reason="asked to")
    assert tea.memory_id not in [r.memory_id for r in m.search("ana", "coffee").records]  # forgotten: never found
    assert m.get(tea.memory_id).forgotten
    m.purge(low.memory_id)
    assert [e.event for e in m.history(low.memory_id)] == ["remember", "purge"]
    assert m.subjects() == ["ana", "bo"]
    assert len(m.embedding(old.memory_id)) == m.embedder.dim
    assert m.rebuild_index() == 2  # old (out of window, still live) and Bo's


def test_cross_run_backtrack_reaches_the_memory_and_the_turn_it_came_from(store_factory):
    store = store_factory()
    f, env = build_flow(), models()
    runs = [f.run({"question": q, "turn_id": t}, store=store, subject=SUBJECT, env=env) for t, q in SESSIONS]
    wrong = runs[-1]
    trace = store.backtrack(wrong.run_id, "answer")
    memories = trace.sources("memory")
    window = [s for s in memories if "365 days" in (s.get("text") or "")]
    assert window and window[0]["source_run_id"] == runs[1].run_id and window[0]["source_ref"] == "t2"
    # through the memory's provenance into the step of the turn it was extracted in
    node = f"m:{window[0]['memory_id']}"
    origin = [v for v in trace.graph.successors(node) if trace.graph.edges[node, v].get("kind") == "provenance"]
    assert [trace.graph.nodes[v]["run_id"] for v in origin] == [runs[1].run_id]
    assert store.affected(window[0]["memory_id"]).runs.keys() >= {wrong.run_id}
    store.feedback(wrong.run_id, "wrong", note="policy is 30 days")
    assert "marked wrong" in store.suspect([wrong.run_id])[wrong.run_id]
    blamed = store.blame()
    assert blamed.wrong == 1 and any(b.id == window[0]["memory_id"] for b in blamed.ranked)


def test_snapshots_find_similar_past_runs(store_factory):
    store = store_factory()
    f = flow()
    past = f.run({"question": "how do I reset my password"}, store=store)
    f.run({"question": "what is the weather like today"}, store=store)
    hits = store.similar_runs("qa", "how do I reset my password")
    assert hits and hits[0][0] == past.run_id and hits[0][2] > 0.99
    assert store.similar_runs("qa", "zzzz qqqq xxxx", min_score=0.9) == []


def test_prune_keeps_what_memories_cite_and_export_writes_parquet(store_factory, tmp_path):
    store = store_factory()
    f = flow()
    ids = [f.run({"question": f"question number {i}"}, store=store).run_id for i in range(5)]
    store.memory.remember("ana", "learned in the first run", confidence=80, source_run_id=ids[0], source_step=1)
    dry = store.prune(keep_last=2, dry_run=True)
    assert sorted(dry.runs) == sorted(ids[1:3]) and dry.kept_cited == [ids[0]]
    report = store.prune(keep_last=2)
    assert sorted(report.runs) == sorted(ids[1:3]) and report.rows["steps"] == 6
    assert sorted(r["run_id"] for r in store.runs()) == sorted([ids[0], *ids[3:]])
    counts = store.export(str(tmp_path / "out"))
    assert counts["runs"] == 3 and counts["memories"] == 1
    assert pq.read_table(str(tmp_path / "out" / "runs.parquet")).num_rows == 3
    assert os.path.exists(tmp_path / "out" / "suspect_runs.parquet")


def test_read_only_sql_cannot_change_the_store(store_factory, request):
    from tracemem.store import Store
    from tracemem.store.read.user_sql import ReadOnlySQLError

    writer = store_factory()
    flow().run({"question": "keep me"}, store=writer)
    writer.close()
    if store_factory.kind == "postgres":  # read-only SQL needs a login that may only read (store/pg/reader.py)
        reader = Store(reader_login(request.getfixturevalue("pg_server"), store_factory.location), read_only=True)
        store_factory.opened.append(reader)
    else:
        reader = store_factory(read_only=True)
    assert reader.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]
    with pytest.raises(ReadOnlySQLError):
        reader.sql("DELETE FROM runs")
    with pytest.raises(TracememError):
        reader.sql("SELECT * FROM no_such_table")
    assert reader.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]


def test_every_duckdb_schema_version_has_its_postgresql_statements():
    from tracemem.store.pg.schema import PG_MIGRATIONS
    from tracemem.store.tables import MIGRATIONS

    assert sorted(PG_MIGRATIONS) == sorted(MIGRATIONS) == list(range(2, SCHEMA_VERSION + 1))


class Order(BaseModel):
    item: str = ""
    size: str = ""
    shipped: str = ""


def ask(s, ctx):
    s.size = ctx.interrupt({"question": "size?", "item": s.item})


def ship(s, ctx):
    s.shipped = f"{s.item} ({s.size}), ok'd by {ctx.answer}"


ORDERS = Pipeline("orders", Order).then(ask).then(ship, pause_before=True).build()


@pytest.mark.parametrize("flush_interval,durability", [(0, "run"), (0.05, "stage"), (0.05, "run")])
def test_pause_resume_and_fork_across_store_openings(store_factory, flush_interval, durability):
    first = store_factory(flush_interval=flush_interval, durability=durability, lease_seconds=0.4)
    run = ORDERS.run({"item": "boots"}, store=first)
    assert run.status == "paused" and run.pending == {"question": "size?", "item": "boots"}
    first.close()
    second = store_factory(flush_interval=flush_interval, durability=durability, lease_seconds=0.4)
    assert second.runs(status="paused")[0]["pending"] == {"question": "size?", "item": "boots"}
    run = ORDERS.resume(run.run_id, "42", store=second, by="ana")
    assert run.status == "paused" and run.output.size == "42"
    done = ORDERS.resume(run.run_id, "yes", store=second)
    assert done.output.shipped == "boots (42), ok'd by yes"
    second.flush()
    loaded = second.run(done.run_id)
    assert loaded.ok and [s.status for s in loaded.steps] == ["paused", "ok", "ok"]
    assert second.sql("SELECT answered_by FROM human_inputs WHERE run_id = ? ORDER BY idx",
                      [done.run_id]).fetchall()[0] == ("ana",)
    forked = ORDERS.fork(done.run_id, "ask", edits={"item": "socks"}, store=second)
    assert forked.forked_from_run_id == done.run_id and forked.status == "paused"
    assert second.run(forked.run_id).output.item == "socks"


def test_a_tool_agent_run_records_its_tool_calls_and_backtracks_through_them(store_factory):
    from stages import tool_agent
    from tracemem.models import ScriptedModel, ToolCall

    def order_status(order_id: str) -> str:
        """Where an order is."""
        return f"order {order_id} was delivered to the Porto office"

    store = store_factory()
    model = ScriptedModel(replies=[[ToolCall(id="c1", name="order_status", arguments={"order_id": "A7"})],
                                   "A7 is at the Porto office."], name="agent")
    run = tool_agent([order_status], model=model).build().run({"question": "Where is A7?"}, store=store)
    calls = store.sql("SELECT name, arguments_text, result, error FROM tool_calls WHERE run_id = ?",
                      [run.run_id]).fetchall()
    assert calls == [("order_status", '{"order_id": "A7"}', "order A7 was delivered to the Porto office", None)]
    loaded = store.run(run.run_id)
    assert loaded.output.answer == "A7 is at the Porto office."
    assert any(a.get("kind") == "tool_call" for _, a in loaded.backtrack("answer").graph.nodes(data=True))
