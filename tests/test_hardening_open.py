"""Opening a file: crash recovery that survives PID reuse, and errors that say what happened
(a corrupt file, a path containing "lock", an unreadable journal entry or schema version)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zlib

import duckdb
import pytest

from tracemem.errors import StoreError
from tracemem.store import Store, StoreLockedError
from tracemem.store.write.journal import FRAME, read_entries

from journal_tail import write_at_tail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CRASH = """
import json, os, sys
sys.path.insert(0, {root!r})
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.store import Store

path, phase = sys.argv[1], sys.argv[2]

class J(BaseModel):
    n: int = 0
    log: list[str] = []

def one(s):
    s.n = 1
    s.log.append("one")

def two(s):
    s.n = s.n + 1
    s.log.append("two")

def die(s, ctx):
    print(json.dumps({{"pid": os.getpid(), "run_id": ctx.run_id}}), flush=True)
    os._exit(0)  # the process ends mid-run

if phase == "stage":  # crash in the middle of a run recorded stage by stage
    store = Store(path, durability="stage")
    Pipeline("crashy", J).then(one).then(two).then(die).build().run({{}}, store=store)
elif phase == "returned":  # flush_interval=0: flow.run returns once the run is journaled, then the process dies
    store = Store(path, flush_interval=0)
    store.writer.queue.put = lambda piece: None  # before its writer moved the run into the tables
    run = Pipeline("journal", J).then(one).then(two).build().run({{}}, store=store)
    print(json.dumps({{"pid": os.getpid(), "run_id": run.run_id}}), flush=True)
    os._exit(0)
else:  # reopen
    store = Store(path)
    runs = {{r["run_id"]: r["status"] for r in store.runs()}}
    print(json.dumps({{"pid": os.getpid(), "interrupted": store.interrupted, "runs": runs}}), flush=True)
    store.close()
"""


def _run(tmp_path, path: str, phase: str, pid_namespace: bool) -> dict:
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(CRASH.format(root=ROOT)))
    prefix = ["unshare", "--pid", "--fork"] if pid_namespace else []
    done = subprocess.run(prefix + [sys.executable, str(script), path, phase], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def pid_namespace():
    try:
        ok = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", "import os; print(os.getpid())"],
                            capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        ok = None
    if ok is None or ok.returncode != 0 or ok.stdout.strip() != "1":
        pytest.skip("cannot start a process in its own PID namespace here (unshare --pid needs root)")


def test_a_crashed_run_is_recovered_when_the_restarted_process_gets_the_same_pid(tmp_path, pid_namespace):
    """PID 1 in a container, every time: the PID alone said the crashed run's process was still alive."""
    path = str(tmp_path / "pid1.duckdb")
    crashed = _run(tmp_path, path, "stage", pid_namespace=True)
    reopened = _run(tmp_path, path, "reopen", pid_namespace=True)
    assert crashed["pid"] == reopened["pid"] == 1
    assert reopened["interrupted"] == [crashed["run_id"]]
    assert reopened["runs"] == {crashed["run_id"]: "interrupted"}
    with Store(path) as store:
        run = store.run(crashed["run_id"])
        assert [s.stage for s in run.steps] == ["one", "two"]  # the journal was replayed
        assert run.value_at("log") == ["one", "two"] and run.status == "interrupted"
        assert store.sql("SELECT count(*) FROM step_journal").fetchall() == [(0,)]


def test_a_durably_returned_run_is_recovered_when_the_restarted_process_gets_the_same_pid(tmp_path, pid_namespace):
    path = str(tmp_path / "pid1-returned.duckdb")
    returned = _run(tmp_path, path, "returned", pid_namespace=True)
    reopened = _run(tmp_path, path, "reopen", pid_namespace=True)
    assert returned["pid"] == reopened["pid"] == 1
    assert reopened["runs"] == {returned["run_id"]: "ok"}  # flow.run had returned it: it is in the file


def test_the_lease_of_the_opening_that_wrote_a_run_is_recorded(tmp_path):
    path = str(tmp_path / "lease.duckdb")
    crashed = _run(tmp_path, path, "stage", pid_namespace=False)
    with Store(path) as store:
        (lease, status), = store.sql("SELECT lease, status FROM runs WHERE run_id = ?",
                                     [crashed["run_id"]]).fetchall()
        assert lease and lease != store.lease and status == "interrupted"


# -- errors that say what happened -------------------------------------------------------------------


def test_a_checksum_corrupt_file_is_reported_as_corrupt_never_as_locked(tmp_path):
    clean = str(tmp_path / "clean.duckdb")
    Store(clean).close()
    size = os.path.getsize(clean)
    errors = []
    for offset in range(8192, size, 4096):  # overwrite part of each block in turn
        copy = str(tmp_path / f"c{offset}.duckdb")
        shutil.copy(clean, copy)
        with open(copy, "r+b") as f:
            f.seek(offset + 64)
            f.write(b"\xab" * 32)
        try:
            Store(copy).close()
        except Exception as err:  # noqa: BLE001 - classified below
            errors.append(err)
    assert errors, "no corrupted block stopped the open; the file layout changed"
    assert not [e for e in errors if isinstance(e, StoreLockedError)]
    assert all(isinstance(e, StoreError) and str(e).startswith("cannot open") for e in errors), errors
    checksum = [e for e in errors if "checksum" in str(e)]
    assert checksum and all("the file is corrupt" in str(e) and "Restore it from a backup" in str(e)
                            for e in checksum)


def test_a_path_containing_lock_is_not_reported_as_locked(tmp_path):
    folder = tmp_path / "blocklock"
    folder.mkdir()
    bad = folder / "unlocked.duckdb"
    bad.write_text("not a database\n" * 100)
    with pytest.raises(StoreError) as info:
        Store(str(bad))
    assert not isinstance(info.value, StoreLockedError)
    assert "is not a DuckDB file" in str(info.value)


def _crashed_file(tmp_path) -> tuple[str, str]:
    path = str(tmp_path / "journal.duckdb")
    crashed = _run(tmp_path, path, "stage", pid_namespace=False)
    return path, crashed["run_id"]


def test_a_damaged_journal_record_is_reported_never_applied_and_named_on_its_run(tmp_path):
    path, run_id = _crashed_file(tmp_path)  # journaled: the run's start, stage "one", stage "two"
    journal = path + ".journal"
    ends = [pos for entry, pos, _ in read_entries(journal, 0)]  # the end of each entry: header, begin, one, two
    with open(journal, "r+b") as f:  # one flipped byte inside stage "two"'s entry
        f.seek(ends[2] + FRAME.size + 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    said: list[str] = []
    with Store(path, log=said.append) as store:  # opens, never applies the damaged entry
        assert set(store.interrupted) == {run_id}
        run = store.run(run_id)
        assert run.status == "interrupted" and [s.stage for s in run.steps] == ["one"]  # stage one kept
        assert any("checksum" in n and "not applied" in n for n in run.notes), run.notes
        assert any("checksum" in m and journal in m for m in said), said
    with Store(path) as store:  # recovery applied once: opening again changes nothing
        again = store.run(run_id)
        assert [s.stage for s in again.steps] == ["one"] and again.notes == run.notes
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]


def test_a_journal_record_that_is_no_entry_is_reported_never_applied(tmp_path):
    path, run_id = _crashed_file(tmp_path)
    data = b"not json at all"
    write_at_tail(path + ".journal", FRAME.pack(len(data), zlib.crc32(data)) + data)  # (its checksum is right:
    # only decoding can tell)
    said: list[str] = []
    with Store(path, log=said.append) as store:
        assert [s.stage for s in store.run(run_id).steps] == ["one", "two"]
        assert any("not JSON" in m and "not applied" in m for m in said), said


def test_a_journal_of_another_file_is_moved_aside_never_applied(tmp_path):
    path, run_id = _crashed_file(tmp_path)
    os.remove(path)  # the file is made anew; its journal stays
    said: list[str] = []
    with Store(path, log=said.append) as store:
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(0,)]
    assert any("belongs to another store file" in m for m in said), said
    assert [p for p in os.listdir(tmp_path) if ".journal.orphaned-" in p]


def test_an_unreadable_schema_version_says_what_and_what_to_do(tmp_path):
    path = str(tmp_path / "version.duckdb")
    Store(path).close()
    con = duckdb.connect(path)
    con.execute("UPDATE tracemem_meta SET value = 'seven' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(StoreError, match=r"unreadable schema_version 'seven' in its tracemem_meta table.*"
                                         r"UPDATE tracemem_meta SET value"):
        Store(path)
    with pytest.raises(StoreError, match="unreadable schema_version"):
        Store(path, read_only=True)
