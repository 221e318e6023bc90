"""Loading runs back a table at a time (store/read/load.py) and the claim a resume takes (store/claims.py).

A load reads each table that holds rows in its own query and sorts its rows in Python;
these tests hold it to the live runs it loads: one run, many at once (more than eight
ids, which go as one list), with subflow children, model calls and human inputs, after
a pause and a resume. A resume's claim on a DuckDB file is committed without an fsync
(store/claims.py); the file's own fsync setting is put back after it.
"""
from __future__ import annotations

import threading
from pathlib import Path

from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.models import ScriptedModel
from tracemem.run import Run
from tracemem.store import Store


class Inner(BaseModel):
    text: str = ""
    shout: str = ""


class Outer(BaseModel):
    topic: str = ""
    n: int = 0
    notes: list[str] = []
    shout: str = ""
    verdict: str = ""


def loud(s: Inner, ctx) -> None:
    s.shout = ctx.complete(ctx.env["model"], [{"role": "user", "content": s.text}]).text.upper()


def note(s: Outer, ctx) -> None:
    reply = ctx.complete(ctx.env["model"], [{"role": "user", "content": f"{s.topic} {s.n}"}])
    s.n += 1
    s.notes.append(f"{s.n}: {reply.text}")


def gate(s: Outer, ctx) -> None:
    s.verdict = str(ctx.interrupt({"notes": len(s.notes)}))


INNER = Pipeline("inner", Inner).then(loud).build()
FLOW = (Pipeline("outer", Outer).then(note).loop_to("note", when=lambda s: s.n < 4, max_iterations=10)
        .subflow(INNER, inputs={"text": "topic"}, outputs={"shout": "shout"}, id="louder")
        .then(gate).build())
ENV = {"model": ScriptedModel(default="fine")}


def same(a: Run, b: Run) -> None:
    assert (a.run_id, a.pipeline, a.pipeline_hash, a.status, a.error, a.parent_run_id, a.parent_step) == \
        (b.run_id, b.pipeline, b.pipeline_hash, b.status, b.error, b.parent_run_id, b.parent_step)
    assert (a.input_json, a.output_json, a.pending, a.resume_at, a.started_at) == \
        (b.input_json, b.output_json, b.pending, b.resume_at, b.started_at)
    assert (a.steps, a.reads, a.writes, a.decisions) == (b.steps, b.reads, b.writes, b.decisions)
    assert {t: [{k: v for k, v in r.items() if k != "started_at"} for r in rows] for t, rows in a.rows.items()} == \
        {t: [{k: v for k, v in r.items() if k != "started_at"} for r in rows] for t, rows in b.rows.items()}
    assert [c.run_id for c in a.children] == [c.run_id for c in b.children]
    for x, y in zip(a.children, b.children):
        same(x, y)


def test_one_run_and_many_at_once_load_as_the_runs_that_recorded_them(tmp_path):
    with Store(str(tmp_path / "load.duckdb")) as store:
        live = [FLOW.run({"topic": f"topic {i}"}, store=store, env=ENV) for i in range(10)]
        done = FLOW.resume(live[3].run_id, {"ok": True}, store=store, by="lead", env=ENV)
        live[3] = done
        store.flush()
        assert all(r.status == "paused" for i, r in enumerate(live) if i != 3) and done.status == "ok"
        ids = [r.run_id for r in live]
        many = store.runs_by_id(ids[::-1] + ["no-such-run"])  # more than eight ids: one list parameter
        assert list(many) == sorted(ids)
        few = store.runs_by_id(ids[:3])  # a few: one parameter each
        for run in live:
            one = store.run(run.run_id)
            assert len(run.children) == 1 and len(run.rows["model_calls"]) == 4
            same(one, many[run.run_id])
            if run.run_id in few:
                same(one, few[run.run_id])
            assert one.steps == run.steps and one.reads == run.reads and one.writes == run.writes
            assert one.decisions == run.decisions and [c.run_id for c in one.children] == \
                [c.run_id for c in run.children]
        loaded = store.run(done.run_id)
        (answer,) = loaded.rows["human_inputs"]
        assert loaded.output.verdict == "{'ok': True}" and answer["answered_by"] == "lead"
        assert [s.stage for s in loaded.steps][-3:] == ["louder", "gate", "gate"]
        assert [s.step for s in loaded.steps] == list(range(1, len(done.steps) + 1))


def test_a_resume_claims_its_run_and_leaves_the_files_fsync_setting_as_it_was(tmp_path):
    path = str(tmp_path / "claim.duckdb")
    with Store(path) as store:
        first = FLOW.run({"topic": "a"}, store=store, env=ENV)
        second = FLOW.run({"topic": "b"}, store=store, env=ENV)
        store.flush()
        done = FLOW.resume(first.run_id, "yes", store=store, env=ENV)
        assert done.ok
        assert store.con.execute("SELECT current_setting('fsync_mode')").fetchall() == [("STANDARD",)]
        store.con.execute("SET fsync_mode = 'FULL'")  # a setting the user chose is kept
        claimed = store.claim_run(second.run_id, len(second.steps))
        assert claimed == (True, "running", None, None)
        assert store.con.execute("SELECT current_setting('fsync_mode')").fetchall() == [("FULL",)]
        assert store.claim_run(second.run_id, len(second.steps))[:2] == (False, "running")  # claimed once only
        store.release_run(second.run_id, "paused")
        store.con.execute("RESET fsync_mode")
    with Store(path) as store:  # the claims reached the file
        assert dict(store.sql("SELECT run_id, status FROM runs WHERE parent_run_id IS NULL").fetchall()) == \
            {first.run_id: "ok", second.run_id: "paused"}
        assert FLOW.resume(second.run_id, "later", store=store, env=ENV).output.verdict == "later"


def test_user_sql_on_a_writable_store_waits_for_the_write_lock(tmp_path: Path) -> None:
    """The resume claim commits unsynced under the write lock (store/claims.py): a user's write statement
    through a writable store's sql() takes the same lock, so it never commits inside that window."""
    with Store(str(tmp_path / "lock.duckdb")) as store:
        store.sql("CREATE TABLE notes (n INTEGER)")
        done = threading.Event()
        with store.lock:  # what the claim holds while fsync_mode is NONE
            writer = threading.Thread(target=lambda: (store.sql("INSERT INTO notes VALUES (1)"), done.set()))
            writer.start()
            assert not done.wait(0.3)  # held back while the lock is taken
        writer.join(10)
        assert done.is_set() and store.sql("SELECT n FROM notes").fetchall() == [(1,)]
