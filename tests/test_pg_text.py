"""Text on PostgreSQL is stored as on DuckDB: a lone surrogate (what `json.loads` makes of a truncated emoji
escape) is escaped as `\\udXXX` and noted on its run on both; a NUL character, which DuckDB holds and
PostgreSQL text cannot, is escaped there as `\\u0000` and noted. In the writer (every durability), in the
journal replay of a killed process, and in `tracemem copy`; a run is never lost, half-written or left
`running` because of its text. A real PostgreSQL server, a DuckDB file on disk."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pg_fixtures import pg_server, pg_url, store_factory  # noqa: F401
from test_text_properties import Scope, held as stored, stage_for  # a stage that records text in every field
from tracemem import Pipeline
from tracemem.memory.errors import MemoryInputError
from tracemem.models import ScriptedModel
from tracemem.store import Store
from tracemem.store.copying import copy_history
from tracemem.surrogates import ESCAPED, NUL_ESCAPED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONE = json.loads('"cut \\ud83d"')  # half an emoji


def recorded(text: str, fail: bool = False) -> Pipeline:
    return Pipeline(f"pipe {text}", Scope).then(stage_for(text, fail)).build()


@pytest.mark.parametrize("durability, interval", [("run", 0.05), ("run", 0), ("stage", 0.05)])
def test_every_field_holds_nul_and_lone_surrogates_as_duckdb_does(store_factory, durability, interval):
    kind = store_factory.kind
    store = store_factory(durability=durability, flush_interval=interval)
    texts = [f"nul\x00here", LONE, f"both\x00{LONE}", "plain ü 😀"]
    runs = [recorded(t, fail).run({}, store=store, env={"model": ScriptedModel(default=f"reply {t}")},
                                  subject=f"subj {t}", raise_on_error=False) for t in texts for fail in (False, True)]
    store.flush()  # (escaping is not a loss: nothing is raised)
    for run, (text, fail) in zip(runs, [(t, f) for t in texts for f in (False, True)]):
        assert run.status == ("failed" if fail else "ok")
        row = store.sql("SELECT status, pipeline, subject, error, notes FROM runs WHERE run_id = ?",
                        [run.run_id]).fetchall()
        assert len(row) == 1 and row[0][:3] == (run.status, stored(f"pipe {text}", kind), stored(f"subj {text}", kind))
        steps = store.sql("SELECT status, error, logs[1] FROM steps WHERE run_id = ?", [run.run_id]).fetchall()
        assert steps == [(run.status, stored(f"RuntimeError: failed {text}", kind) if fail else None,
                          stored(f"log {text}", kind))]  # (then, for a lone surrogate, a line saying it was escaped)
        assert store.sql("SELECT response FROM model_calls WHERE run_id = ?", [run.run_id]).fetchall() == \
            [(stored(f"reply {text}", kind),)]
        assert store.sql("SELECT text FROM prompts WHERE run_id = ?", [run.run_id]).fetchall() == \
            [(stored(text, kind),)]
        loaded = store.run(run.run_id)  # loads back, and so does its JSON through ->>
        assert len(loaded.steps) == 1 and len(loaded.writes) == len(run.writes)
        if not fail:
            assert loaded.output.text == stored(text, kind) and loaded.output.answer == stored(f"reply {text}", kind)
            assert store.sql("SELECT output->>'text' FROM runs WHERE run_id = ?", [run.run_id]).fetchall() == \
                [(stored(text, kind),)]
        notes = " ".join(row[0][4] or [])
        assert (ESCAPED in notes) == (LONE in text)
        assert (NUL_ESCAPED in notes) == ("\x00" in text and kind == "postgres")


VICTIM = """
import os, signal, sys
sys.path.insert(0, {root!r})
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.store import Store

BAD = "nul\\x00 and half an emoji " + {lone!r}

class Note(BaseModel):
    text: str = ""

def first(s, ctx):
    ctx.log("log " + BAD)
    ctx.emit("prompts", prompt_id="p", text=BAD)
    s.text = BAD

def second(s, ctx):
    print(ctx.run_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

store = Store(sys.argv[1], durability="stage", lease_seconds=1)
Pipeline("victim " + BAD, Note).then(first).then(second).build().run({{}}, store=store, subject=BAD)
"""


def test_a_killed_writers_journal_with_bad_text_is_replayed_whole_and_never_left_running(pg_url, tmp_path):
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent(VICTIM.format(root=ROOT, lone=LONE)))
    child = subprocess.run([sys.executable, str(script), pg_url], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    run_id = child.stdout.split()[0]
    with Store(pg_url, lease_seconds=1) as store:  # recovers the dead lease's runs as it opens
        deadline = time.monotonic() + 30  # (the server may not have noticed the session end yet)
        while store.sql("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchall() == [("running",)]:
            assert time.monotonic() < deadline, "the killed run was never recovered"
            time.sleep(0.2)  # (its reaper looks again every lease_seconds / 2)
        bad = stored("nul\x00 and half an emoji " + LONE, "postgres")
        row = store.sql("SELECT status, subject, pipeline, notes FROM runs WHERE run_id = ?", [run_id]).fetchall()
        assert row[0][:3] == ("interrupted", bad, f"victim {bad}")
        assert any(ESCAPED in n for n in row[0][3]) and any(NUL_ESCAPED in n for n in row[0][3])
        assert store.sql("SELECT stage, logs[1] FROM steps WHERE run_id = ?", [run_id]).fetchall() == \
            [("first", f"log {bad}")]
        assert store.sql("SELECT text FROM prompts WHERE run_id = ?", [run_id]).fetchall() == [(bad,)]
        assert store.sql("SELECT count(*) FROM step_journal WHERE run_id = ?", [run_id]).fetchall() == [(0,)]


def test_copy_escapes_and_notes_one_nul_and_copies_every_run(pg_url, tmp_path):
    with Store(str(tmp_path / "src.duckdb")) as src:
        runs = [recorded(f"fine {i}").run({}, store=src, env={"model": ScriptedModel(default="ok")})
                for i in range(5)]
        runs.append(recorded("one\x00nul").run({}, store=src, env={"model": ScriptedModel(default="ok")}))
        src.flush()
        with Store(pg_url) as dst:
            report = copy_history(src, dst)
            assert report.runs == 6 and list(report.escaped) == [runs[-1].run_id]
            assert "escaped" in str(report)
            assert dst.sql("SELECT count(*) FROM runs").fetchall() == [(6,)]
            assert dst.sql("SELECT count(*) FROM steps").fetchall() == [(6,)]
            (logs, notes), = dst.sql("SELECT s.logs, r.notes FROM steps s JOIN runs r USING (run_id) "
                                     "WHERE run_id = ?", [runs[-1].run_id]).fetchall()
            assert logs == ["log one\\u0000nul"] and any(NUL_ESCAPED in n for n in notes)
            assert dst.run(runs[-1].run_id).output.text == "one\\u0000nul"
            assert copy_history(src, dst).runs == 0  # copying again adds nothing


def test_a_lone_surrogate_in_memory_is_refused_with_what_to_do_and_a_nul_is_kept(store_factory):
    store = store_factory()
    for args in (("dana", LONE), (LONE, "a fact"), ("dana", "a fact", [LONE])):
        with pytest.raises(MemoryInputError, match="lone surrogate.*escape_surrogates"):
            store.memory.remember(*args[:2], tags=args[2] if len(args) > 2 else ())
    kept = store.memory.remember("dana", "a nul\x00 in a fact")
    assert store.memory.get(kept.memory_id).text == stored("a nul\x00 in a fact", store_factory.kind)
    assert store.memory.search("dana", f"fact {LONE}").records  # a query may hold one: it is only looked up
