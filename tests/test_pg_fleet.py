"""A fleet on one PostgreSQL store: worker processes recording at once, memory shared between them,
threads continuing across workers, and a worker killed mid-run (tests/pg_fleet_worker.py is the worker).

The full fleet (4 workers × 250 runs, durability "stage") is marked slow; a small one
(2 workers × 24 runs) runs in the default suite. Each also SIGKILLs a further worker mid-run and
checks that its finished stages are kept and its run is marked interrupted (how soon after the kill is
reported, not asserted: a loaded machine is slow to notice; bench/postgres.py times the fleet's latencies).
Beside them: one memory, two store openings (what two processes see).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest

from pg_fixtures import pg_server, pg_url  # noqa: F401
from tracemem.store import Store

WORKER = os.path.join(os.path.dirname(__file__), "pg_fleet_worker.py")
LEASE = 2.0


def spawn(url: str, worker: int, runs: int, subjects: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, url, str(worker), str(runs), str(subjects),
                             "--lease", str(LEASE), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def line_starting(proc: subprocess.Popen, word: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(word):
            return line.strip()
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"worker never printed {word}: {proc.stderr.read()[-3000:]}")


def kill_mid_run(store: Store, victim: subprocess.Popen) -> tuple[str, float]:
    """SIGKILL the victim inside its hanging run; (that run, seconds until another opening marked it interrupted)."""
    run_id = line_starting(victim, "HANGING").split()[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    killed = time.monotonic()
    while time.monotonic() - killed < 30:
        status = store.sql("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchall()
        if status and status[0][0] == "interrupted":
            return run_id, time.monotonic() - killed
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} of the killed worker is still {status} 30 s later")


def fleet(url: str, workers: int, runs: int, subjects: int) -> float:
    """Run the fleet and check it; returns how long after its kill the killed worker's run was interrupted."""
    with Store(url, lease_seconds=LEASE) as observer:  # creates the schema before the workers race to open it
        observer.memory.search("user-0", "nothing yet", recall=True)  # its index is loaded now, before any memory
        procs = [spawn(url, w, runs, subjects, *(["--flag-at", str(runs // 3)] if w == 0 else []))
                 for w in range(workers)]
        victim = spawn(url, workers, 40, subjects, "--hang-after", "3")
        hung, took = kill_mid_run(observer, victim)
        outputs = [p.communicate(timeout=900) for p in procs]
        for p, (out, err) in zip(procs, outputs):
            assert p.returncode == 0, err[-3000:]
        done = [line.split()[1:] for out, _ in outputs for line in out.splitlines() if line.startswith("DONE")]
        flagged = [line.split()[1:] for out, _ in outputs for line in out.splitlines() if line.startswith("FLAGGED")]
        sql = observer.sql

        # the killed worker: its finished stage kept, its run interrupted (kill_mid_run waits for it)
        assert sql("SELECT stage, status FROM steps WHERE run_id = ? ORDER BY step", [hung]).fetchall() == \
               [("first", "ok")]
        assert sql("SELECT count(*) FROM step_journal").fetchall() == [(0,)]

        # no runs lost: every run a worker finished is there, whole
        ids = [run_id for d in done for run_id in d]
        assert len(ids) == workers * runs
        rows = dict(sql("SELECT run_id, status FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                        [ids]).fetchall())
        assert len(rows) == len(ids) and set(rows.values()) == {"ok"}
        steps = sql("SELECT count(*) FROM steps WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [ids]).fetchall()
        assert steps[0][0] == 7 * len(ids)  # recall, load_snapshot, route, branch, prompt, model, extract

        # threads continue across workers: a run of one worker resumes a run of another
        crossing = sql("SELECT r.run_id FROM runs r JOIN runs p ON p.run_id = r.continues_run_id "
                       "WHERE r.lease <> p.lease ORDER BY r.started_at DESC LIMIT 1").fetchall()
        per_lease = sql("SELECT lease, count(*) FROM runs GROUP BY 1").fetchall()
        assert crossing, f"no thread continued in another worker: {per_lease}"
        thread = observer.thread(crossing[0][0])
        assert len({sql("SELECT lease FROM runs WHERE run_id = ?", [t.run_id]).fetchall()[0][0]
                    for t in thread}) >= 2

        # cross-run backtracking from a run of one worker to a memory extracted in another, and its turn
        used = sql("""SELECT u.run_id, m.memory_id, m.source_run_id FROM memory_uses u
                      JOIN memories m USING (memory_id) JOIN runs r ON r.run_id = u.run_id
                      JOIN runs src ON src.run_id = m.source_run_id
                      WHERE u.outcome = 'injected' AND r.lease <> src.lease
                      AND r.continues_run_id IS NULL LIMIT 1""").fetchall()  # a thread's first turn: a short walk
        assert used, "no run injected a memory another worker extracted"
        run_id, memory_id, source_run = used[0]
        trace = observer.backtrack(run_id, "answer")
        assert f"m:{memory_id}" in trace.graph
        origin = [v for v in trace.graph.successors(f"m:{memory_id}")
                  if trace.graph.edges[f"m:{memory_id}", v].get("kind") == "provenance"]
        assert [trace.graph.nodes[v]["run_id"] for v in origin] == [source_run]  # the run it was extracted in
        assert trace.graph.nodes[origin[0]].get("source_ref")  # and the turn

        # a memory flagged in one worker is never injected by any worker afterwards
        assert flagged and flagged[0][0] != "none", "worker 0 found no injected memory to flag"
        memory_id, after = flagged[0][0], datetime.fromisoformat(flagged[0][1])
        late = sql("""SELECT count(*) FROM memory_uses u JOIN steps s ON s.run_id = u.run_id AND s.step = u.step
                      WHERE u.memory_id = ? AND u.outcome = 'injected' AND s.started_at >= ?""",
                   [memory_id, after]).fetchall()[0][0]
        assert late == 0, f"memory {memory_id} was injected {late} time(s) after it was flagged"
        # and this process, whose index was loaded before the memory existed, recalls it as flagged: excluded
        text = observer.memory.get(memory_id).text
        recalled = observer.memory.search("user-0", text, recall=True)
        assert memory_id not in [r.memory_id for r in recalled.records]
        assert memory_id in [e.memory_id for e in recalled.excluded if e.reason == "flagged"]
    return took


def report(record_property, took: float) -> None:
    record_property("shown", f"fleet: the killed worker's run was marked interrupted {took:.1f} s after the kill "
                             f"(lease {LEASE:g} s)")


def test_a_small_fleet_records_shares_memory_and_recovers_a_killed_worker(pg_url, record_property):
    report(record_property, fleet(pg_url, workers=2, runs=24, subjects=3))


@pytest.mark.slow
def test_four_workers_times_250_runs_lose_nothing(pg_url, record_property):
    report(record_property, fleet(pg_url, workers=4, runs=250, subjects=8))


def test_a_memory_remembered_in_one_opening_is_recalled_in_another_and_flags_apply_at_once(pg_url):
    with Store(pg_url) as a, Store(pg_url) as b:
        assert b.memory.search("ana", "tea", recall=True).records == []  # b's index is loaded, then stale
        tea = a.memory.remember("ana", "Ana drinks green tea", confidence=90)
        found = b.memory.search("ana", "what tea does Ana drink", recall=True)  # the next search (bench/postgres.py
        assert [r.memory_id for r in found.records] == [tea.memory_id]        # times how soon, across processes)
        a.memory.flag(tea.memory_id, "stale", "switched to coffee")
        again = b.memory.search("ana", "what tea does Ana drink", recall=True)
        assert again.records == [] and again.excluded_flagged == 1
        a.memory.update(tea.memory_id, review_state="reviewed", text="Ana drinks coffee")
        assert [r.text for r in b.memory.search("ana", "coffee", recall=True).records] == ["Ana drinks coffee"]
        a.memory.forget(tea.memory_id)
        assert b.memory.search("ana", "coffee", recall=True).records == []
        milk = b.memory.remember("ana", "Ana takes milk in her coffee", confidence=90)
        a.memory.purge(milk.memory_id)
        assert b.memory.search("ana", "milk coffee", recall=True).records == []


def test_recall_rechecks_in_sql_so_a_stale_index_never_injects(pg_url):
    with Store(pg_url) as a, Store(pg_url) as b:
        tea = a.memory.remember("ana", "Ana drinks green tea", confidence=90)
        assert b.memory.search("ana", "green tea", recall=True).records  # b now holds it, fresh
        # flag it behind b's back, without an event b could catch up on: only reading the table can see it
        a.backend.con.execute("UPDATE memories SET review_state = 'contradicted' WHERE memory_id = ?",
                              [tea.memory_id])
        result = b.memory.search("ana", "green tea", recall=True)
        assert result.records == [] and result.excluded_flagged == 1


def test_runs_of_a_store_closed_cleanly_are_never_recovered_by_others(pg_url):
    from pydantic import BaseModel

    from tracemem import Pipeline

    class S(BaseModel):
        x: int = 0

    def one(s):
        s.x = 1

    flow = Pipeline("p", S).then(one).build()
    with Store(pg_url, durability="stage") as a, Store(pg_url, lease_seconds=0.2) as b:
        run = flow.run({}, store=a)
        looked = b.backend.reaper.rounds
        deadline = time.monotonic() + 60
        while b.backend.reaper.rounds < looked + 2:  # b's reaper looks twice (however slow the machine)
            assert time.monotonic() < deadline, "b's reaper never looked"
            time.sleep(0.05)
        assert b.backend.reaper.found == []  # a is alive, so nothing of a's is touched
        a.flush()
        assert b.run(run.run_id).status == "ok"
