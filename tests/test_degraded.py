"""`ctx.degrade(reason)`: a run that ends ok but did less than it should says so beyond the step log, in
`runs.degraded`, `store.runs()`, `tracemem runs` and `tracemem show`."""
from __future__ import annotations

import io
import json

import pytest
from pydantic import BaseModel

from stages.cli import main
from tracemem import Pipeline
from tracemem.store import Store


class S(BaseModel):
    question: str = ""
    answer: str = ""


def half_done(s: S, ctx) -> None:
    ctx.degrade("the search index was offline; answered without it")
    ctx.degrade("no memories were stored")
    s.answer = "partial"


def fine(s: S) -> None:
    s.answer = "whole"


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_a_degraded_run_ends_ok_and_says_why_everywhere(tmp_path, durability):
    path = str(tmp_path / "d.duckdb")
    with Store(path, durability=durability) as store:
        run = Pipeline("deg", S).then(half_done).build().run({"question": "q"}, store=store)
        clean = Pipeline("clean", S).then(fine).build().run({"question": "q"}, store=store)
    reason = ("half_done: the search index was offline; answered without it; half_done: no memories were stored")
    assert run.status == "ok" and run.degraded == reason and clean.degraded is None
    assert run.steps[0].logs == ("degraded: the search index was offline; answered without it",
                                 "degraded: no memories were stored")
    with Store(path, read_only=True) as store:
        listed = {r["run_id"]: r for r in store.runs()}
        assert (listed[run.run_id]["status"], listed[run.run_id]["degraded"]) == ("ok", reason)
        assert listed[clean.run_id]["degraded"] is None
        assert store.run(run.run_id).degraded == reason
        assert store.sql("SELECT count(*) FROM runs WHERE degraded IS NOT NULL").fetchall() == [(1,)]
    out = io.StringIO()
    assert main(["runs", "--db", path], out=out) == 0
    header, _, *rows = out.getvalue().splitlines()
    assert header.split()[-1] == "degraded"
    assert any(run.run_id in row and "half_done: the search index" in row for row in rows)
    out = io.StringIO()
    assert main(["show", run.run_id[:8], "--db", path], out=out) == 0
    assert "status ok" in out.getvalue() and f"  degraded: {reason}" in out.getvalue()
    out = io.StringIO()
    assert main(["show", run.run_id, "--db", path, "--json"], out=out) == 0
    assert json.loads(out.getvalue())["degraded"] == reason
