"""A flush writes what it finds queued beside the background writer's batch in flight, on a second DuckDB
connection (Writer._write_beside); whatever fails there goes back to the queue for the drain after it."""
from __future__ import annotations

import threading
import time
from typing import Optional

import pytest
from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.errors import StoreError
from tracemem.store import Store
from tracemem.store.backlog import Backlog, Taken


class Five(BaseModel):
    a: int = 0
    b: list[int] = []


def five(s):
    s.b.extend(range(5))
    s.a = 1


FLOW = Pipeline("five", Five).then(five).build()


def held_batch(store: Store) -> tuple[threading.Event, threading.Event]:
    """Hold the background thread's next batch before it writes: (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    write = store.writer._write

    def held(taken: Taken, runs: Optional[list] = None) -> bool:
        if threading.current_thread().name == "tracemem-writer" and not entered.is_set():
            entered.set()
            assert release.wait(10)
        return write(taken, runs)
    store.writer._write = held
    return entered, release


def count_beside(store: Store, fail: bool = False) -> list[int]:
    """The sizes of the batches written beside (or, `fail`: tried beside and failed there)."""
    sizes: list[int] = []
    insert_beside = store.backend.insert_beside

    def counted(batch) -> bool:
        sizes.append(len(batch.runs))
        if fail:
            raise OSError("the second connection broke")
        return insert_beside(batch)
    store.backend.insert_beside = counted
    return sizes


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_a_flush_writes_what_is_queued_beside_the_batch_in_flight(tmp_path, durability):
    with Store(str(tmp_path / "b.duckdb"), durability=durability, flush_interval=0) as store:
        entered, release = held_batch(store)
        beside = count_beside(store)
        first = FLOW.run({}, store=store)  # the background thread takes it, and is held
        assert entered.wait(10)
        queued = [FLOW.run({}, store=store) for _ in range(3)]
        flusher = threading.Thread(target=store.flush)
        flusher.start()
        deadline = time.monotonic() + 10
        while not beside and time.monotonic() < deadline:
            time.sleep(0.01)
        assert beside == [3]  # written while the batch in flight still waits
        assert flusher.is_alive() and store.writer.pending == 0
        release.set()
        flusher.join(10)
        assert not flusher.is_alive()
        ids = {r.run_id for r in [first, *queued]}
        counts = dict(store.sql("SELECT run_id, count(*) FROM steps GROUP BY 1").fetchall())
        assert counts == {run_id: 1 for run_id in ids}
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(4,)]


def test_what_fails_beside_is_written_by_the_drain_after_it(tmp_path):
    with Store(str(tmp_path / "f.duckdb"), flush_interval=0) as store:
        entered, release = held_batch(store)
        tried = count_beside(store, fail=True)
        FLOW.run({}, store=store)
        assert entered.wait(10)
        queued = [FLOW.run({}, store=store) for _ in range(3)]
        threading.Timer(0.2, release.set).start()
        store.flush()  # raises nothing: the failure beside is not the file's
        assert tried == [3]
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(4,)]
        assert all(store.run(r.run_id).notes == [] for r in queued)


def test_no_flush_goes_beside_when_no_batch_is_in_flight(tmp_path):
    with Store(str(tmp_path / "n.duckdb"), flush_interval=3600) as store:
        beside = count_beside(store)
        for _ in range(3):
            FLOW.run({}, store=store)
        store.flush()
        assert beside == [] and store.sql("SELECT count(*) FROM runs").fetchall() == [(3,)]


def test_two_batches_can_be_out_at_once_and_a_put_back_keeps_the_files_failure():
    backlog = Backlog(max_cost=10**9, batch_cost=2, max_lag=3600)
    runs = [FLOW.run({}) for _ in range(4)]
    for run in runs:
        backlog.put(run, 1)
    first, second = backlog.take(), backlog.take()
    assert first.runs == runs[:2] and second.runs == runs[2:] and len(backlog) == 0
    assert backlog.status().oldest_age_s > 0  # the oldest of the batches out
    failure = StoreError("disk full")
    backlog.put_back(first, first.runs, failure)
    backlog.put_back(second, second.runs, None)  # (a failure beside is not news about the file)
    assert backlog.failure is failure and len(backlog) == 4
    again = backlog.take(), backlog.take()
    assert [r for taken in again for r in taken.runs] == [*runs[2:], *runs[:2]]  # each put back at the front
    backlog.written(again[0])
    backlog.written(again[1])
    assert backlog.failure is None and backlog.status().oldest_age_s == 0


def test_a_flush_that_finds_the_queue_taken_meanwhile_writes_nothing_beside(tmp_path, monkeypatch):
    with Store(str(tmp_path / "r.duckdb"), flush_interval=0) as store:
        entered, release = held_batch(store)
        beside = count_beside(store)
        FLOW.run({}, store=store)
        assert entered.wait(10)
        FLOW.run({}, store=store)
        # between the flush's look at the queue and its take, the background thread took the run
        monkeypatch.setattr(store.writer.backlog, "take", lambda upto=None: Taken([], [], 0.0, 0.0))
        store.writer._write_beside()
        monkeypatch.undo()
        assert beside == [] and store.writer.pending == 1
        release.set()
        store.flush()
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(2,)]
