"""The benchmark scripts run and print their headline lines. No timing is asserted, ever."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import run_all  # noqa: E402


def run(*argv: str, timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def overhead_out() -> str:
    return run("bench/overhead.py", "--runs", "50", "--reps", "1")


@pytest.fixture(scope="module")
def store_out() -> str:
    return run("bench/store.py", "--runs", "50", "--reps", "1", "--turns", "20", "--pressure-seconds", "0.5")


def test_overhead_prints_its_headline(overhead_out: str) -> None:
    assert "10-stage linear pipeline" in overhead_out
    assert "plain python (dict)" in overhead_out
    assert "tracemem engine (no store)" in overhead_out


@pytest.mark.slow  # bench/store.py, even this short: ~18 s (shared with the next test)
def test_store_prints_its_headlines(store_out: str) -> None:
    assert "## µs per stage" in store_out
    assert "store, durability=run" in store_out
    assert "store, durability=stage" in store_out
    assert "events/s" in store_out
    assert "20-turn chat" in store_out
    assert "growth exponent" in store_out
    assert "## producer faster than the writer" in store_out and "## SIGKILL after" in store_out


@pytest.mark.slow  # needs store_out (above)
def test_run_all_parses_the_scripts_lines(overhead_out: str, store_out: str) -> None:
    """bench/RESULTS.md is built from these lines: a format change must show up here, not as a blank table."""
    assert set(run_all.parse_overhead(overhead_out)) >= {"plain", "engine"}
    parsed = run_all.parse_store(store_out)
    assert set(parsed) >= {"run", "stage", "ingest", "turns", "mb", "exponent"}
    assert parsed["turns"] == 20


@pytest.mark.slow  # thousands of runs and a prune: ~10 s
def test_scale_prints_its_headlines_and_run_all_parses_them() -> None:
    out = run("bench/scale.py", "--turns", "30", "--heap-turns", "20,40", "--runs", "3000", "--prune-runs", "1000",
              "--reps", "1")
    for line in ("backtrack from the file, first call", "CLI backtrack RUN reply, start-up included",
                 "per turn at turn 30", "heap growth exponent", "store.runs(limit=20) at 3,000 runs",
                 "store.run(id) at 3,000 runs", "prune(keep_last=100) of 1,000 runs"):
        assert line in out, line
    parsed = run_all.parse_scale(out)
    assert set(parsed) >= {"turns", "backtrack", "cli", "resume", "heap_exponent", "runs", "run", "prune", "built_s"}
    assert parsed["turns"] == 30 and parsed["run_n"] == 3000 and parsed["prune_n"] == 1000
    assert all(r[3] == "not measured (quick)" for r in run_all.scale_goals(run_all.Result("scale", stdout=out))
               if "heap" not in r[0])


def test_run_all_reads_the_durability_goals() -> None:
    text = ("goal: tracemem store (durability run) ≤ 20 µs/stage; reference here: plain 0.7\n"
            "goal: flush_interval=0 ≤ 10 µs/stage: 153.65 µs/stage — not met (15.4× the limit)\n"
            "goal: durability=\"stage\", process-crash safe ≤ 20 µs/stage: 12.50 µs/stage — met "
            "(quick run: indicative only)\n"
            "goal: fsync per stage ≤ 1.5× the fsync floor (163.2 µs): not measured (n/a (no fsync option))\n")
    assert run_all.parse_durability_goals(text) == [
        ("flush_interval=0 ≤ 10 µs/stage", "153.65 µs/stage", "not met (15.4× the limit)"),
        ('durability="stage", process-crash safe ≤ 20 µs/stage', "12.50 µs/stage", "met"),
        ("fsync per stage ≤ 1.5× the fsync floor (163.2 µs)", "not measured (n/a (no fsync option))", "—")]


def test_run_all_judges_locomo_recall_against_its_goal() -> None:
    """R@10 ≥ 0.75 over all questions and ≥ 0.50 over the multi-hop ones, read from memory.py's lines."""
    line = "  new default (BM25 ⊕ MiniLM ONNX + context 0.5)       @5 0.625  @10 {r10}  30.00 ms/query (p50 28.70)\n"
    table = ("\nall\n\n| method | all @5 | all @10 | c1 multi-hop @5 / @10 | c2 temporal @5 / @10 |\n|---|---:|---:|---:|---:|\n"
             "| new default (BM25 ⊕ MiniLM ONNX + context 0.5) | 0.625 | {r10} | 0.333 / {hop} | 0.682 / 0.742 |\n")

    def judged(r10: str, hop: str) -> tuple[str, str, str, str]:
        text = "LoCoMo evidence recall (10 conversations, 1536 questions, categories 1-4)\n" + line.format(r10=r10) + \
            table.format(r10=r10, hop=hop)
        results = {name: run_all.Result(name, status="ok") for name in run_all.SCRIPTS}
        results["memory"].stdout = text
        return next(r for r in run_all.goals(results, quick=False) if r[0].startswith("LoCoMo"))

    goal = judged("0.719", "0.422")
    assert goal[1] == "≥ 0.75 (multi-hop ≥ 0.50)" and goal[2].startswith("0.719, multi-hop 0.422")
    assert goal[3].startswith("gap")
    assert judged("0.760", "0.422")[3].startswith("gap (multi-hop)")
    assert judged("0.760", "0.510")[3] == "met"


def test_run_all_reads_a_snapshot_table() -> None:
    text = ("## load_snapshot lookup: exact top-1 over stored runs; goal ≤ 10 ms at 100k\n"
            "    runs  fill s  matrix load ms  p50 ms  p95 ms\n"
            "   10000     2.6            95.1   16.01   28.49\n"
            "  100000    27.7          1053.7   12.07   22.86\n")
    assert run_all.parse_snapshot(text) == {"sizes": {10_000: 16.01, 100_000: 12.07}}


@pytest.mark.slow  # 3,000-record stores, opened and searched: ~11 s
def test_memory_scale_smoke_prints_its_table() -> None:
    out = run("bench/memory_scale.py", "--smoke")
    assert "first search after open, 1,000 records" in out and "first search after open, 3,000 records" in out
    assert "search p50 / p95, 3,000 records" in out and "RSS after 20 searches" in out
    assert "bulk remember_many into a file, 3,000 records" in out and "rebuilt nothing" in out


def peers_importable() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("langgraph", "burr"))


@pytest.mark.slow
@pytest.mark.skipif(not peers_importable(), reason="langgraph and burr not installed (pip install -e '.[bench]')")
def test_peers_quick() -> None:
    out = run("bench/peers.py", "--quick", timeout=600)
    parsed = run_all.parse_peers(out)
    labels = {r["label"] for r in parsed["rows"]}
    assert {"tracemem store, durability=run", "langgraph, SqliteSaver (WAL)", "burr, SQLitePersister (WAL)"} <= labels
    chats = {c["label"] for c in parsed["chat"]}
    assert any(c.startswith("langgraph") for c in chats) and any(c.startswith("burr") for c in chats)
    assert "WARNING" not in out  # the peers computed what tracemem computed
    for row in ("langgraph SqliteSaver durability=sync, synchronous=FULL",
                "langgraph SqliteSaver durability=exit, synchronous=NORMAL",
                "burr SQLitePersister (per step), synchronous=NORMAL",
                "burr SQLitePersister (per step), synchronous=FULL"):
        assert row in out, row


@pytest.mark.slow  # every floor measured, strace children: ~9 s
def test_peers_durability_table_tracemem_only() -> None:
    """The durability section alone, tracemem only: a section per guarantee, syncs counted, goals printed."""
    out = run("bench/peers.py", "--section", "durability", "--quick", "--peers", "tracemem")
    for group in ("### not durable at return", "### process-crash safe at return, per run",
                  "### process-crash safe per stage", "### power-loss safe per stage",
                  "### the machine's floors, same run"):
        assert group in out, group
    for floor in ("200 B os.write, O_APPEND", "json.dumps of a step entry", "synchronous=NORMAL",
                  "synchronous=FULL", "os.write + fdatasync (the fsync floor)", "DuckDB INSERT+commit (file)"):
        assert floor in out, floor
    goals = [line for line in out.splitlines() if line.startswith("goal: ")]
    assert len(goals) == 8, goals  # engine, "run", "stage", fsync; then ahead of each peer's same guarantee
    assert all("not measured (that peer did not run)" in g for g in goals if "ahead of" in g), goals
    assert "tracemem engine, no store" in out  # the floor under every tracemem row, same run
    stage = next(line for line in out.splitlines() if line.strip().startswith("tracemem durability=stage "))
    assert "not counted" not in stage
    assert "## µs per stage" not in out and "turn chat" not in out  # --section ran that section only
    assert run_all.parse_peers(out)["rows"] == []  # its rows never read as the overhead table's


@pytest.mark.slow
def test_run_all_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    run("bench/run_all.py", "--quick", "--only", "overhead,store", "--out", str(out), timeout=600)
    text = out.read_text()
    assert "## Goals" in text and "engine overhead" in text and "## Output: store.py" in text
    assert "not parsed" not in text


def test_blame_bench_prints_its_measures() -> None:
    out = run("bench/blame.py", "--runs", "2000", "--memories", "300", "--reps", "1")
    assert "affected(memory used by 20 runs)" in out and "blame over every judged run" in out
    assert "ranks the planted memory first" in out


@pytest.mark.skipif(importlib.util.find_spec("starlette") is None, reason="the viewer needs the ui extra")
def test_ui_bench_prints_its_figures() -> None:
    out = run("bench/ui.py", "--runs", "500", "--steps", "60", "--huge", "3000", "--reps", "1")
    assert "501 runs" in out and "baseline: open the store read-only" in out  # (500, and the huge run)
    for label in ("runs page ", "run page, 6", "backtrack page, 6", "run page, 3,00", "backtrack page, 3,00",
                  "SQL page (fenced)"):
        assert label in out, label
    assert "goal ≤ 200 ms" in out and "goal ≤ 300 ms" in out and "goal ≤ 1000 ms" in out


def _postgres_unavailable() -> str:
    """Why bench/postgres.py cannot start a server here ('' when it can)."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed (pip install 'tracemem-agents[postgres]')"
    from tracemem.store.pg.local import ServerUnavailable, find_binaries

    try:
        find_binaries()
    except ServerUnavailable as err:
        return str(err)
    return ""


@pytest.mark.slow  # starts its own server and a second process: ~15 s
def test_postgres_bench_prints_its_figures_side_by_side() -> None:
    why = _postgres_unavailable()
    if why:
        if os.environ.get("TRACEMEM_REQUIRE_PG") == "1":
            pytest.fail(f"PostgreSQL is required here (TRACEMEM_REQUIRE_PG=1) but {why}")
        pytest.skip(f"no PostgreSQL server: {why}")
    out = run("bench/postgres.py", "--quick", "--no-fsync", timeout=600)
    for line in ("duckdb, durability=run", "postgres, durability=run", "events/s", "flush_interval=0",
                 "memory search", "from A's commit to B's recall returning it"):
        assert line in out, line
    assert out.count("postgres") >= 4 and out.count("duckdb") >= 4


@pytest.mark.slow  # ~6 s
def test_resume_bench_prints_its_figures() -> None:
    out = run("bench/resume.py", "--rounds", "20", "--reps", "1")
    assert "## resume and fork from a file: a paused run of 41 recorded steps" in out
    assert "baseline: load the run record (store.run)" in out
    assert "0 live model calls" in out  # the gate's call before its pause was answered from the record
    assert "fork from step 20: load, rebuild the state" in out
    assert "then run its" in out


@pytest.mark.slow  # two children under valgrind: ~20 s
def test_instruction_counts_print_per_stage_figures() -> None:
    if shutil.which("valgrind") is None:
        out = run("bench/instructions.py", "--runs", "2", "--variants", "plain")
        assert "valgrind not found" in out
        return
    out = run("bench/instructions.py", "--runs", "5", "--variants", "plain,engine", timeout=900)
    assert "instructions per stage (10-stage pipeline, callgrind, 5 runs after 20 to warm up)" in out
    counts = {label: int(line.split()[-2].replace(",", "")) for line in out.splitlines()
              for label in ("plain python (dict)", "tracemem engine (no store)") if line.strip().startswith(label)}
    assert set(counts) == {"plain python (dict)", "tracemem engine (no store)"}, out
    assert 0 < counts["plain python (dict)"] < counts["tracemem engine (no store)"]  # recording costs something


@pytest.mark.slow
def test_why_prints_why_beside_backtrack_for_a_thread_and_a_long_run() -> None:
    out = run("bench/why.py", "--turns", "20", "--steps", "60", "--reps", "1")
    assert "## a 20-turn thread" in out and "## one run of" in out
    tables = out.split("## ")[1:]
    for table in tables:
        rows = {line.split()[0]: line for line in table.splitlines() if line.startswith(("backtrack ", "why "))}
        assert set(rows) == {"backtrack", "why"} and rows["why"].rstrip().split()[-1].isdigit(), table
