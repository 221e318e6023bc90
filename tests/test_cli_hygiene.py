"""The CLI leaves nothing behind and never lets stored text drive the terminal: snapshot copies are
removed after every call (errors included), control characters are shown as escapes, an empty
`--subject` is refused, and `--json` is always valid JSON."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from stages.cli import main
from tracemem import Pipeline
from tracemem.cli import build_parser
from tracemem.store import Store

TRACEMEM = str(Path(sys.executable).with_name("tracemem"))
HOSTILE = "ok\x1b[2J\x1b[31mred\rover\x9b1m\u202etxt"  # clear screen, colour, carriage return, CSI, bidi


class Odd(BaseModel):
    ratio: float = 0.0
    limit: float = 0.0
    floor: float = 0.0
    note: str = ""


def odd(s):
    s.ratio, s.limit, s.floor = float("nan"), float("inf"), float("-inf")
    s.note = HOSTILE


def broken(s):
    raise RuntimeError(f"model said {HOSTILE}")


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory) -> dict:
    path = str(tmp_path_factory.mktemp("hygiene") / "odd.duckdb")
    with Store(path) as store:
        ok = Pipeline("odd", Odd).then(odd).build().run({}, store=store, subject=f"ana{HOSTILE}")
        failed = Pipeline("broken", Odd).then(broken).build().run({}, store=store, raise_on_error=False)
        store.memory.remember("ana", f"likes {HOSTILE}")
    return {"path": path, "ok": ok.run_id, "failed": failed.run_id}


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def assert_inert(text: str) -> None:
    """No character that a terminal obeys; the hostile text is shown as escapes instead."""
    for char in ("\x1b", "\r", "\x9b", "\u202e"):
        assert char not in text, repr(text)


# -- snapshot copies ------------------------------------------------------------------------------


def test_snapshot_copies_are_removed_after_every_call(odd_store, tmp_path):
    held, foreign = str(tmp_path / "held.duckdb"), str(tmp_path / "foreign.duckdb")
    shutil.copyfile(odd_store["path"], held)
    lockdir = tmp_path / "lockdir"  # a path with "lock" in it is read through a snapshot copy
    lockdir.mkdir()
    corrupt = lockdir / "corrupt.duckdb"
    data = bytearray(Path(odd_store["path"]).read_bytes())
    data[:64] = bytes(64)
    corrupt.write_bytes(bytes(data))
    ready = str(tmp_path / "ready")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time, duckdb
        held = duckdb.connect({held!r})
        foreign = duckdb.connect({foreign!r})
        foreign.execute("CREATE TABLE IF NOT EXISTS invoices (id INT)")
        open({ready!r}, "w").write("held")
        time.sleep(120)
    """)])
    temp = tmp_path / "tmp"
    temp.mkdir()
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ready) or not open(ready).read():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        for argv, code in ((["runs", "--db", held], 0), (["show", "zzzz", "--db", held], 1),
                           (["runs", "--db", foreign], 1), (["runs", "--db", str(corrupt)], 1),
                           (["sql", "SELECT * FROM read_text('/etc/passwd')", "--db", held], 1)):
            proc = subprocess.run([TRACEMEM, *argv], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "TMPDIR": str(temp)})
            assert proc.returncode == code, (argv, proc.stderr)
            assert "Traceback" not in proc.stderr and proc.stderr.count("tracemem: error:") == code, proc.stderr
            assert list(temp.iterdir()) == [], (argv, proc.stderr)
    finally:
        holder.kill()
        holder.wait(timeout=10)


# -- terminal control characters --------------------------------------------------------------------


def test_stored_control_characters_are_shown_not_obeyed(odd_store, capsys):
    path = odd_store["path"]
    for argv in (["runs"], ["runs", "--status", "failed"], ["memories"], ["show", odd_store["ok"]],
                 ["show", odd_store["failed"]], ["sql", "SELECT subject, error FROM runs"],
                 ["backtrack", odd_store["ok"], "note"]):
        code, out = cli(*argv, "--db", path)
        assert code == 0, argv
        assert_inert(out)
    code, out = cli("sql", "SELECT subject FROM runs WHERE subject IS NOT NULL", "--db", path)
    assert "ana" + "ok\\x1b[2J\\x1b[31mred\\rover\\x9b1m\\u202etxt" in out  # visible, and the columns align
    code, out = cli("memories", "--db", path, "--json")
    assert json.loads(out)[0]["text"] == f"likes {HOSTILE}"  # --json keeps the exact text (JSON-escaped)
    assert_inert(out)
    capsys.readouterr()
    assert cli("show", "\x1b[2J", "--db", path)[0] == 1
    err = capsys.readouterr().err
    assert "no run '\\x1b[2J'" in err
    assert_inert(err)


# -- an empty subject ------------------------------------------------------------------------------


def test_memories_refuses_an_empty_subject(odd_store, capsys):
    for subject in ("", "  "):
        capsys.readouterr()
        code, out = cli("memories", "--db", odd_store["path"], "--subject", subject)
        err = capsys.readouterr().err
        assert code == 1 and out == "" and err.count("\n") == 1
        assert err.startswith("tracemem: error: --subject is empty") and "leave --subject out" in err
    code, out = cli("memories", "--db", odd_store["path"], "--subject", "ana", "--json")
    assert code == 0 and len(json.loads(out)) == 1


# -- valid JSON ------------------------------------------------------------------------------------------


def strict(text: str) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_valid_json_with_null_for_nan_and_infinity(odd_store):
    code, out = cli("show", odd_store["ok"], "--db", odd_store["path"], "--json")
    data = strict(out)
    assert code == 0 and data["output"]["ratio"] is None and data["output"]["limit"] is None
    assert data["final_state"] == {"ratio": None, "limit": None, "floor": None, "note": HOSTILE}
    code, out = cli("sql", "SELECT 'nan'::DOUBLE AS a, 'inf'::DOUBLE AS b, 1.5::DOUBLE AS c", "--db", odd_store["path"],
                    "--json")
    assert strict(out) == [{"a": None, "b": None, "c": 1.5}]
    subcommand = build_parser()._subparsers._group_actions[0].choices["show"]  # what `tracemem show --help` says
    assert "NaN and Infinity" in subcommand.format_help() and "null" in subcommand.format_help()
