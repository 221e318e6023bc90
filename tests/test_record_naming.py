"""A run's steps, reads and writes are recorded as plain tuples and named on first access (run.Records):
whoever reads them, whenever, sees NamedTuples, and the store records the same rows either way."""
from __future__ import annotations

import gc

from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.store import Store
from tracemem.record import Read, Step, Write
from tracemem.run import Run


class Scope(BaseModel):
    n: int = 0
    seen: list[str] = []


def _flow(peek: bool):
    def one(s):
        s.n = s.n + 1

    def two(s, ctx):
        if peek:  # the run's records read while it runs: named then, in place
            s.seen = [type(r).__name__ for r in (*ctx.run.steps, *ctx.run.reads, *ctx.run.writes)]
        s.n = s.n * 10

    def three(s):
        s.seen = s.seen + [str(s.n)]

    return Pipeline("naming", Scope).then(one).then(two).then(three).build()


def _fields(run: Run) -> tuple[list[tuple], list[tuple], list[tuple]]:
    return ([tuple(s)[:7] for s in run.steps], [tuple(r) for r in run.reads], [tuple(w) for w in run.writes])


def test_records_are_plain_tuples_until_read_then_named_in_place():
    run = _flow(peek=False).run({"n": 1})
    assert {type(r) for r in (*run.raw_steps, *run.raw_reads, *run.raw_writes)} == {tuple}
    steps, reads, writes = run.steps, run.reads, run.writes
    assert all(type(s) is Step for s in steps) and all(type(r) is Read for r in reads)
    assert all(type(w) is Write for w in writes)
    assert steps is run.raw_steps and run.reads is reads  # named in place: the same list, named once
    assert [(w.step, w.path, w.verb, w.value) for w in writes] == [(1, "n", "set", "2"), (2, "n", "set", "20"),
                                                                   (3, "seen", "set", '["20"]')]
    assert [(r.step, r.path, r.source_step) for r in reads] == [(1, "n", None), (2, "n", 1), (3, "seen", None),
                                                                (3, "n", 2)]


def test_records_named_while_the_run_runs_and_those_after_them_are_named_too(tmp_path):
    with Store(str(tmp_path / "s.duckdb"), flush_interval=0) as store:  # journaled whole, as it ends
        peeked = _flow(peek=True).run({"n": 1}, store=store)
        plain = _flow(peek=False).run({"n": 1}, store=store)
        store.flush()
        loaded = store.run(peeked.run_id)
        assert {type(r) for r in (*loaded.raw_steps, *loaded.raw_reads)} == {tuple}  # a load names them lazily too
        assert peeked.output.seen[:2] == ["Step", "Read"]  # step 1 and its read, as Step and Read then
        assert all(type(r) in (Step, Read, Write) for r in (*peeked.steps, *peeked.reads, *peeked.writes))
        assert _fields(loaded) == _fields(peeked)  # the journal took named and plain records alike
        assert [(r.step, r.path) for r in plain.reads] == [(r.step, r.path) for r in peeked.reads]
        assert type(loaded.steps[0]) is Step and loaded.steps[0].stage == peeked.steps[0].stage


def test_setting_records_takes_any_sequence_of_field_tuples():
    run = _flow(peek=False).run({})
    run.reads = ((1, 1, "n", None, None),)  # as the store writer's copy of a run holds them (a tuple)
    assert run.reads == [Read(1, 1, "n", None, None)] and type(run.reads[0]) is Read
    run.writes = [Write(1, 2, "n", "set", "3")]
    assert run.writes[0].value == "3"


def test_plain_records_are_left_alone_by_the_garbage_collector_once_looked_at():
    run = _flow(peek=False).run({"n": 1})
    gc.collect()
    assert not any(gc.is_tracked(r) for r in run.raw_reads)  # a tuple of plain values is untracked
    assert all(gc.is_tracked(r) for r in run.reads)  # a NamedTuple never is: named only when asked for
