"""The demo says exactly what load_snapshot did."""
from __future__ import annotations

import io

import pytest

from stages.demo import SESSIONS, run_demo
from tracemem.store import Store


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[str, str]:
    path = str(tmp_path_factory.mktemp("demo") / "demo.duckdb")
    out = io.StringIO()
    run_demo(path, fresh=True, out=out)
    return path, out.getvalue()


def test_after_flagging_the_demo_says_load_snapshot_skipped_the_suspect_wrong_run(demo):
    path, printed = demo
    fix = printed.split("== 6.", 1)[1].split("== Explore", 1)[0].strip().splitlines()
    last = fix[-1]
    with Store(path, read_only=True) as store:
        [(wrong, question)] = store.sql("SELECT r.run_id, r.query FROM runs r JOIN feedback f USING (run_id) "
                                        "WHERE f.verdict = 'wrong'").fetchall()
        assert store.sql("SELECT count(*) FROM snapshot_uses WHERE source_run_id = ?", [wrong]).fetchall() == [(0,)]
    assert question == SESSIONS[-1][1]  # the wrong run asked the same question, and is not projected again
    assert last.startswith(f"load_snapshot: skipped suspect past run {wrong} (marked wrong; used memory m_")
    assert "since flagged contradicted; similarity 1.00)" in last


def test_the_demo_marks_the_wrong_answer_and_shows_affected_and_blame(demo):
    _, printed = demo
    section = printed.split("== 5.", 1)[1].split("== 6.", 1)[0]
    assert "store.affected('m_" in section and "1 run(s)" in section and "answer" in section
    assert "store.blame(): statistical: Ochiai" in section


def test_the_demo_answers_why_with_the_memory_first_and_where_it_was_learned(demo):
    path, printed = demo
    section = printed.split("== 3.", 1)[1].split("== 4.", 1)[0].splitlines()
    at = next(i for i, line in enumerate(section) if line.startswith("why(trace): "))
    first = section[at + 1].strip()
    with Store(path, read_only=True) as store:
        [(memory_id, learned)] = store.sql("SELECT memory_id, source_run_id FROM memories "
                                           "WHERE text LIKE '%365 days%'").fetchall()
    assert first.startswith(f"1. memory {memory_id} \"User's refund window is 365 days\"")
    assert f"learned in run {learned[:8]} turn t2" in first
    assert "why " in printed.split("== Explore it yourself", 1)[1]
