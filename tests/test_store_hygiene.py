"""Small ways a store could surprise its user, each on a real store: a pruned DuckDB file that never shrinks,
feedback on a value the run never had, `runs --limit -1`, and a store or export name that would make DuckDB
download an extension."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest
from pydantic import BaseModel

from stages.cli import main
from tracemem import Pipeline
from tracemem.errors import TracememError, UsageError
from tracemem.store import Store, StoreLockedError

ROOT = Path(__file__).resolve().parents[1]


class Chat(BaseModel):
    question: str = ""
    notes: list[str] = []
    answer: str = ""


def respond(s: Chat) -> None:
    s.notes.append("looked it up")
    s.answer = s.question + " " + os.urandom(600).hex()  # incompressible: the file grows with the runs


FLOW = Pipeline("chat", Chat).then(respond).build()


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_prune_compact_gives_the_space_back(tmp_path):
    path = str(tmp_path / "big.duckdb")
    with Store(path) as store:
        for i in range(2000):
            FLOW.run({"question": f"q{i}"}, store=store, subject="ana")
        memory = store.memory.remember("ana", "likes tea", confidence=90)
    with Store(path) as store:
        store.prune(keep_last=50)
    pruned = os.path.getsize(path)
    code, out = cli("prune", "--keep-last", "20", "--compact", "--db", path)
    assert code == 0 and "compacted" in out, out
    assert os.path.getsize(path) * 4 < pruned, (pruned, os.path.getsize(path))
    with Store(path) as store:  # a store as before: its runs, its memory, its sequences go on
        assert len(store.runs(limit=100)) == 20
        store.memory.forget(memory.memory_id, reason="asked to")
        assert [e.event for e in store.memory.history(memory.memory_id)] == ["remember", "forget"]
        FLOW.run({"question": "after"}, store=store)
        assert len(store.runs(limit=100)) == 21


def test_compact_needs_the_file_to_itself(tmp_path):
    path = str(tmp_path / "held.duckdb")
    with Store(path) as store:
        FLOW.run({"question": "q"}, store=store)
    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from tracemem.store import Store
        store = Store({path!r})
        print("open", flush=True)
        sys.stdin.readline()
        store.close()
    """)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout.readline().strip() == "open"
        before = Path(path).read_bytes()
        from tracemem.store.audit.compact import compact

        with pytest.raises(StoreLockedError):
            compact(path)
        assert Path(path).read_bytes() == before and not os.path.exists(path + ".compacting")
    finally:
        agent.stdin.close()
        agent.wait(timeout=60)


def test_feedback_is_refused_on_a_value_the_run_never_had(tmp_path):
    with Store(str(tmp_path / "fb.duckdb")) as store:
        run = FLOW.run({"question": "refund?"}, store=store)
        with pytest.raises(UsageError, match=r"no value at 'answr'.*answer, notes"):
            store.feedback(run.run_id, "wrong", path="answr")
        with pytest.raises(UsageError, match="no value at 'missing.text'"):
            store.feedback(run.run_id, "wrong", path="missing.text")
        for path in ("answer", "notes", "notes[0]", "question"):  # written, inside a write, or an input field
            store.feedback(run.run_id, "right", path=path)
        assert len(store.sql("SELECT * FROM feedback").fetchall()) == 4
    code, _ = cli("mark", run.run_id[:8], "wrong", "--path", "answr", "--db", str(tmp_path / "fb.duckdb"))
    assert code == 1


def test_runs_limit_must_be_at_least_one(tmp_path, capsys):
    path = str(tmp_path / "r.duckdb")
    with Store(path) as store:
        FLOW.run({"question": "q"}, store=store)
    for limit in ("-1", "0"):
        proc = subprocess.run([str(Path(sys.executable).with_name("tracemem")), "runs", "--limit", limit,
                               "--db", path], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--limit: takes a number of at least 1" in proc.stderr
    assert cli("runs", "--limit", "1", "--db", path)[0] == 0


def test_names_that_would_make_duckdb_download_an_extension_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("md:x", "motherduck:x", "s3://bucket/agent.duckdb", "https://example.com/a.duckdb"):
        with pytest.raises(TracememError, match="not on this machine"):
            Store(name)
    path = str(tmp_path / "e.duckdb")
    with Store(path) as store:
        FLOW.run({"question": "q"}, store=store)
        with pytest.raises(TracememError, match="not on this machine"):
            store.export("s3://bucket/exports")
        # the store's database never loads or installs one, whatever a query asks; other databases keep theirs
        with pytest.raises(duckdb.Error, match="httpfs"):
            store.backend.con.execute("SELECT * FROM read_parquet('s3://bucket/x.parquet')").fetchall()
        assert store.backend.con.execute("SELECT current_setting('autoinstall_known_extensions'), "
                                         "current_setting('autoload_known_extensions')").fetchall() == [(False, False)]
        other = duckdb.connect()
        assert other.execute("SELECT current_setting('autoload_known_extensions')").fetchall() == [(True,)]
        other.close()
    code, _ = cli("export", "s3://bucket/exports", "--db", path)
    assert code == 1 and not os.path.exists(tmp_path / "s3:")
