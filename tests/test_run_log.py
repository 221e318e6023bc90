"""The run journal of a DuckDB file (store/run_log.py): what each mode has on disk as its call returns,
recovery applied exactly once, power-loss syncs counted, and a stale journal never applied."""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.store import Store
from tracemem.store.log_format import RECORD_STRUCT

from journal_tail import write_at_tail

CHILD = """
import os, sys
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.store import Store

path, durability, fsync, count = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])

class S(BaseModel):
    a: int = 0
    log: list[str] = []

def one(s):
    s.a = s.a + 1
    s.log.append("one")

def two(s):
    s.log.append("two")

store = Store(path, durability=durability, fsync=fsync, flush_interval=60)  # the writer never gets to run
flow = Pipeline("p", S).then(one).then(two).build()
for i in range(count):
    run = flow.run({"a": i}, store=store)
    print(run.run_id, flush=True)
os.kill(os.getpid(), 9)  # SIGKILL at once: no exit handlers, nothing flushed
"""


def _killed_child(tmp_path, path: str, durability: str, fsync: bool = False, count: int = 25) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    done = subprocess.run([sys.executable, str(script), path, durability, "1" if fsync else "0", str(count)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("durability,fsync", [("run", False), ("stage", False), ("run", True)])
def test_every_run_flow_run_returned_survives_sigkill_whole(tmp_path, durability, fsync):
    path = str(tmp_path / "k.duckdb")
    returned = _killed_child(tmp_path, path, durability, fsync)
    assert len(returned) == 25
    with Store(path) as store:
        rows = dict(store.sql("SELECT run_id, status FROM runs").fetchall())
        assert rows == {run_id: "ok" for run_id in returned}  # queued for 60 s, journaled at once
        steps = store.sql("SELECT run_id, count(*), min(step), max(step) FROM steps GROUP BY 1").fetchall()
        assert sorted(steps) == sorted((run_id, 2, 1, 2) for run_id in returned)
        assert store.run(returned[-1]).state_at() == {"a": 25, "log": ["one", "two"]}
        assert store.sql("SELECT count(*) FROM writes").fetchall() == [(75,)]


class N(BaseModel):
    n: int = 0


def _flow(stages: int = 3):
    pipeline = Pipeline("n", N)
    for i in range(stages):
        pipeline = pipeline.then(lambda s: setattr(s, "n", s.n + 1), id=f"s{i}")
    return pipeline.build()


def _counts(store: Store) -> list[tuple]:
    return [store.sql(f"SELECT count(*) FROM {t}").fetchall()[0] for t in ("runs", "steps", "reads", "writes")]


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_replaying_a_journal_the_tables_already_hold_applies_nothing_twice(tmp_path, durability):
    """A crash after a batch committed but before the journal was checkpointed replays it again."""
    path = str(tmp_path / "twice.duckdb")
    saved = str(tmp_path / "saved-journal")
    with Store(path, durability=durability, flush_interval=60) as store:
        first = [_flow().run({}, store=store) for _ in range(3)]
        store.flush()  # these three are in the tables and checkpointed
        later = [_flow().run({}, store=store) for _ in range(2)]  # journaled only
        shutil.copytree(path + ".journal", saved, ignore=shutil.ignore_patterns("lock"))
        store.flush()
        expected = _counts(store)
    shutil.rmtree(path + ".journal")
    shutil.copytree(saved, path + ".journal")  # as if the process died before the checkpoint
    for _ in range(2):
        with Store(path) as store:
            assert _counts(store) == expected
            assert {r["run_id"] for r in store.runs()} == {r.run_id for r in first + later}
            assert all(store.run(r.run_id).status == "ok" for r in later)


def test_power_loss_safe_mode_syncs_once_per_stage_and_once_at_the_end(tmp_path, monkeypatch):
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    with Store(str(tmp_path / "p.duckdb"), durability="stage", fsync=True, flush_interval=60) as store:
        _flow().run({}, store=store)  # warm: the journal is open and its segment allocated
        synced.clear()
        run = _flow(5).run({}, store=store)
        assert len(synced) == 5, synced  # five stages; the start rides with the first, the last with the end
        synced.clear()
        _flow(5).run({}, store=store, durability="run")
        assert len(synced) == 1  # durability "run": the whole run, once
    with Store(str(tmp_path / "p.duckdb")) as store:
        assert store.run(run.run_id).state_at().n == 5


def test_power_loss_safe_mode_syncs_each_stage_before_the_next_one_runs(tmp_path, monkeypatch):
    """The deferred sync still keeps the promise: no stage runs before the stage it follows is on disk, through
    a subflow's runs (which share the parent's sink) and while the run streams (whose feed hears of each step
    starting too), and the run's end covers its last stage."""
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    seen: list[tuple[str, int]] = []  # (stage, fdatasyncs so far) as each stage starts

    def stage(name: str):
        def fn(s: N) -> None:
            seen.append((name, len(synced)))
            s.n += 1
        return fn

    child = Pipeline("child", N).then(stage("c1"), id="c1").then(stage("c2"), id="c2").build()
    parent = (Pipeline("parent", N).then(stage("p1"), id="p1")
              .subflow(child, inputs={"n": "n"}, outputs={"n": "n"}, id="sub")
              .then(stage("p2"), id="p2").build())
    with Store(str(tmp_path / "d.duckdb"), durability="stage", fsync=True, flush_interval=60) as store:
        _flow().run({}, store=store)  # warm: the journal is open and its segment allocated
        synced.clear()
        run = parent.run({}, store=store)
        # p1 synced as the subflow step began; c1 as c2 began; c2 with the child's end; the subflow step as p2
        # began; p2 with the run's end (synced as each was appended, it took 7: the two ends on their own)
        assert seen == [("p1", 0), ("c1", 1), ("c2", 2), ("p2", 4)], seen
        assert len(synced) == 5, synced
        seen.clear()
        synced.clear()
        events = [e.kind for e in parent.stream({}, store=store)]
        assert seen == [("p1", 0), ("c1", 1), ("c2", 2), ("p2", 4)], seen
        assert events.count("step_started") == 5, events  # p1, the subflow step, c1, c2, p2
    with Store(str(tmp_path / "d.duckdb")) as store:
        assert store.run(run.run_id).state_at().n == 4


def test_without_fsync_no_journal_append_syncs(tmp_path, monkeypatch):
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    with Store(str(tmp_path / "q.duckdb"), durability="stage", flush_interval=60) as store:
        for _ in range(5):
            _flow(5).run({}, store=store)
        assert synced == []


def test_a_journal_left_by_a_deleted_file_of_the_same_name_is_moved_aside_never_applied(tmp_path):
    path = str(tmp_path / "reborn.duckdb")
    saved = str(tmp_path / "old-journal")
    with Store(path, flush_interval=60) as store:
        old = _flow().run({}, store=store)
        shutil.copytree(path + ".journal", saved, ignore=shutil.ignore_patterns("lock"))
    os.remove(path)
    shutil.rmtree(path + ".journal")
    shutil.copytree(saved, path + ".journal")  # the old file's journal, with a run it never folded in
    said: list[str] = []
    with Store(path, log=said.append) as store:
        assert store.runs() == [] and store.sql("SELECT count(*) FROM steps").fetchall() == [(0,)]
        fresh = _flow().run({}, store=store)
    assert any("belonged to an earlier file" in m and "not applied" in m for m in said), said
    aside = glob.glob(path + ".journal.orphaned-*")
    assert len(aside) == 1 and glob.glob(os.path.join(aside[0], "*.seg"))  # kept for whoever wants it
    with Store(path) as store:
        assert [r["run_id"] for r in store.runs()] == [fresh.run_id] and old.run_id != fresh.run_id


def test_a_running_stage_runs_finished_stages_are_visible_to_queries_from_the_journal(tmp_path):
    seen: list[tuple] = []
    store = Store(str(tmp_path / "live.duckdb"), durability="stage", flush_interval=60)

    def look(s, ctx):
        seen.extend(store.sql("SELECT r.status, count(s.step) FROM runs r JOIN steps s USING (run_id) "
                              "WHERE run_id = ? GROUP BY 1", [ctx.run_id]).fetchall())

    with store:
        run = Pipeline("look", N).then(lambda s: setattr(s, "n", 1), id="first").then(look).build().run(
            {}, store=store)
        assert seen == [("running", 1)]
        store.flush()
        assert store.sql("SELECT status FROM runs WHERE run_id = ?", [run.run_id]).fetchall() == [("ok",)]
        assert store.sql("SELECT count(*) FROM steps WHERE run_id = ?", [run.run_id]).fetchall() == [(2,)]


MATERIALIZED = """
import os, sys, time
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.store import Store

path, marker = sys.argv[1], sys.argv[2]

class S(BaseModel):
    n: int = 0

store = Store(path, durability="stage", flush_interval=60)

def one(s):
    s.n = 1

def two(s):
    store.flush()  # stage one and the runs row are now in the tables, not only in the journal
    open(marker, "w").close()
    time.sleep(60)

Pipeline("m", S).then(one).then(two).build().run({}, store=store)
"""


def test_a_torn_tail_is_noted_on_a_run_whose_journaled_records_were_all_in_the_tables(tmp_path):
    path, marker = str(tmp_path / "torn.duckdb"), tmp_path / "in-two"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(MATERIALIZED))
    child = subprocess.Popen([sys.executable, str(script), path, str(marker)], stderr=subprocess.PIPE)
    for _ in range(600):
        if marker.exists() or child.poll() is not None:
            break
        time.sleep(0.05)
    assert marker.exists(), child.stderr.read() if child.poll() is not None else "the child never reached stage two"
    child.kill()
    child.wait(timeout=10)
    segment = max(glob.glob(path + ".journal/*.seg"))
    # what a process killed mid-append leaves: a header promising more bytes
    write_at_tail(Path(segment), RECORD_STRUCT.pack(400, 12345) + b"partial")
    with Store(path) as store:
        (run,) = store.runs()
        loaded = store.run(run["run_id"])
        assert loaded.status == "interrupted" and [s.stage for s in loaded.steps] == ["one"]
        assert any(("truncated record" in n or "checksum mismatch" in n) and "not applied" in n
                   for n in loaded.notes), loaded.notes  # (a mapped segment: the 400 bytes read include zeros)
