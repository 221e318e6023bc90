"""Durability and concurrency of the store: a killed process, many threads, a second process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import duckdb
import pytest
from pydantic import BaseModel

from tracemem import Pipeline, TracememError
from tracemem.store import Store, StoreLockedError

CHILD_PRELUDE = """
import os, sys, time
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.store import Store

path, marker, durability = sys.argv[1], sys.argv[2], sys.argv[3]

class S(BaseModel):
    a: int = 0
    b: str = ""
    c: list[str] = []

def one(s):
    s.a = s.a + 1

def two(s):
    s.b = "two:" + str(s.a)
    s.c.append("x")

def three(s, ctx):
    s.a = 3  # in flight when the process dies: never recorded
    with open(marker + ".tmp", "w") as f:
        f.write(ctx.run_id)
    os.replace(marker + ".tmp", marker)
    time.sleep(120)

def four(s):
    s.b = "four"
"""


def _spawn(tmp_path, body: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD_PRELUDE) + textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_for(proc: subprocess.Popen, marker: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(marker):
        if proc.poll() is not None:
            raise AssertionError(f"child exited early ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("child never reached the marker")
        time.sleep(0.02)
    with open(marker) as f:
        return f.read()


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


KILL_BODY = """
store = Store(path, durability=durability)
done = Pipeline("warmup", S).then(one).then(two).build().run({"a": 10}, store=store)
store.flush()
Pipeline("crashy", S).then(one).then(two).then(three).then(four).build().run({"a": 1}, store=store)
"""


def test_sigkill_mid_run_keeps_finished_stages_under_stage_durability(tmp_path):
    path, marker = str(tmp_path / "crash.duckdb"), str(tmp_path / "in-three")
    proc = _spawn(tmp_path, KILL_BODY, path, marker, "stage")
    run_id = _wait_for(proc, marker)
    _kill(proc)

    with Store(path) as store:
        assert store.interrupted == [run_id]
        (status, error), = store.sql("SELECT status, error FROM runs WHERE run_id = ?", [run_id]).fetchall()
        assert status == "interrupted" and "process ended" in error
        steps = store.sql("SELECT step, stage, status FROM steps WHERE run_id = ? ORDER BY step", [run_id]).fetchall()
        assert steps == [(1, "one", "ok"), (2, "two", "ok")]  # every finished stage; not the one in flight
        writes = store.sql("SELECT step, path, verb, value FROM writes WHERE run_id = ? ORDER BY step, seq",
                           [run_id]).fetchall()
        assert writes == [(1, "a", "set", "2"), (2, "b", "set", '"two:2"'), (2, "c", "append", '"x"')]
        assert store.sql("SELECT count(*) FROM reads WHERE run_id = ?", [run_id]).fetchall()[0][0] >= 3
        run = store.run(run_id)
        assert run.status == "interrupted" and run.state_at() == {"a": 2, "b": "two:2", "c": ["x"]}
        assert run.backtrack("b").missing is None and "run input" in run.backtrack("b").explain()
        warm = store.runs(pipeline="warmup")
        assert len(warm) == 1 and warm[0]["status"] == "ok" and warm[0]["steps"] == 2
    with Store(path) as store:  # marked once, and it stays marked
        assert store.interrupted == []
        assert store.runs(status="interrupted")[0]["run_id"] == run_id


def test_sigkill_mid_run_under_run_durability_never_leaves_half_a_run(tmp_path):
    path, marker = str(tmp_path / "crash.duckdb"), str(tmp_path / "in-three")
    proc = _spawn(tmp_path, KILL_BODY, path, marker, "run")
    run_id = _wait_for(proc, marker)
    _kill(proc)
    with Store(path) as store:
        assert store.interrupted == []
        assert [r["pipeline"] for r in store.runs()] == ["warmup"]  # the flushed run is whole
        for table in ("runs", "steps", "writes", "reads"):
            assert store.sql(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0] == 0


class T(BaseModel):
    n: int = 0
    seen: int = -1
    log: list[str] = []


def test_stage_durability_puts_each_stage_in_the_file_before_the_next_starts(tmp_path):
    def first(s):
        s.n = 1
        s.log.append("first")

    def peek(s, ctx):
        s.seen = ctx.store.sql("SELECT count(*) FROM steps WHERE run_id = ?", [ctx.run_id]).fetchall()[0][0]

    flow = Pipeline("peek", T).then(first).then(peek).build()
    with Store(str(tmp_path / "d.duckdb"), durability="stage") as store:
        assert flow.run({}, store=store).output.seen == 1
        assert flow.run({}, store=store, durability="run").output.seen == 0  # per-run override
        assert store.sql("SELECT status FROM runs ORDER BY started_at").fetchall() == [("ok",), ("ok",)]
    with Store(str(tmp_path / "e.duckdb")) as store:
        assert flow.run({}, store=store).output.seen == 0
        assert flow.run({}, store=store, durability="stage").output.seen == 1
        with pytest.raises(TracememError, match="durability must be 'run' or 'stage'"):
            flow.run({}, store=store, durability="sometimes")


def test_fsync_stage_durability_syncs_each_stage_before_the_next_and_n_stages_take_n_syncs(tmp_path, monkeypatch):
    syncs: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    seen: list[int] = []

    def stage(s):  # how many syncs the journal made before this stage ran
        seen.append(len(syncs))
        s.n += 1

    flow = Pipeline("synced", T).then(stage, id="a").then(stage, id="b").then(stage, id="c").build()
    with Store(str(tmp_path / "f.duckdb"), durability="stage", fsync=True) as store:
        syncs.clear()
        assert flow.run({}, store=store).output.n == 3
        # the run's start rides with its first stage's sync, its last stage with its end's
        assert seen == [0, 1, 2] and len(syncs) == 3
        assert store.sql("SELECT count(*) FROM steps").fetchall() == [(3,)]


def test_a_run_with_bad_rows_never_blocks_the_others():
    def bad(s, ctx):
        ctx.emit("model_calls", model="m", input_tokens="lots")  # not an integer: stored NULL, and noted
        ctx.emit("model_calls", model="m", output_tokens=10**12)  # out of range for INTEGER: likewise
        s.n = 1

    for durability in ("run", "stage"):
        with Store(":memory:", durability=durability) as store:
            run = Pipeline("bad", T).then(bad).then(bump).build().run({}, store=store)
            store.flush()  # nothing was lost, so nothing to raise
            good = THREADED.run({}, store=store)
            assert {r["run_id"] for r in store.runs()} == {run.run_id, good.run_id}
            loaded = store.run(run.run_id)
            assert [s.stage for s in loaded.steps] == ["bad", "bump"] and loaded.state_at().n == 2
            assert store.sql("SELECT model, input_tokens, output_tokens FROM model_calls").fetchall() == [
                ("m", None, None), ("m", None, None)]
            assert any("model_calls.input_tokens of step 1: 'lots' is not a whole number; stored NULL" in n
                       for n in loaded.notes), loaded.notes
            assert any("model_calls.output_tokens of step 1: 1000000000000 is out of range" in n
                       for n in loaded.notes), loaded.notes
            assert store.run(good.run_id).notes == []


class BrokenEmbedder:
    embedder_id = "broken"
    dim = 8

    def embed(self, texts):
        raise RuntimeError("embedding service down")


class Asked(BaseModel):
    question: str = ""
    n: int = 0


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_a_failing_snapshot_embedder_never_costs_the_run(durability):
    flow = Pipeline("asked", Asked, query="question").then(lambda s: setattr(s, "n", 1), id="work").build()
    with Store(":memory:", durability=durability, snapshot_embedder=BrokenEmbedder()) as store:
        run = flow.run({"question": "why?"}, store=store)
        with pytest.raises(TracememError, match="without its query embedding.*embedding service down"):
            store.flush()
        (row,) = store.runs()
        assert row["run_id"] == run.run_id and row["status"] == "ok" and row["steps"] == 1
        assert store.sql("SELECT count(*) FROM run_embeddings").fetchall()[0][0] == 0


def test_queued_runs_are_written_when_the_process_exits_without_close(tmp_path):
    path, marker = str(tmp_path / "exit.duckdb"), str(tmp_path / "unused")
    proc = _spawn(tmp_path, """
        store = Store(path, flush_interval=60)  # nothing would be written by the timer
        flow = Pipeline("quick", S).then(one).then(two).build()
        for i in range(50):
            flow.run({"a": i}, store=store)
        print("done")
    """, path, marker, "run")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == "done" and err == ""
    with Store(path, read_only=True) as store:
        assert store.sql("SELECT count(*) FROM runs WHERE status = 'ok'").fetchall()[0][0] == 50
        assert store.sql("SELECT count(*) FROM steps").fetchall()[0][0] == 100


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_keyboard_interrupt_records_the_run_as_interrupted_with_its_finished_steps(tmp_path, durability):
    def stop(s):
        raise KeyboardInterrupt

    flow = Pipeline("stopped", T).then(bump).then(stop).then(bump, id="never").build()
    with Store(str(tmp_path / "k.duckdb"), durability=durability) as store:
        with pytest.raises(KeyboardInterrupt):
            flow.run({"n": 5}, store=store)
        (row,) = store.runs()
        assert row["status"] == "interrupted" and "KeyboardInterrupt" in row["error"]
        run = store.run(row["run_id"])
        assert [s.stage for s in run.steps if s.status == "ok"] == ["bump"] and run.state_at().n == 6


# -- threads ------------------------------------------------------------------------------------


def bump(s):
    s.n = s.n + 1
    s.log.append(str(s.n))


def route(s):
    return "even" if s.n % 2 == 0 else "odd"


def even(s):
    s.seen = 0


def odd(s):
    s.seen = 1


THREADED = Pipeline("threaded", T).then(bump).branch(route, {"even": even, "odd": odd}).build()


@pytest.mark.parametrize("durability,runs_n", [
    ("run", 200),
    ("stage", 15),  # every stage is its own commit (~3 ms each on a file): the full size is slow
    pytest.param("stage", 200, marks=pytest.mark.slow),
])
def test_eight_threads_two_hundred_runs_each_lose_nothing(tmp_path, durability, runs_n):
    path = str(tmp_path / "threads.duckdb")
    threads_n = 8
    errors: list[BaseException] = []
    ids: list[list[str]] = [[] for _ in range(threads_n)]
    with Store(path, durability=durability) as store:
        barrier = threading.Barrier(threads_n)

        def work(t: int) -> None:
            try:
                barrier.wait()
                for i in range(runs_n):
                    ids[t].append(THREADED.run({"n": t * 1000 + i}, store=store, subject=f"t{t}").run_id)
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors
    total = threads_n * runs_n
    with Store(path, read_only=True) as store:
        def count(q):
            return store.sql(q).fetchall()[0][0]

        assert count("SELECT count(*) FROM runs") == count("SELECT count(DISTINCT run_id) FROM runs") == total
        assert {r for (r,) in store.sql("SELECT run_id FROM runs").fetchall()} == {i for t in ids for i in t}
        assert count("SELECT count(*) FROM runs WHERE status = 'ok' AND ended_at IS NOT NULL") == total
        assert count("SELECT count(*) FROM steps") == 3 * total
        assert count("SELECT count(*) FROM writes") == 3 * total  # n, log append, seen
        assert count("SELECT count(*) FROM reads") == 4 * total  # n, log (bump); n (route); none (even/odd)
        assert count("SELECT count(*) FROM decisions") == total
        assert count("SELECT count(DISTINCT subject) FROM runs") == threads_n
        # each thread's runs carry their own inputs: nothing crossed between threads
        assert count("SELECT count(*) FROM runs WHERE (input->>'n')::INT // 1000 != "
                     "substr(subject, 2)::INT") == 0
        assert count("SELECT count(*) FROM decisions d JOIN runs r USING (run_id) "
                     "WHERE d.chosen != CASE WHEN ((r.input->>'n')::INT + 1) % 2 = 0 THEN 'even' ELSE 'odd' END") == 0


# -- a second process ------------------------------------------------------------------------------


HOLD_BODY = """
store = Store(path)
flow = Pipeline("held", S).then(one).then(two).build()
for i in range(3):
    flow.run({"a": i}, store=store)
store.flush()
with open(marker + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(marker + ".tmp", marker)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def held_store(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("held")
    path, marker = str(tmp_path / "held.duckdb"), str(tmp_path / "ready")
    proc = _spawn(tmp_path, HOLD_BODY, path, marker, "run")
    try:
        pid = _wait_for(proc, marker)
        yield path, int(pid)
    finally:
        if proc.poll() is None:
            _kill(proc)


def test_second_process_gets_locked_error_naming_the_pid(held_store):
    path, pid = held_store
    for kwargs in ({}, {"read_only": True}):
        with pytest.raises(StoreLockedError) as info:
            Store(path, **kwargs)
        message = str(info.value)
        assert f"open for writing by process {pid}" in message
        assert "read_only=True, snapshot_if_locked=True" in message and "tracemem" in message


def test_second_process_reads_a_snapshot_when_asked(held_store):
    path, pid = held_store
    with Store(path, read_only=True, snapshot_if_locked=True) as store:
        assert store.snapshot_of == path and store.path != path
        assert f"locked by process {pid}" in store.snapshot_note
        runs = store.runs()
        assert len(runs) == 3 and {r["status"] for r in runs} == {"ok"}
        loaded = store.run(runs[0]["run_id"])
        assert [s.stage for s in loaded.steps] == ["one", "two"]
        with pytest.raises(TracememError, match="read-only"):
            Pipeline("more", T).then(bump).build().run({}, store=store)
        with pytest.raises(TracememError):
            store.sql("DELETE FROM runs")
        snapshot_dir = os.path.dirname(store.path)
    assert not os.path.exists(snapshot_dir)  # the copy is removed on close
    # the holder's file was not touched by the reader
    assert os.path.exists(path)


def test_snapshot_is_only_taken_for_readers(held_store):
    path, pid = held_store
    with pytest.raises(StoreLockedError, match=f"process {pid}"):
        Store(path, snapshot_if_locked=True)  # a writer must not write into a throwaway copy


def test_a_second_writing_store_in_the_same_process_is_refused_and_readers_get_a_clear_answer(tmp_path):
    path = str(tmp_path / "same.duckdb")
    with Store(path) as writer:  # creates the file
        run = THREADED.run({}, store=writer)
        with pytest.raises(StoreLockedError, match=r"already open for writing in this process \(Store opened at "
                                                   r".*test_store_durability.py:\d+\); use that Store"):
            Store(path)
        with pytest.raises(StoreLockedError, match="already open for writing in this process"):
            Store(os.path.join(str(tmp_path), ".", "same.duckdb"))  # another spelling of the same file
        with pytest.raises(StoreLockedError, match="already open for writing in this process"):
            Store(path, read_only=True)
        writer.flush()  # a snapshot copy holds what is on disk
        with Store(path, read_only=True, snapshot_if_locked=True) as reader:
            assert reader.snapshot_of == path and [r["run_id"] for r in reader.runs()] == [run.run_id]
            assert "this process" in reader.snapshot_note
    with Store(path) as again:  # once closed, the file opens again
        assert [r["run_id"] for r in again.runs()] == [run.run_id]


def test_file_is_usable_after_the_holder_exits(tmp_path):
    path, marker = str(tmp_path / "held.duckdb"), str(tmp_path / "ready")
    proc = _spawn(tmp_path, HOLD_BODY, path, marker, "run")
    _wait_for(proc, marker)
    _kill(proc)
    with Store(path) as store:
        assert len(store.runs()) == 3
        Pipeline("after", T).then(bump).build().run({}, store=store)
        assert len(store.runs()) == 4
    con = duckdb.connect(path, read_only=True)  # plain DuckDB reads the file too
    assert con.execute("SELECT count(*) FROM runs").fetchall()[0][0] == 4
    con.close()


JOURNAL_CHILD = """
import os, sys
sys.path.insert(0, {root!r})
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.store import Store

class J(BaseModel):
    n: int = 0
    log: list[str] = []

def one(s): s.n = 1; s.log.append("one")
def two(s): s.n = s.n + 1; s.log.append("two")

store = Store({path!r}, durability={durability!r}, flush_interval={interval!r})
store.writer.queue.put = lambda piece: None  # the process dies before its writer moves the run into the tables
run = Pipeline("journal", J).then(one).then(two).build().run({{}}, store=store)
print(run.run_id, flush=True)
os._exit(0)  # no close(), no atexit: like a crash right after flow.run returned
"""


@pytest.mark.parametrize("durability, interval", [("stage", 0.05), ("run", 0)])
def test_journal_recovers_a_finished_run_whose_writer_never_ran(tmp_path, durability, interval):
    """A run journaled durably (each stage, or whole with flush_interval=0) survives its process."""
    path = str(tmp_path / "j.duckdb")
    script = tmp_path / "child.py"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script.write_text(JOURNAL_CHILD.format(root=root, path=path, durability=durability, interval=interval))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[0]
    with Store(path) as store:
        run = store.run(run_id)
        assert run.status == "ok"
        assert [s.stage for s in run.steps] == ["one", "two"]
        assert run.value_at("log") == ["one", "two"] and run.value_at("n") == 2
        assert store.sql("SELECT count(*) FROM step_journal").fetchall()[0][0] == 0
