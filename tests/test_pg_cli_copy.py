"""The command line on PostgreSQL (`--db postgresql://…`) and `tracemem copy` in both directions:
ids and provenance kept, so backtracking across runs works in the copy."""
from __future__ import annotations

import io
import json

from pg_fixtures import pg_server, pg_url, reader_login, store_factory  # noqa: F401
from stages.cli import main
from stages.demo import SESSIONS, SUBJECT, build_flow, models
from tracemem.store import Store


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def record_demo(store: Store) -> list:
    flow, env = build_flow(), models()
    return [flow.run({"question": q, "turn_id": t}, store=store, subject=SUBJECT, env=env) for t, q in SESSIONS]


def test_every_read_command_takes_a_postgresql_url(pg_server, pg_url, tmp_path):
    with Store(pg_url) as store:
        runs = record_demo(store)
    wrong = runs[-1].run_id
    code, out = cli("runs", "--db", pg_url, "--json")
    assert code == 0 and {r["run_id"] for r in json.loads(out)} == {r.run_id for r in runs}
    code, out = cli("show", wrong[:8], "--db", pg_url)
    assert code == 0 and "call_model" in out
    code, out = cli("backtrack", wrong[:8], "answer", "--db", pg_url)
    assert code == 0 and "365 days" in out
    reader = reader_login(pg_server, pg_url)  # read-only SQL runs as a login that may only read
    code, out = cli("sql", "SELECT count(*) AS n FROM runs", "--db", reader, "--json")
    assert code == 0 and json.loads(out) == [{"n": 3}]
    code, out = cli("sql", "DELETE FROM runs", "--db", reader)
    assert code == 1
    code, out = cli("memories", "--db", pg_url, "--json")
    assert code == 0 and any("365 days" in m["text"] for m in json.loads(out))
    code, out = cli("export", str(tmp_path / "parquet"), "--db", pg_url)
    assert code == 0 and (tmp_path / "parquet" / "memories.parquet").exists()
    code, out = cli("mark", wrong[:8], "wrong", "--note", "policy is 30 days", "--db", pg_url)
    assert code == 0
    code, out = cli("blame", "--db", pg_url, "--json")
    assert code == 0 and json.loads(out)["wrong"] == 1
    window = [m for m in json.loads(cli("memories", "--db", pg_url, "--json")[1]) if "365 days" in m["text"]][0]
    code, out = cli("affected", window["memory_id"], "--db", pg_url)
    assert code == 0 and wrong in out
    code, out = cli("memory", "flag", window["memory_id"], "contradicted", "--reason", "policy", "--db", pg_url)
    assert code == 0
    with Store(pg_url, read_only=True) as store:
        assert store.memory.get(window["memory_id"]).review_state == "contradicted"
        assert wrong in store.suspect([wrong])
    code, out = cli("sql", "DELETE FROM feedback", "--write", "--db", pg_url)
    assert code == 0


def test_copy_duckdb_to_postgres_and_back_keeps_ids_and_cross_run_backtracking(pg_url, tmp_path):
    source = str(tmp_path / "prototype.duckdb")
    with Store(source) as store:
        runs = record_demo(store)
        store.memory.flag(store.memory.list(SUBJECT)[0].memory_id, "stale", "old news")
        before = str(store.backtrack(runs[-1].run_id, "answer"))
        counts = {t: store.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                  for t in ("runs", "steps", "writes", "reads", "memories", "memory_events", "prompt_sections")}
    code, out = cli("copy", source, pg_url)
    assert code == 0 and "copied 3 run(s)" in out, out
    with Store(pg_url) as fleet:  # (a superuser's session: full SQL needs a writable Store)
        assert str(fleet.backtrack(runs[-1].run_id, "answer")) == before
        for table, n in counts.items():
            assert fleet.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0] == n, table
        assert fleet.memory.search(SUBJECT, "refund window", recall=True).records  # the index reads copied vectors
    code, out = cli("copy", source, pg_url, "--json")  # again: nothing new
    assert code == 0 and json.loads(out)["runs"] == 0 and json.loads(out)["skipped_runs"] == 3
    back = str(tmp_path / "analysis.duckdb")
    code, out = cli("copy", pg_url, back, "--pipeline", "support")
    assert code == 0, out
    with Store(back) as local:
        assert str(local.backtrack(runs[-1].run_id, "answer")) == before
        assert {r["run_id"] for r in local.runs()} == {r.run_id for r in runs}
        events = local.sql("SELECT event FROM memory_events ORDER BY event_id").fetchall()
        assert [e for (e,) in events].count("flag") == 1


def test_copy_since_takes_the_runs_a_chosen_run_links_to(pg_url, tmp_path):
    with Store(pg_url) as store:
        runs = record_demo(store)
        store.sql("UPDATE runs SET started_at = started_at - INTERVAL '30 days' WHERE run_id IN (?, ?)",
                  [runs[0].run_id, runs[1].run_id])
    target = str(tmp_path / "recent.duckdb")
    code, out = cli("copy", pg_url, target, "--since", "7")
    assert code == 0, out
    with Store(target) as recent:
        copied = {r["run_id"] for r in recent.runs()}
        # the last run injected a memory learned in the second: that run comes along, so backtracking works
        assert runs[2].run_id in copied and runs[1].run_id in copied
        trace = recent.backtrack(runs[2].run_id, "answer")
        assert any(a.get("run_id") == runs[1].run_id and a.get("extracted") for _, a in trace.graph.nodes(data=True))


def test_the_readme_two_workers_share_one_database(pg_url, tmp_path):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    worker = re.search(r"```py\n(# worker\.py.*?)```", readme, flags=re.S).group(1)
    (tmp_path / "worker.py").write_text(worker)
    env = dict(os.environ, TRACEMEM_DB=pg_url)
    procs = [subprocess.Popen([sys.executable, "worker.py", name], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    assert sum(len(o.splitlines()) for o, _ in outs) == 6
    code, out = cli("runs", "--db", pg_url, "--json")
    runs = json.loads(out)
    assert code == 0 and len(runs) == 6 and {r["status"] for r in runs} == {"ok"}
    with Store(pg_url) as store:
        continued = store.sql("SELECT count(*) FROM runs WHERE continues_run_id IS NOT NULL").fetchall()[0][0]
        assert continued >= 4  # every turn after a worker's first resumed the thread
        assert store.memory.list("dana")
