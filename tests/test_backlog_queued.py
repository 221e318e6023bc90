"""The backlog keeps a copy of each finished run whose records are plain tuples (store/backlog.py `queued`).

Why: the garbage collector stops tracking a tuple of plain values, never a NamedTuple, so
a backlog of waiting runs would otherwise hand every collection ~50 records per run to
walk. The caller's Run must not notice: its records stay Step/Read/Write, and what the
writer notes on the copy (a value it had to change) reaches the caller's Run.
"""
from __future__ import annotations

import gc

from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.record import Read, Step, Write
from tracemem.store import Store
from tracemem.store.backlog import queued


class Scope(BaseModel):
    x: int = 0
    y: int = 0
    note: str = ""


def _flow():
    def one(s):
        s.y = s.x + 1

    def two(s):
        s.note = f"y={s.y}"

    return Pipeline("queued", Scope).then(one).then(two).build()


def test_the_copy_holds_plain_tuples_that_the_collector_stops_tracking():
    run = _flow().run({"x": 1})
    kept = queued(run)
    assert kept.run_id == run.run_id and kept.notes is run.notes and kept.rows is run.rows
    records = (kept.raw_steps, kept.raw_reads, kept.raw_writes)  # (what the writer reads: `reads` would name them)
    assert [type(r) for r in sum(records, ())] == [tuple] * (len(run.steps) + len(run.reads) + len(run.writes))
    assert kept.raw_steps == tuple(map(tuple, run.steps)) and kept.raw_writes == tuple(map(tuple, run.writes))
    gc.collect()
    gc.collect()  # a tuple is untracked once a collection finds its items untracked: the outer ones next time
    containers = [*records, kept.decisions, kept.children, kept.links]
    assert not any(gc.is_tracked(r) for r in [*containers, *sum(records, ())])
    assert all(gc.is_tracked(s) for s in run.steps)  # NamedTuples: tracked for as long as they live
    assert isinstance(run.steps[0], Step) and isinstance(run.reads[0], Read) and isinstance(run.writes[0], Write)


def test_the_copy_leaves_the_final_state_to_the_callers_run():
    run = _flow().run({"x": 1})
    kept = queued(run)
    assert run.output == Scope(x=1, y=2, note="y=2")  # the caller's, as it was
    assert kept.output_json == run.output_json  # what the writer stores
    assert not any(isinstance(v, Scope) for v in gc.get_referents(kept.__dict__))  # no final state object held
    assert kept.without is run.without is _flow().run({}).without  # a run leaving nothing out: one shared set


def test_the_caller_keeps_its_records_and_learns_the_writers_notes(tmp_path):
    def cut(s, ctx):
        ctx.log("line \ud83d")  # a lone surrogate: the writer stores it escaped and notes that on the run

    flow = Pipeline("cut", Scope).then(cut).build()
    with Store(str(tmp_path / "q.duckdb")) as store:
        run = flow.run({}, store=store)
        store.flush()
        assert isinstance(run.steps[0], Step) and run.steps[0].logs == ("line \ud83d",)
        assert any("steps.logs of step 1: lone surrogates" in note for note in run.notes), run.notes
        assert store.run(run.run_id).notes == run.notes
