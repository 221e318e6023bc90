"""Runs journaled whole are folded into the tables by SQL from their journal entries (store/entry_fold.py):
what lands in every table is exactly what the Python way (store/batch.py) writes for the same runs, a
batch SQL cannot fold is written the Python way instead, and the writer's copy of such a run keeps no
records of its own."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.run import Run
from tracemem.store import Store
from tracemem.store.backlog import queued, restored
from tracemem.store.batch import COLUMNS, Batch
from tracemem.store.entry_fold import statements
from tracemem.store.threads import replayed


class Q(BaseModel):
    score: int = 0
    question: str = ""
    answer: str = ""
    facts: list[str] = []


class Sub(BaseModel):
    out: str = ""
    text: str = ""


def recall(s, ctx):
    ctx.emit("memory_uses", memory_id="m-1", outcome="injected", reason="confident \"quoted\"", score=0.75, rank=1)
    ctx.log("looked it up: héllo ✓ 😀 \\ back\\slash\nnew line\ttab \x00 nul")
    s.facts.append("ana likes ducks — ünïcode")
    s.score = len(s.question)


def route(s):
    return "answer" if s.score < 12 else "refuse"


def answer(s):
    s.answer = f"{s.question} -> {s.facts[0]}"


def refuse(s, ctx):
    ctx.degrade("the question was too long")
    s.answer = "no"


def shout(s):  # the subflow's one stage
    s.out = f"{s.text.upper()}!"


def explode(s):
    raise ValueError("the model returned nonsense: ∅ «quotes» 'single'")


AGENT = Pipeline("agent", Q).then(recall).branch(route, {"answer": answer, "refuse": refuse}).build()
NESTED = Pipeline("outer", Q).then(recall).subflow(
    Pipeline("inner", Sub).then(shout).build(), inputs={"text": "question"}, outputs={"answer": "out"}).build()
BROKEN = Pipeline("broken", Q).then(recall).then(explode).build()


def _record(store: Store, durability: str) -> list[Run]:
    """Varied runs into `store`, most with `durability`, one with the other: every Run returned (and the
    subflow's child run)."""
    runs = [AGENT.run({"question": question}, store=store, durability=durability)
            for question in ("short", "a question far too long", "ünï ✓")]
    runs.append(NESTED.run({"question": "quack"}, store=store, durability=durability))
    runs.append(runs[-1].children[0])
    runs.append(BROKEN.run({"question": "q"}, store=store, raise_on_error=False, durability=durability))
    runs.append(AGENT.run({"question": "other"}, store=store, durability="stage" if durability == "run" else "run"))
    store.flush()
    return runs


def _tables(store: Store) -> dict[str, list[tuple]]:
    return {t: store.sql(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in COLUMNS if t != "run_embeddings"}


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_a_folded_run_is_stored_exactly_as_the_python_way_stores_it(tmp_path, durability):
    with Store(str(tmp_path / "fold.duckdb")) as folded:
        folds = []
        sql = folded.backend.fold.sql
        folded.backend.fold.sql = lambda *args: (folds.append(1), sql(*args))[1]
        runs = _record(folded, durability)
        assert folds, "the batches were not folded from the journal"
        assert [r.status for r in runs].count("failed") == 1 and any(r.parent_run_id for r in runs)
        with Store(str(tmp_path / "python.duckdb")) as python:
            batch = Batch(folded.writer.lease)
            for run in runs:
                batch.add_run(run)
            python.writer.write_now(batch)
            want, got = _tables(python), _tables(folded)
    assert want["steps"] and want["reads"] and want["writes"] and want["decisions"] and want["memory_uses"]
    for table in want:
        assert got[table] == want[table], table


def test_a_batch_sql_cannot_fold_is_written_the_python_way(tmp_path):
    def cut(s, ctx):
        ctx.log("line \ud83d")  # a lone surrogate: JSON that DuckDB's parser refuses

    bad = Pipeline("cut", Q).then(cut).build()
    with Store(str(tmp_path / "q.duckdb")) as store:
        good = [AGENT.run({"question": f"q{i}"}, store=store) for i in range(3)]
        run = bad.run({}, store=store)
        after = AGENT.run({"question": "after"}, store=store)
        store.flush()
        counts = dict(store.sql("SELECT run_id, count(*) FROM steps GROUP BY 1").fetchall())
        assert counts == {r.run_id: len(r.steps) for r in [*good, run, after]}
        assert store.sql("SELECT logs FROM steps WHERE run_id = ?", [run.run_id]).fetchall() == [(["line \\ud83d"],)]
        assert any("lone surrogates" in note for note in store.run(run.run_id).notes)
        assert all(store.run(r.run_id).notes == [] for r in [*good, after])


@pytest.mark.parametrize("durability,stages", [("run", 1), ("stage", 3)])  # one entry per run, or per stage
def test_the_writers_copy_of_a_journaled_run_keeps_only_its_entries(tmp_path, durability, stages):
    with Store(str(tmp_path / "q.duckdb")) as store:
        kept: list[Run] = []
        enqueue = store.writer.enqueue
        store.writer.enqueue = lambda run, cost=None: (kept.append(run), enqueue(run, cost))[1]
        run = AGENT.run({"question": "short"}, store=store, durability=durability)
        store.flush()
    copy = kept[0]
    assert copy.steps == copy.reads == copy.writes == () and [type(e) for e in copy.entries] == [bytes] * stages
    assert copy.notes is run.notes and copy.rows is run.rows  # what the writer notes reaches the caller's Run
    back = restored(queued(run, copy.entries))
    assert back.entries == ()
    assert [tuple(x) for x in back.steps] == [tuple(x) for x in run.steps]
    assert [tuple(x) for x in back.reads] == [tuple(x) for x in run.reads]
    assert [tuple(x) for x in back.writes] == [tuple(x) for x in run.writes]


@pytest.mark.parametrize("table", ["runs", "steps", "reads", "writes"])
def test_the_fold_inserts_every_given_column(table):
    sql = statements()[table]
    names = sql[sql.index("(") + 1:sql.index(")")].split(", ")
    assert set(names) == {c for c, _ in COLUMNS[table]}


def test_a_stage_run_partly_written_before_it_ended_is_written_the_rest_of_the_way(tmp_path):
    with Store(str(tmp_path / "fold.duckdb"), durability="stage") as folded:
        def look(s, ctx):  # a query mid-run writes the finished stages (Writer.materialize)
            s.facts = [str(folded.sql("SELECT count(*) FROM steps WHERE run_id = ?", [ctx.run_id]).fetchall())]

        run = Pipeline("look", Q).then(recall).then(look).then(answer).build().run({"question": "q"}, store=folded)
        folded.flush()
        with Store(str(tmp_path / "python.duckdb")) as python:
            batch = Batch(folded.writer.lease)
            batch.add_run(run)
            python.writer.write_now(batch)
            want, got = _tables(python), _tables(folded)
    assert [row[1] for row in got["steps"]] == [1, 2, 3]
    assert [w[-1] for w in got["writes"] if w[1] == 2] == ['["[(1,)]"]']  # the mid-run query saw one finished stage
    for table in want:
        assert got[table] == want[table], table


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_a_thread_state_kept_as_journal_entries_is_the_state_a_replay_gives(tmp_path, durability):
    with Store(str(tmp_path / "t.duckdb"), durability=durability) as store:
        first = AGENT.run({"question": "short"}, store=store)
        second = AGENT.run({"question": "a question far too long"}, store=store, resume=first.run_id)
        third = BROKEN.run({"question": "q"}, store=store, resume=second.run_id, raise_on_error=False)
        assert all(type(store.threads.ended[r.run_id][0].writes[0]) is bytes for r in (first, second, third))
        store.flush()
        for run in (second, third):
            kept = store.threads.known(run.run_id)
            assert kept is not None and kept.data == replayed(store.con, run.run_id, store.path).data
        assert store.threads.known(third.run_id).data["facts"] == ["ana likes ducks — ünïcode"] * 3


def test_a_batch_of_journaled_runs_is_one_call_to_duckdb(tmp_path):
    """Each call hands the GIL away and waits to get it back (bench/writer_gil.py): the transaction, the fold and
    the commit go in one."""
    with Store(str(tmp_path / "one.duckdb"), flush_interval=3600) as store:  # (the background thread waits)
        runs = [AGENT.run({"question": f"it's q{i}"}, store=store) for i in range(3)]
        queued_runs = store.writer.backlog.take(None).runs
        assert [r.run_id for r in queued_runs] == [r.run_id for r in runs]
        batch = Batch(store.writer.lease)
        for run in queued_runs:
            batch.add_journaled(run, whole=True)
        calls: list[str] = []

        class Counting:  # the connection, counting what is sent to it
            def __getattr__(self, name: str):
                calls.append(name)
                return getattr(store.backend.writer_con, name)
        batch.insert(Counting(), store.backend.fold)
        assert calls == ["execute"]
        assert store.sql("SELECT count(*) FROM runs WHERE input LIKE '%it''s q%'").fetchall() == [(3,)]


def test_the_fold_sql_of_no_entries_folds_nothing(tmp_path):
    with Store(str(tmp_path / "e.duckdb")) as store:
        store.backend.writer_con.execute(store.backend.fold.sql([], "BEGIN TRANSACTION; ", "COMMIT"))
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(0,)]
