"""The demo says exactly what load_snapshot did (issue 18, item 3)."""
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


def test_the_demos_snapshot_line_names_the_run_the_projection_and_the_score(demo):
    path, printed = demo
    fix = printed.split("== 5.", 1)[1].split("== Explore", 1)[0].strip().splitlines()
    last = fix[-1]
    with Store(path, read_only=True) as store:
        [(rerun, source, score, projection)] = store.sql(
            "SELECT u.run_id, u.source_run_id, u.score, u.projection FROM snapshot_uses u JOIN runs r USING (run_id) "
            "ORDER BY r.started_at DESC LIMIT 1").fetchall()
        [(question,)] = store.sql("SELECT query FROM runs WHERE run_id = ?", [source]).fetchall()
    assert question == SESSIONS[-1][1]  # the wrong run asked the same question
    assert last.startswith(f"load_snapshot: projected past run {source[:8]} (similarity {score:.2f}, "
                           f"projection '{projection}'): ")
    # what was projected: the past run's decision, its rule and the value that rule read
    assert "route chose 'refunds' because 'asks about a refund' (read question = 'Can I get a refund" in last
    assert "similar question seen before" not in printed
