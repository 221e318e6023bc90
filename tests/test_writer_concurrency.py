"""The writer beside user threads: it has its own connection, so nothing a user does through the store's
public ways in (sql, run, runs, thread, memory search, claims, `store.con`) can make a batch fail, and a
momentary failure of its own (a write conflict, a dropped PostgreSQL session, a commit whose answer was
lost) is retried with every record kept, and never writes a run twice. A data error still degrades the run
it belongs to, saying why. Both backends: a DuckDB file on disk, a real PostgreSQL server."""
from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
from pydantic import BaseModel

from pg_fixtures import pg_server, pg_url, store_factory  # noqa: F401
from tracemem import Pipeline, TracememError
from tracemem.models import ScriptedModel


class Chat(BaseModel):
    question: str = ""
    answer: str = ""
    turns: list[str] = []
    verdict: str = ""


def ask(s: Chat, ctx: Any) -> None:
    ctx.log(f"asking {s.question}")
    s.answer = ctx.complete(ctx.env["model"], [{"role": "user", "content": s.question}]).text
    s.turns.append(s.question)


def check(s: Chat, ctx: Any) -> None:
    ctx.emit("prompts", prompt_id=f"p-{ctx.run_id}", text=f"check {s.answer}")
    s.verdict = "fine" if s.answer else "empty"


def gate(s: Chat, ctx: Any) -> None:
    s.verdict = str(ctx.interrupt({"answer": s.answer}))


ONE = Pipeline("one", Chat, query="question").then(ask).build()
TWO = Pipeline("two", Chat, query="question").then(ask).then(check).build()
PAUSING = Pipeline("pausing", Chat).then(ask).then(gate).build()
ENV = {"model": ScriptedModel(default="an answer")}


def _counts(store: Any, table: str) -> dict[str, int]:
    return dict(store.sql(f"SELECT run_id, count(*) FROM {table} GROUP BY run_id").fetchall())


def _whole(store: Any, runs: list[Any]) -> None:
    """Every run once in `runs`, with all its steps, reads, writes, model calls and prompts, and no note
    of a loss."""
    rows = store.sql("SELECT run_id, count(*) FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
                     "GROUP BY run_id", [[r.run_id for r in runs]]).fetchall()
    assert sorted(n for _, n in rows) == [1] * len(runs)  # every run, once
    steps, reads, writes = _counts(store, "steps"), _counts(store, "reads"), _counts(store, "writes")
    calls, prompts = _counts(store, "model_calls"), _counts(store, "prompts")
    for run in runs:
        assert steps.get(run.run_id) == len(run.steps), run.pipeline
        assert reads.get(run.run_id, 0) == len(run.reads) and writes.get(run.run_id, 0) == len(run.writes)
        assert calls.get(run.run_id) == 1
        assert prompts.get(run.run_id, 0) == (1 if run.pipeline == "two" else 0)
    notes = store.sql("SELECT notes FROM runs WHERE notes IS NOT NULL AND run_id IN "
                      "(SELECT unnest(?::VARCHAR[]))", [[r.run_id for r in runs]]).fetchall()
    assert notes == []


def test_every_public_way_in_from_user_threads_loses_and_duplicates_nothing(store_factory):
    store = store_factory()
    store.memory.remember("dana", "dana prefers short answers")
    paused = [PAUSING.run({"question": f"p{i}"}, store=store, env=ENV) for i in range(3)]
    first = ONE.run({"question": "first"}, store=store, env=ENV)
    store.flush()
    store.con.execute("CREATE TABLE mine (n INTEGER)")
    stop = threading.Event()
    failures: list[BaseException] = []
    calls = {"sql": 0, "run": 0, "runs": 0, "thread": 0, "search": 0, "claims": 0, "con": 0}

    def claims() -> None:
        for run in paused:
            won = store.claim_run(run.run_id, len(run.steps))
            assert won[0], won
            store.release_run(run.run_id, "paused")

    def con() -> None:
        mine = store.con  # this thread's own connection
        mine.execute("INSERT INTO mine VALUES (?)", [calls["con"]])
        assert mine.execute("SELECT count(*) FROM runs").fetchall()[0][0] >= 4

    ways: dict[str, Callable[[], Any]] = {
        "sql": lambda: store.sql("SELECT count(*) FROM steps").fetchall(),
        "run": lambda: store.run(first.run_id),
        "runs": lambda: store.runs(limit=5),
        "thread": lambda: store.thread(first.run_id),
        "search": lambda: store.memory.search("dana", "short answers"),
        "claims": claims,
        "con": con,
    }

    def user(name: str) -> None:
        while not stop.is_set():
            try:
                ways[name]()
                calls[name] += 1
            except BaseException as err:  # noqa: BLE001 - every failure is the test's to report
                failures.append(err)
                return

    threads = [threading.Thread(target=user, args=(name,)) for name in ways]
    for t in threads:
        t.start()
    try:
        runs = [(TWO if i % 3 else ONE).run({"question": f"q{i}"}, store=store, env=ENV) for i in range(400)]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    store.flush()
    assert failures == []
    assert all(calls.values()), calls  # every way in was used while the runs were written
    _whole(store, [first, *runs])
    assert store.sql("SELECT count(*) FROM mine").fetchall() == [(calls["con"],)]
    assert {store.run(p.run_id).status for p in paused} == {"paused"}


def _insert_then(store: Any, error: BaseException) -> list[int]:
    """Make the store's next batch commit and then raise `error`, as when the answer to a COMMIT is lost;
    returns the list that counts the batches written."""
    insert = store.backend.writes.insert
    written: list[int] = []

    def lost_answer(batch: Any) -> None:
        insert(batch)
        written.append(len(batch.rows["runs"]) + len(batch.finished))
        if len(written) == 1:
            raise error

    store.backend.writes.insert = lost_answer
    return written


def _momentary_error(kind: str) -> BaseException:
    if kind == "duckdb":
        import duckdb

        return duckdb.ResourceInUseException("connection is busy with another call")
    import psycopg

    from tracemem.store.pg.connection import PgError

    err = PgError("server closed the connection unexpectedly")
    err.__cause__ = psycopg.OperationalError("server closed the connection unexpectedly")
    return err


def test_a_batch_whose_commit_answer_was_lost_is_never_written_again(store_factory):
    store = store_factory(flush_interval=600)
    runs = [TWO.run({"question": f"q{i}"}, store=store, env=ENV) for i in range(5)]
    written = _insert_then(store, _momentary_error(store_factory.kind))
    store.flush()
    assert written[0] > 0 and len(written) == 1  # committed once; the retry found every run written
    _whole(store, runs)


def test_dropped_writer_and_journal_sessions_are_retried_and_the_runs_written_whole(store_factory, pg_url):
    if store_factory.kind != "postgres":
        pytest.skip("a PostgreSQL session; the DuckDB counterpart is the write conflict below")
    store = store_factory(flush_interval=600)
    runs = [TWO.run({"question": f"q{i}"}, store=store, env=ENV) for i in range(5)]
    pids = [con.raw.info.backend_pid for con in (store.backend.writes.con, store.backend.writes.journal.con)]
    for pid in pids:  # what a server restart does to the sessions of the writer and of the journal rows
        store.con.execute("SELECT pg_terminate_backend(?)", [pid])
    runs += [TWO.run({"question": f"after {i}"}, store=store, env=ENV) for i in range(3)]  # journaled anew
    store.flush()
    assert store.backend.writes.con.raw.info.backend_pid != pids[0]  # a new session wrote them
    assert store.backend.writes.journal.con.raw.info.backend_pid != pids[1]
    _whole(store, runs)


def test_a_write_conflict_is_retried_and_the_resumed_run_written_whole(tmp_path):
    from tracemem.store import Store

    with Store(str(tmp_path / "conflict.duckdb"), flush_interval=600) as store:
        paused = PAUSING.run({"question": "q"}, store=store, env=ENV)
        store.flush()
        done = PAUSING.resume(paused.run_id, "approved", store=store, env=ENV)  # its end: an UPDATE of its row
        mine = store.con
        mine.execute("BEGIN TRANSACTION")
        mine.execute("UPDATE runs SET notes = ['mine'] WHERE run_id = ?", [done.run_id])  # uncommitted
        retried = threading.Event()
        reset = store.backend.writes.reset

        def resetting() -> None:  # the writer's connection is made sound again after each momentary failure
            retried.set()
            reset()

        store.backend.writes.reset = resetting
        flushing = threading.Thread(target=store.flush)
        flushing.start()
        assert retried.wait(30)  # the writer met the conflict and waits to try again
        mine.execute("ROLLBACK")
        flushing.join(30)
        assert not flushing.is_alive()
        loaded = store.run(done.run_id)
        assert loaded.status == "ok" and loaded.output.verdict == "approved"
        assert len(loaded.steps) == len(done.steps) and not loaded.notes


def test_a_data_error_still_degrades_only_its_run_and_says_why(store_factory):
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

        __repr__ = __str__

    def odd(s: Chat, ctx: Any) -> None:
        ctx.emit("model_calls", model="m", response=Unprintable())
        s.answer = "odd"

    store = store_factory()
    bad = Pipeline("odd", Chat).then(odd).build().run({}, store=store)
    good = [TWO.run({"question": f"q{i}"}, store=store, env=ENV) for i in range(3)]
    with pytest.raises(TracememError, match=rf"run {bad.run_id} of 'odd'.* written without its model_calls"):
        store.flush()
    _whole(store, good)
    loaded = store.run(bad.run_id)
    assert loaded.output.answer == "odd" and "no text for you" in loaded.notes[0]


def test_what_fails_after_a_batch_committed_is_said_and_never_writes_the_batch_again(store_factory):
    store = store_factory(flush_interval=600)
    runs = [TWO.run({"question": f"q{i}"}, store=store, env=ENV) for i in range(4)]
    told = store.writer.on_written

    def failing_once(batch: Any) -> None:  # e.g. the store's growth check, on a connection interrupted meanwhile
        store.writer.on_written = told
        raise RuntimeError("after the commit")

    store.writer.on_written = failing_once
    with pytest.raises(TracememError, match="after the commit"):
        store.flush()
    store.flush()  # said once
    _whole(store, runs)  # once each, not degraded: what failed came after the commit


def test_an_interrupt_in_a_flush_leaves_the_runs_queued_not_degraded(store_factory):
    store = store_factory(flush_interval=600)
    runs = [TWO.run({"question": f"q{i}"}, store=store, env=ENV) for i in range(4)]
    insert = store.backend.writes.insert

    def interrupted(batch: Any) -> None:
        store.backend.writes.insert = insert
        raise KeyboardInterrupt

    store.backend.writes.insert = interrupted
    with pytest.raises(KeyboardInterrupt):
        store.flush()
    store.flush()
    _whole(store, runs)
