"""The DuckDB store: round trip, failed runs, queries, schema versions, retention, export, secrets, threads."""
from __future__ import annotations

import glob
import json
import os
from datetime import timedelta, timezone

import duckdb
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel, Field, SecretStr

from tracemem import PathError, Pipeline, Run, RunFailed, TracememError, decide
from tracemem.scope.known import known_scopes
from tracemem.store import SCHEMA_VERSION, PruneReport, Store
from tracemem.store import tables as store_schema


class S(BaseModel):
    question: str = ""
    score: int = 0
    answer: str = ""
    notes: list[str] = []
    facts: dict[str, str] = {}
    n: int = 0


class Child(BaseModel):
    text: str = ""
    result: str = ""


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


def count(s):
    s.n = s.n + 1
    s.notes.append(f"n={s.n}")


def shout(c):
    c.result = c.text.upper()


CHILD = Pipeline("child", Child).then(shout).build()


def finish(s):
    s.answer = s.answer + "!"


def build_flow():
    return (Pipeline("agent", S, query="question")
            .then(score)
            .branch(route, {"long": long_answer, "short": short_answer})
            .then(count)
            .loop_to("count", when=lambda s: s.n < 3, max_iterations=5, id="again")
            .subflow(CHILD, inputs={"text": "answer"}, outputs={"answer": "result"}, id="upper")
            .then(finish)
            .build())


FLOW = build_flow()


def same_run(a: Run, b: Run) -> None:
    assert (a.run_id, a.pipeline, a.pipeline_hash, a.status, a.error) == (b.run_id, b.pipeline, b.pipeline_hash,
                                                                         b.status, b.error)
    assert (a.started_at, a.ended_at, a.subject, a.parent_run_id, a.parent_step, a.query, a.continues) == \
        (b.started_at, b.ended_at, b.subject, b.parent_run_id, b.parent_step, b.query, b.continues)
    assert a.input_json == b.input_json and a.output_json == b.output_json and a.degraded == b.degraded
    assert a.steps == b.steps
    assert a.reads == b.reads
    assert a.writes == b.writes
    assert a.decisions == b.decisions
    assert a.rows == b.rows
    assert len(a.children) == len(b.children)
    for x, y in zip(a.children, b.children):
        same_run(x, y)


# -- round trip -----------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_round_trip_loaded_run_equals_live_run(tmp_path, durability):
    path = str(tmp_path / "agent.duckdb")
    paths = ("answer", "notes", "n", "facts.kind", "score")
    with Store(path, durability=durability) as store:
        live = FLOW.run({"question": "what is a duck?"}, store=store, subject="ana")
        short = FLOW.run({"question": "hi"}, store=store)
        same = store.run(live.run_id)  # loaded from the file by the store that recorded it
        same_run(live, same)
        for path_ in paths:  # backtracking answers identically, into the subflow too
            a, b = live.backtrack(path_), same.backtrack(path_)
            assert a.explain() == b.explain(), path_
            assert a.to_json() == b.to_json(), path_
            assert a.to_mermaid() == b.to_mermaid(), path_
        assert "shout" in same.backtrack("answer").explain()
        for run in (live, same):  # a field the scope does not have: the same error, live or loaded
            with pytest.raises(PathError, match=r"has no field 'never_there'; its fields: question, "):
                run.backtrack("never_there")
        assert store.backtrack(live.run_id, "answer").to_json() == live.backtrack("answer").to_json()
    assert live.output.answer == "LONG:WHAT IS A DUCK?!"
    assert any(s.kind == "subflow" and s.child_run_id for s in live.steps)
    assert [s.iteration for s in live.steps if s.stage == "count"] == [0, 1, 2]

    with Store(path) as store:  # a fresh process's view: nothing cached
        loaded = store.run(live.run_id, scope=S)
        same_run(live, loaded)
        assert loaded.store is store
        # reads keep their sources
        assert any(r.source_step is None for r in loaded.reads)  # run input
        assert any(r.source_step is not None for r in loaded.reads)
        assert loaded.decisions[0].chosen == "long" and loaded.decisions[0].evidence == live.decisions[0].evidence
        # the final scope, every intermediate state and single values
        assert loaded.output == live.output
        for step in live.steps:
            assert loaded.state_at(step.step) == live.state_at(step.step)
        assert loaded.state_at("score").score == 15
        assert loaded.value_at("notes") == live.value_at("notes") == ["scored", "n=1", "n=2", "n=3"]
        assert loaded.value_at("facts.kind") == "long"
        assert loaded.step("upper").child_run_id == live.children[0].run_id
        # backtracking answers identically in a fresh process too (a subflow's output mapping lives in the
        # Flow, unknown here: the trace of a value a subflow produced reaches the child run, at least)
        for path_ in paths[1:]:
            a, b = live.backtrack(path_), loaded.backtrack(path_)
            assert a.explain() == b.explain(), path_
            assert a.to_json() == b.to_json(), path_
            assert a.to_mermaid() == b.to_mermaid(), path_
        assert live.children[0].run_id in loaded.backtrack("answer").runs()
        # the child run is its own row, linked to its parent
        child = store.run(live.children[0].run_id, scope=Child)
        assert child.parent_run_id == live.run_id and child.output.result == "LONG:WHAT IS A DUCK?"
        assert store.run(short.run_id, scope=S).output.answer == "SHORT!"


def test_loaded_run_without_scope_model_gives_plain_data(tmp_path, monkeypatch):
    path = str(tmp_path / "a.duckdb")
    with Store(path) as store:
        live = FLOW.run({"question": "what is a duck?"}, store=store)
    with Store(path) as store:
        assert store.run(live.run_id).schema is not None  # flows built in this process are known to any store
        monkeypatch.delitem(known_scopes.by_hash, FLOW.hash)  # as in a process that never built the flow
        loaded = store.run(live.run_id)  # the scope model is unknown to this store
        assert loaded.schema is None
        assert loaded.state_at() == live.output.model_dump(mode="json")
        assert loaded.backtrack("notes").explain() == live.backtrack("notes").explain()
        store.register_scope("agent", S)
        assert store.run(live.run_id).output == live.output


def test_memory_store_and_relation_api():
    with Store(":memory:") as store:
        run = FLOW.run({"question": "a duck"}, store=store)
        rel = store.sql("SELECT run_id, status FROM runs WHERE parent_run_id IS NULL")
        assert rel.fetchall() == [(run.run_id, "ok")]
        arrow = store.sql("SELECT stage FROM steps WHERE run_id = ? ORDER BY step", [run.run_id]).arrow()
        table = arrow.read_all() if hasattr(arrow, "read_all") else arrow
        assert table.column("stage").to_pylist()[:2] == ["score", "route"]
        assert store.sql("SELECT count(*) FROM writes WHERE run_id = $1", [run.run_id]).fetchall()[0][0] == \
            len(run.writes)
        for table_name in ("runs", "steps", "writes", "reads", "decisions", "model_calls", "prompt_sections",
                           "memories", "memory_events", "memory_uses"):
            store.sql(f"SELECT * FROM {table_name} LIMIT 0").fetchall()
        with pytest.raises(TracememError, match="SQL error"):
            store.sql("SELEKT 1")


def test_runs_lists_and_filters(tmp_path):
    with Store(str(tmp_path / "f.duckdb")) as store:
        a = FLOW.run({"question": "first question"}, store=store, subject="ana")
        b = FLOW.run({"question": "hi"}, store=store, subject="bo")
        other = Pipeline("other", S).then(score).build()
        c = other.run({"question": "x"}, store=store)
        failing = Pipeline("other", S).then(score).then(_boom).build()
        d = failing.run({"question": "y"}, store=store, raise_on_error=False)
        rows = store.runs()
        assert [r["run_id"] for r in rows] == [d.run_id, c.run_id, b.run_id, a.run_id]  # newest first, no children
        assert rows[-1]["steps"] == len(a.steps) and rows[-1]["subject"] == "ana"
        assert rows[-1]["duration_ms"] >= 0
        assert {r["run_id"] for r in store.runs(pipeline="agent")} == {a.run_id, b.run_id}
        assert [r["run_id"] for r in store.runs(status="failed")] == [d.run_id]
        assert [r["run_id"] for r in store.runs(subject="bo")] == [b.run_id]
        assert [r["run_id"] for r in store.runs(pipeline="other", status="ok")] == [c.run_id]
        assert len(store.runs(limit=2)) == 2
        children = store.runs(include_children=True, pipeline="child")
        assert {r["parent_run_id"] for r in children} == {a.run_id, b.run_id}
        # time range: since is inclusive, until exclusive
        started = {r["run_id"]: r["started_at"] for r in rows}
        assert {r["run_id"] for r in store.runs(since=started[c.run_id])} == {c.run_id, d.run_id}
        assert {r["run_id"] for r in store.runs(until=started[c.run_id])} == {a.run_id, b.run_id}
        assert [r["run_id"] for r in store.runs(since=started[b.run_id], until=started[c.run_id])] == [b.run_id]


def test_time_filters_take_aware_datetimes_as_utc(tmp_path):
    with Store(str(tmp_path / "t.duckdb")) as store:
        run = Pipeline("p", S).then(score).build().run({}, store=store)
        started = store.runs()[0]["started_at"]  # naive UTC
        aware = started.replace(tzinfo=timezone.utc).astimezone(timezone(timedelta(hours=9)))
        assert [r["run_id"] for r in store.runs(since=aware)] == [run.run_id]
        assert store.runs(until=aware) == []
        assert store.prune(older_than=aware, dry_run=True).runs == []
        assert store.prune(older_than=aware + timedelta(seconds=1), dry_run=True).runs == [run.run_id]


def test_unknown_run_id_is_a_clear_error():
    with Store(":memory:") as store:
        with pytest.raises(TracememError, match=r"no run 'nope' in :memory:"):
            store.run("nope")


# -- failed runs ---------------------------------------------------------------------------


def _boom(s):
    s.answer = "half-done"  # never committed: the stage failed
    raise RuntimeError("model server down")


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_failed_run_recorded_with_error_and_finished_steps(tmp_path, durability):
    path = str(tmp_path / "f.duckdb")
    flow = Pipeline("fails", S).then(score).then(count).then(_boom).then(finish).build()
    with Store(path, durability=durability) as store:
        with pytest.raises(RunFailed) as info:
            flow.run({"question": "hello there"}, store=store)
        live = info.value.run
    with Store(path) as store:
        (row,) = store.sql("SELECT status, error FROM runs WHERE run_id = ?", [live.run_id]).fetchall()
        assert row[0] == "failed"
        assert "_boom" in row[1] and "RuntimeError: model server down" in row[1]
        steps = store.sql("SELECT stage, status, error FROM steps WHERE run_id = ? ORDER BY step",
                          [live.run_id]).fetchall()
        assert [(s[0], s[1]) for s in steps] == [("score", "ok"), ("count", "ok"), ("_boom", "failed")]
        assert "model server down" in steps[2][2]
        paths = [p for (p,) in store.sql("SELECT path FROM writes WHERE run_id = ? ORDER BY step, seq",
                                         [live.run_id]).fetchall()]
        assert paths == ["score", "notes", "n", "notes"]  # the failed stage's write is not there
        loaded = store.run(live.run_id, scope=S)
        same_run(live, loaded)
        assert loaded.output.answer == "" and loaded.output.n == 1
        assert store.runs(status="failed")[0]["run_id"] == live.run_id


def test_bad_write_recorded_as_failed_run_naming_stage_and_field(tmp_path):
    def bad(s):
        s.n = "not a number"

    flow = Pipeline("bad", S).then(score).then(bad).build()
    with Store(str(tmp_path / "b.duckdb")) as store:
        run = flow.run({"question": "q"}, store=store, raise_on_error=False)
        (status, error), = store.sql("SELECT status, error FROM runs WHERE run_id = ?", [run.run_id]).fetchall()
        assert status == "failed" and "stage 'bad'" in error and "to 'n'" in error
        assert store.sql("SELECT count(*) FROM steps WHERE run_id = ? AND status = 'ok'",
                         [run.run_id]).fetchall()[0][0] == 1


# -- schema versions ---------------------------------------------------------------------------


def _v1_file(path: str) -> str:
    con = duckdb.connect(path)
    store_schema.create(con, version=1)
    con.execute("INSERT INTO runs (run_id, pipeline, pipeline_hash, status, started_at, ended_at, input, output) "
                "VALUES ('oldrun0000000001', 'legacy', 'h1', 'ok', TIMESTAMP '2024-01-01 10:00:00', "
                "TIMESTAMP '2024-01-01 10:00:01', '{\"question\": \"old\"}', '{\"answer\": \"yes\"}')")
    con.execute("INSERT INTO steps (run_id, step, stage, name, kind, iteration, status, started_at, ended_at) "
                "VALUES ('oldrun0000000001', 1, 'answer', 'answer', 'stage', 0, 'ok', "
                "TIMESTAMP '2024-01-01 10:00:00', TIMESTAMP '2024-01-01 10:00:01')")
    con.execute("INSERT INTO writes VALUES ('oldrun0000000001', 1, 1, 'answer', 'set', '\"yes\"')")
    con.close()
    return path


def test_migrates_schema_v1_keeping_data(tmp_path):
    path = _v1_file(str(tmp_path / "v1.duckdb"))
    con = duckdb.connect(path)
    assert con.execute("SELECT value FROM tracemem_meta WHERE key = 'schema_version'").fetchall()[0][0] == "1"
    assert "subject" not in [r[0] for r in con.execute("DESCRIBE runs").fetchall()]
    con.close()
    # read-only cannot migrate: it says so, and what to do
    with pytest.raises(TracememError, match=r"schema v1 and needs migrating to v\d+; open it once without read_only"):
        Store(path, read_only=True)
    messages: list[str] = []
    with Store(path, log=messages.append) as store:
        assert any("migrated" in m and f"v{SCHEMA_VERSION}" in m for m in messages)
        assert store.sql("SELECT value FROM tracemem_meta WHERE key = 'schema_version'").fetchall()[0][0] == \
            str(SCHEMA_VERSION)
        old = store.run("oldrun0000000001")
        assert old.status == "ok" and old.subject is None and old.state_at() == {"question": "old", "answer": "yes"}
        assert [s.stage for s in old.steps] == ["answer"]
        new = FLOW.run({"question": "new question"}, store=store, subject="ana")
    with Store(path, read_only=True) as store:  # now current: read-only opens fine
        assert {r["run_id"] for r in store.runs()} == {"oldrun0000000001", new.run_id}
        assert store.runs(subject="ana")[0]["run_id"] == new.run_id
        store.sql("SELECT * FROM snapshot_uses, run_embeddings LIMIT 0").fetchall()


def test_newer_schema_version_is_refused_with_a_clear_error(tmp_path):
    path = str(tmp_path / "future.duckdb")
    con = duckdb.connect(path)
    store_schema.create(con)
    con.execute("UPDATE tracemem_meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    for read_only in (False, True):
        with pytest.raises(TracememError, match=rf"newer tracemem \(schema v99; this version reads up to "
                                                rf"v{SCHEMA_VERSION}\); upgrade"):
            Store(path, read_only=read_only)


def test_foreign_duckdb_file_and_non_duckdb_file_are_refused(tmp_path):
    path = str(tmp_path / "sales.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE orders (id INTEGER)")
    con.execute("INSERT INTO orders VALUES (1)")
    con.close()
    with pytest.raises(TracememError, match=r"is not a tracemem store \(it holds tables orders"):
        Store(path)
    con = duckdb.connect(path)
    assert con.execute("SELECT count(*) FROM orders").fetchall()[0][0] == 1  # left untouched
    assert [r[0] for r in con.execute("SHOW TABLES").fetchall()] == ["orders"]
    con.close()
    text = tmp_path / "notes.duckdb"
    text.write_text("this is not a database\n" * 100)
    with pytest.raises(TracememError, match=r"cannot open .*notes.duckdb"):
        Store(str(text))
    with pytest.raises(TracememError, match=r"no tracemem store at .*missing.duckdb"):
        Store(str(tmp_path / "missing.duckdb"), read_only=True)
    assert not os.path.exists(tmp_path / "missing.duckdb")


def test_empty_duckdb_file_read_only_is_explained(tmp_path):
    path = str(tmp_path / "empty.duckdb")
    duckdb.connect(path).close()
    with pytest.raises(TracememError, match="is empty, not a tracemem store"):
        Store(path, read_only=True)


# -- retention ----------------------------------------------------------------------------------


def _emit_prompt(s, ctx):
    ctx.emit("prompts", prompt_id=f"p-{ctx.run_id}", text="hello", messages=[{"role": "user"}])
    ctx.emit("prompt_sections", prompt_id=f"p-{ctx.run_id}", idx=0, kind="base", text="hello")
    s.answer = "prompted"


def _counts(store: Store) -> dict[str, int]:
    return {t: store.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in store_schema.RUN_TABLES}


def test_prune_keeps_cited_runs_and_their_children_and_reports(tmp_path):
    flow = (Pipeline("p", S).then(_emit_prompt)
            .subflow(CHILD, inputs={"text": "answer"}, outputs={"answer": "result"}, id="upper").build())
    with Store(str(tmp_path / "p.duckdb")) as store:
        runs = [flow.run({"question": f"q{i}"}, store=store) for i in range(6)]
        cited_root, cited_child = runs[1], runs[3]
        m1 = store.memory.remember("ana", "likes ducks", source_run_id=cited_root.run_id, source_step=1)
        m2 = store.memory.remember("ana", "lives by a pond", source_run_id=cited_child.children[0].run_id)
        before = _counts(store)
        all_ids = {r for (r,) in store.sql("SELECT run_id FROM runs").fetchall()}
        assert len(all_ids) == 12

        dry = store.prune(keep_last=1, dry_run=True)
        assert isinstance(dry, PruneReport) and dry.dry_run
        assert _counts(store) == before  # nothing removed
        assert "would remove" in str(dry)

        report = store.prune(keep_last=1)
        assert report.runs == dry.runs and report.rows == dry.rows and report.kept_cited == dry.kept_cited
        removed_roots = {r.run_id for r in (runs[0], runs[2], runs[4])}
        removed = removed_roots | {r.children[0].run_id for r in (runs[0], runs[2], runs[4])}
        assert set(report.runs) == removed  # subflow children go with their parent
        assert report.kept_cited == sorted([cited_root.run_id, cited_child.run_id])
        assert report.rows["runs"] == 6 and report.rows["prompts"] == 3 and report.rows["prompt_sections"] == 3
        assert report.rows["steps"] == 3 * (2 + 1)
        assert str(report).startswith("removed 6 run(s)") and "kept 2 run(s) that memories cite" in str(report)
        after = _counts(store)
        assert {t: before[t] - after[t] for t in before} == {t: report.rows.get(t, 0) for t in before}
        left = {r for (r,) in store.sql("SELECT run_id FROM runs").fetchall()}
        assert left == all_ids - removed
        assert cited_child.children[0].run_id in left and cited_root.children[0].run_id in left
        # memories are never pruned, and what they cite still loads and backtracks
        assert {m.memory_id for m in store.memory.list("ana")} == {m1.memory_id, m2.memory_id}
        assert store.run(cited_root.run_id).backtrack("answer").missing is None
        # a second prune has nothing left to do
        again = store.prune(keep_last=1)
        assert again.runs == [] and str(again) == "removed 0 run(s); kept 2 run(s) that memories cite"


def test_prune_older_than_and_keep_last_combine(tmp_path):
    with Store(str(tmp_path / "p.duckdb")) as store:
        runs = [Pipeline("p", S).then(score).build().run({"question": "x" * i}, store=store) for i in range(5)]
        started = {r["run_id"]: r["started_at"] for r in store.runs()}
        cut = started[runs[2].run_id]
        assert store.prune(older_than=cut, dry_run=True).runs == sorted([runs[0].run_id, runs[1].run_id])
        # both given: a run must be old AND beyond the newest N
        assert store.prune(older_than=cut + timedelta(microseconds=1), keep_last=4, dry_run=True).runs == \
            [runs[0].run_id]
        assert store.prune(older_than=cut - timedelta(days=1), dry_run=True).runs == []
        report = store.prune(older_than=cut)
        assert len(report.runs) == 2 and report.rows["runs"] == 2
        assert [r["run_id"] for r in store.runs()] == [r.run_id for r in reversed(runs[2:])]
        with pytest.raises(ValueError, match="prune needs older_than"):
            store.prune()


# -- export -----------------------------------------------------------------------------------------


def test_export_writes_parquet_for_every_table(tmp_path):
    with Store(str(tmp_path / "e.duckdb")) as store:
        runs = [FLOW.run({"question": f"question {i}"}, store=store) for i in range(3)]
        store.memory.remember("ana", "likes ducks", source_run_id=runs[0].run_id)
        progress = []
        counts = store.export(str(tmp_path / "out"), progress=lambda done, total: progress.append((done, total)))
        tables = {r[0] for r in store.sql("SELECT table_name FROM information_schema.tables "
                                          "WHERE table_schema = 'main'").fetchall()}
        assert set(counts) == tables == set(store_schema.ALL_TABLES) | set(store_schema.VIEWS)
        assert progress[-1] == (len(tables), len(tables))
        for table in tables:
            file = tmp_path / "out" / f"{table}.parquet"
            assert file.exists(), table
            assert pq.read_table(file).num_rows == counts[table] == \
                store.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        assert counts["runs"] == 6 and counts["memories"] == 1 and counts["steps"] > 10
        runs_pq = pq.read_table(tmp_path / "out" / "runs.parquet")
        assert set(runs_pq.column("run_id").to_pylist()) == {r for (r,) in store.sql("SELECT run_id FROM runs").fetchall()}


# -- secrets -------------------------------------------------------------------------------------------


class Creds(BaseModel):
    question: str = ""
    token: SecretStr = SecretStr("")
    api_key: str = Field("", json_schema_extra={"secret": True})
    answer: str = ""
    derived: SecretStr = SecretStr("")


SECRET = "sk-LEAKME-7f3a9c"
MARKED = "mk-ALSOLEAK-51ab"
ENV_SECRET = "env-NEVERSTORE-02c4"


def _use_creds(s, ctx):
    assert ctx.env["KEY"] == ENV_SECRET
    s.answer = "CONTROL-SENTINEL " + s.question + " " + str(len(s.token.get_secret_value()))
    s.derived = SecretStr(s.token.get_secret_value() + "-rotated")
    s.api_key = MARKED + "-2"


def test_secrets_never_reach_the_file_or_exports(tmp_path):
    path = str(tmp_path / "s.duckdb")
    flow = Pipeline("creds", Creds).then(_use_creds).build()
    wal = b""
    for durability in ("run", "stage"):
        with Store(path, durability=durability) as store:
            run = flow.run({"question": "what", "token": SECRET, "api_key": MARKED}, store=store,
                           env={"KEY": ENV_SECRET})
            store.flush()
            if os.path.exists(path + ".wal"):  # the WAL as written, before any checkpoint
                wal += open(path + ".wal", "rb").read()
            assert SECRET not in run.input_json and SECRET not in run.output_json
            assert all(SECRET not in (w.value or "") for w in run.writes)
            rows = store.sql("SELECT input, output FROM runs").fetchall()
            assert all("hmac-sha256:" in i and "hmac-sha256:" in o for i, o in rows)
            loaded = store.run(run.run_id, scope=Creds)
            assert loaded.output.token.get_secret_value() == "<redacted>"
            store.export(str(tmp_path / f"export-{durability}"))
    # the raw bytes: data file and WAL as written, then after a checkpoint
    with Store(path) as store:
        store.sql("CHECKPOINT")
    files = glob.glob(path + "*") + glob.glob(path + ".journal/*") + glob.glob(str(tmp_path / "export-*" / "*.parquet"))
    files = [f for f in files if os.path.isfile(f)]  # the run journal's segments included
    assert any(f.endswith(".parquet") for f in files)
    blob = wal + b"".join(open(f, "rb").read() for f in files)
    assert b"CONTROL-SENTINEL" in wal and b"hmac-sha256:" in wal
    assert b"CONTROL-SENTINEL" in blob  # the scan can see plain text at all
    assert b"hmac-sha256:" in blob
    for needle in (SECRET, MARKED, ENV_SECRET, "LEAKME", "ALSOLEAK", "NEVERSTORE"):
        assert needle.encode() not in blob, needle


def test_secrets_read_by_a_decider_stay_out_of_decision_evidence():
    def route(s):
        return decide(s, [("has key", lambda v: v.api_key.startswith("mk"), "yes"),
                          ("has token", lambda v: bool(v.token.get_secret_value()), "yes")], default="no")

    def yes(s):
        return None

    def no(s):
        return None

    flow = Pipeline("creds", Creds).branch(route, {"yes": yes, "no": no}).build()
    with Store(":memory:") as store:
        flow.run({"api_key": MARKED, "token": SECRET}, store=store)
        (evidence,), = store.sql("SELECT evidence FROM decisions").fetchall()
        assert SECRET not in evidence
        assert MARKED not in evidence


def test_secret_hash_is_salted_per_store_and_stable_within_one(tmp_path):
    flow = Pipeline("creds", Creds).then(lambda s: None, id="noop").build()

    def marker(store):
        run = flow.run({"token": SECRET}, store=store)
        return json.loads(run.input_json)["token"]["$redacted"]

    with Store(str(tmp_path / "a.duckdb")) as a:
        first = marker(a)
        assert marker(a) == first
    with Store(str(tmp_path / "a.duckdb")) as a:
        assert marker(a) == first  # the salt lives in the file
    with Store(str(tmp_path / "b.duckdb")) as b:
        assert marker(b) != first


# -- conversation threads -----------------------------------------------------------------------------


class Chat(BaseModel):
    user: str = ""
    messages: list[str] = []
    reply: str = ""


def respond(s):
    s.messages.append(s.user)
    s.reply = f"reply {len(s.messages)}: " + "r" * 150
    s.messages.append(s.reply)


CHAT = Pipeline("chat", Chat).then(respond).build()


def _value_bytes(store: Store) -> int:
    return store.sql("SELECT coalesce(sum(length(value)), 0) FROM writes").fetchall()[0][0] + \
        store.sql("SELECT sum(length(input) + length(coalesce(output, ''))) FROM runs").fetchall()[0][0]


def test_conversation_thread_stores_each_message_once_and_traces_across_runs(tmp_path):
    path = str(tmp_path / "chat.duckdb")
    sizes = []
    with Store(path) as store:
        prev = None
        ids = []
        for turn in range(120):
            prev = CHAT.run({"user": f"user says {turn:04d} " + "u" * 150}, store=store, resume=prev)
            ids.append(prev.run_id)
            if turn + 1 in (40, 120):
                store.flush()
                sizes.append(_value_bytes(store))
        assert len(prev.output.messages) == 240
        # each message is stored once, in the write that appended it
        hits = store.sql("SELECT count(*) FROM writes WHERE value LIKE '%user says 0007 %'").fetchall()[0][0]
        assert hits == 1
        assert store.sql("SELECT count(*) FROM runs WHERE input LIKE '%user says 0007 %' "
                         "OR output LIKE '%user says 0007 %'").fetchall()[0][0] == 1  # its own run's input only
        assert store.sql("SELECT max(length(input)), max(length(output)) FROM runs").fetchall()[0][0] < 400
        # linear growth: 3x the turns, about 3x the bytes (quadratic would be ~9x)
        assert sizes[1] < 3.3 * sizes[0]
        assert store.sql("SELECT continues_run_id FROM runs WHERE run_id = ?", [ids[5]]).fetchall()[0][0] == ids[4]
        store.sql("CHECKPOINT")
    assert os.path.getsize(path) < 2_000_000
    with Store(path) as store:
        last = store.run(ids[-1], scope=Chat)
        assert last.output.messages == prev.output.messages
        assert last.previous().run_id == ids[-2]
        trace = store.run(ids[2], scope=Chat).backtrack("reply")
        assert set(trace.runs()) == set(ids[:3])  # the history read traces into the earlier turns
        assert "user says 0000" in trace.explain(max_lines=500)
        # and a new turn continues a loaded run by id
        nxt = CHAT.run({"user": "one more"}, store=store, resume=ids[-1])
        assert nxt.continues == ids[-1] and len(nxt.output.messages) == 242


def test_a_long_thread_replays_and_backtracks_without_recursion(tmp_path):
    """1,200 resumed runs: state_at and element backtracking from a fresh store stay iterative and fast."""
    class Long(BaseModel):
        user: str = ""
        messages: list[str] = []

    def say(s: Long) -> None:
        s.messages.append(s.user)

    flow = Pipeline("long-thread", Long).then(say).build()
    path = str(tmp_path / "long.duckdb")
    previous = None
    with Store(path) as store:
        for i in range(1200):
            previous = flow.run({"user": f"m{i}"}, resume=previous, store=store)
        assert len(previous.state_at().messages) == 1200
    with Store(path) as store:
        loaded = store.run(previous.run_id)
        assert loaded.state_at().messages[7] == "m7"
        trace = loaded.backtrack("messages[7]")
        root = trace.graph.nodes[trace.root]
        assert root["verb"] == "append" and json.loads(root["value"]) == "m7"
        assert store.run(root["run_id"]).value_at("user") == "m7"


def test_a_writable_file_checkpoints_less_often_than_duckdbs_default_and_a_memory_bulk_insert_keeps_that(
        tmp_path) -> None:
    from tracemem.store.duck import CHECKPOINT_THRESHOLD

    threshold = "SELECT current_setting('checkpoint_threshold')"
    with Store(str(tmp_path / "t.duckdb")) as store:
        assert CHECKPOINT_THRESHOLD == "64MiB"
        assert store.con.execute(threshold).fetchall()[0][0] == "64.0 MiB"
        store.memory.remember_many([{"subject": "u", "text": f"fact {i}"} for i in range(1_000)])
        assert store.con.execute(threshold).fetchall()[0][0] == "64.0 MiB"
    with Store(":memory:") as store:  # nothing to checkpoint: DuckDB's default stays
        assert store.con.execute(threshold).fetchall()[0][0] == "16.0 MiB"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_runs_row_names_the_process_that_ended_the_run_in_a_forked_child_too(tmp_path):
    """A forked child records its own pid."""
    class S(BaseModel):
        n: int = 0

    flow = Pipeline("pid", S).then(lambda s: setattr(s, "n", 1)).build()
    with Store(str(tmp_path / "pid.duckdb")) as store:
        run = flow.run({}, store=store)
        assert store.sql("SELECT pid FROM runs WHERE run_id = ?", [run.run_id]).fetchall() == [(os.getpid(),)]
    from tracemem.store.write.rows import run_row
    child = os.fork()
    if child == 0:  # the child: its runs rows carry its own pid
        os._exit(0 if run_row(flow.run({}))[11] == os.getpid() else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_tables_ctx_emit_accepts_are_the_extra_tables_the_store_has_columns_for():
    from tracemem.record import EXTRA_TABLES
    from tracemem.store.write.rows import COLUMNS
    assert set(COLUMNS) - {"runs", "steps", "writes", "reads", "decisions"} == EXTRA_TABLES
