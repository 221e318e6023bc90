"""What it costs on PostgreSQL for a run `flow.run` returned to survive a SIGKILL, each way measured in one run.

    python bench/pg_durability.py [--runs 300] [--reps 3] [--url postgresql://…] [--no-fsync]

The 10-stage pipeline of bench/overhead.py, durability "run", on a local PostgreSQL started here
(tracemem/store/pg/local.py; fsync on, as a real server) unless --url names one. Variants, interleaved rep by
rep, each timed over --runs runs including the final flush:

- engine only (no store);
- the store as it is, default settings (`Store(url)`);
- the store with `flush_interval=0`;
- every run written whole into its tables before flow.run returns (`store.flush()` after each run): the
  other way to commit before returning;
- a local run journal instead: what appending each run to a journal file on this machine costs (the DuckDB
  file's run journal, store/write/journal.py, a whole-run entry for each of the same runs), to add to a store
  that journals nothing before returning.

Prints µs per stage, ms per run and each one's ratio to the engine alone; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.overhead import STAGES, build_flow  # noqa: E402
from tracemem.store import Store  # noqa: E402
from tracemem.store.write.journal import FileJournal, run_entry  # noqa: E402
from tracemem.store.write.rows import run_records  # noqa: E402


def timed(fn: Callable[[], Any], runs: int, after: Callable[[], None] = lambda: None) -> float:
    """Seconds per run of `fn`, `after` included once."""
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    after()
    return (time.perf_counter() - start) / runs


def journal_appends(flow: Any, runs: int, folder: str) -> Callable[[], float]:
    """A measurement of appending `runs` finished runs to a local run journal (a whole-run entry each): seconds
    per run."""
    done = [flow.run({}) for _ in range(runs)]

    def measure() -> float:
        path = os.path.join(folder, f"journal-{uuid.uuid4().hex[:8]}")
        log = FileJournal(path, fsync=False, ident="bench")
        try:
            start = time.perf_counter()
            for run in done:
                log.append(run_entry(run, "bench", run_records(run)), sync=True)
            return (time.perf_counter() - start) / runs
        finally:
            log.close()
            os.remove(path)
    return measure


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--url", help="a PostgreSQL database to use instead of starting a local server")
    ap.add_argument("--no-fsync", action="store_true", help="start the local server with fsync off (smoke runs)")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="tracemem-bench-pgdur-", dir="/tmp")
    server = None
    try:
        url = args.url
        if url is None:
            from tracemem.store.pg.local import LocalServer

            server = LocalServer.start(tempfile.mkdtemp(prefix="tracemem-bench-server-", dir="/tmp"),
                                       durable=not args.no_fsync)
            url = server.ensure_database("bench")
        tag = uuid.uuid4().hex[:8]

        def pg(name: str, **kwargs: Any) -> Store:
            return Store(f"{url}{'&' if '?' in url else '?'}schema=bench_{name}_{tag}", **kwargs)

        flow = build_flow()
        default, fi0, whole = pg("default"), pg("fi0", flush_interval=0), pg("whole")
        for store in (default, fi0, whole):
            flow.run({}, store=store)
            store.flush()
        appends = journal_appends(flow, args.runs, folder)
        variants: dict[str, Callable[[], float]] = {
            "engine only (no store)": lambda: timed(lambda: flow.run({}), args.runs),
            "Store(url), default settings": lambda: timed(lambda: flow.run({}, store=default), args.runs,
                                                          default.flush),
            "Store(url, flush_interval=0)": lambda: timed(lambda: flow.run({}, store=fi0), args.runs, fi0.flush),
            "the run whole in its tables before return": lambda: timed(
                lambda: (flow.run({}, store=whole), whole.flush()), args.runs),
            "a local run journal's append alone": appends,
        }
        results: dict[str, list[float]] = {k: [] for k in variants}
        names = list(variants)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:  # order rotated each rep
                results[name].append(variants[name]())
        engine = statistics.median(results["engine only (no store)"])
        where = f"started here, fsync {'off' if args.no_fsync else 'on'}" if server else "given"
        print(f"PostgreSQL {url.split('@')[-1]} ({where})"
              f"; {args.reps} reps of {args.runs} runs of {STAGES} stages, interleaved; load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"{'variant':<44} {'µs/stage':>9} {'ms/run':>8} {'× engine':>9}   min–max µs/stage")
        for name, values in results.items():
            med = statistics.median(values)
            print(f"{name:<44} {med / STAGES * 1e6:>9.1f} {med * 1e3:>8.3f} {med / engine:>9.1f}   "
                  f"{min(values) / STAGES * 1e6:.1f}–{max(values) / STAGES * 1e6:.1f}")
        for store in (default, fi0, whole):
            store.close()
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.directory, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
