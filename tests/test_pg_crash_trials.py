"""Crash trials on PostgreSQL: a worker SIGKILLed at random points loses no run `flow.run` returned.

With default settings (durability "run"), a PostgreSQL store commits each finished run as a
`step_journal` row before `flow.run` returns (bench/pg_durability.py measures what that costs against
a local journal); the background writer moves it into the tables later. A killed worker's journal
rows are replayed by the next store that opens (its lease is dead once the server ends its session).

A child process (tests/test_crash_trials.py's worker) runs a 10-stage pipeline in a loop against a real
PostgreSQL server and, after each `flow.run` returns, appends `R run i t` to a side file with `os.write`
(which survives SIGKILL). The
parent SIGKILLs it at a seeded random time (0.05-0.6 s after it is ready; every fourth trial 1.5-2 s,
past several of the writer's batches), opens the store (which recovers the dead worker's runs) and
checks: every returned run is there, 'ok', with its ten steps, twenty reads and twenty writes; no run
is left 'running' nor half there; at most one run that never returned (the one in flight) is there,
whole. Trials: 30 in the slow suite (TRACEMEM_PG_CRASH_TRIALS), 3 in the default one.
"""
from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from pg_fixtures import pg_server  # noqa: F401
from test_crash_trials import ROOT, STAGES, WORKER, read_side  # the file trials' worker, given a PostgreSQL URL
from tracemem.store import Store



def _returned(side: Path) -> dict[str, int]:
    """The runs flow.run returned: `R run_id i time` lines (`S` lines say which stages ended)."""
    return {run_id: i for run_id, (i, _) in read_side(side)[0].items()}  # (a line the kill cut short is no claim)


def _trial(server: Any, folder: Path, seed: int) -> tuple[int, int]:
    """One kill and its check; (runs returned, runs found)."""
    rng = random.Random(seed)
    url = server.url("tracemem_tests") + f"?schema=crash_{uuid.uuid4().hex[:12]}"
    side, err = folder / f"side-{seed}", folder / f"stderr-{seed}"
    script = folder / f"worker-{seed}.py"
    script.write_text(WORKER.format(root=ROOT, side=str(side), stages=STAGES, path=url, kwargs={"lease_seconds": 2}))
    with open(err, "wb") as stderr:
        worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=stderr)
    where = f"trial seed {seed}"
    ready, _, _ = select.select([worker.stdout], [], [], 60)
    if not ready or worker.stdout.readline().strip() != b"ready":
        worker.kill()
        worker.wait(10)
        raise AssertionError(f"{where}: the worker never got ready: {err.read_text()[-2000:]}")
    time.sleep(rng.uniform(1.5, 2.0) if seed % 4 == 1 else rng.uniform(0.05, 0.6))
    assert worker.poll() is None, f"{where}: the worker ended by itself: {err.read_text()[-2000:]}"
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(30)
    worker.stdout.close()
    returned = _returned(side)
    with Store(url, lease_seconds=2) as store:  # recovers the dead worker's runs (now, or within a second)
        deadline = time.monotonic() + 30
        while store.sql("SELECT count(*) FROM step_journal").fetchall() != [(0,)]:
            assert time.monotonic() < deadline, f"{where}: the killed worker's journal was never replayed"
            time.sleep(0.1)
        present = {r[0]: r[1:] for r in store.sql(
            "SELECT r.run_id, r.status, (r.input->>'n')::bigint, (SELECT count(*) FROM steps s WHERE "
            "s.run_id = r.run_id), (SELECT count(*) FROM reads d WHERE d.run_id = r.run_id), (SELECT count(*) "
            "FROM writes w WHERE w.run_id = r.run_id) FROM runs r").fetchall()}
    for run_id, i in returned.items():
        assert run_id in present, f"{where}: run #{i} ({run_id}) returned before the kill and is not in the store"
        assert present[run_id] == ("ok", i * 100, STAGES, 2 * STAGES, 2 * STAGES), \
            f"{where}: returned run #{i} is not whole: {present[run_id]}"
    unreturned = [r for r in present if r not in returned]
    assert len(unreturned) <= 1, f"{where}: runs in the store that never returned: {unreturned}"
    for run_id in unreturned:  # the run in flight: journaled, killed before flow.run returned
        assert present[run_id] == ("ok", len(returned) * 100, STAGES, 2 * STAGES, 2 * STAGES), \
            f"{where}: the run in flight is half there: {present[run_id]}"
    return len(returned), len(present)


def _trials(server: Any, folder: Path, count: int, record_property: Any) -> None:
    returned = found = 0
    started = time.monotonic()
    for trial in range(count):
        r, f = _trial(server, folder, 50_000 + trial)
        returned, found = returned + r, found + f
    record_property("shown", f"PostgreSQL crash trials: {count} SIGKILLs in {time.monotonic() - started:.0f} s, "
                             f"{returned} runs returned, all {returned} found whole ({found} in the stores)")


def test_a_sigkilled_worker_loses_no_returned_run(pg_server, tmp_path, record_property):
    _trials(pg_server, tmp_path, 3, record_property)


@pytest.mark.slow
def test_thirty_sigkills_at_random_points_lose_no_returned_run(pg_server, tmp_path, record_property):
    _trials(pg_server, tmp_path, int(os.environ.get("TRACEMEM_PG_CRASH_TRIALS", "30")), record_property)
