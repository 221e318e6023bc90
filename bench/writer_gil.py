"""What a writer batch costs in waits for the GIL while a flow's thread runs Python.

    python bench/writer_gil.py [--runs 300] [--reps 7] [--interval 0.005]

DuckDB's Python client gives the GIL up while a statement runs and takes it back several
times per call (after each task, to check for signals; around a scan of a Python object).
Each time the flow's thread holds it, the writer waits for the interpreter's switch
interval. This times one fold batch of --runs journaled runs (bench/overhead.py's
pipeline) on a DuckDB file, alone and while another thread runs a Python loop, with the
switch interval set to --interval (large, so each wait shows), and prints the difference
as GIL waits per batch, for:
- "arrow": the batch's entries as a registered Arrow table (how tracemem passed them before);
- "literal": the entries as a string literal in the SQL (store/entry_fold.py now);
- "empty": BEGIN and COMMIT alone, the floor of one call.
Each shape is one `execute` call. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Callable

import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.overhead import build_flow  # noqa: E402
from tracemem.store import Store  # noqa: E402
from tracemem.store import entry_fold  # noqa: E402
from tracemem.store.run_log import RunLog  # noqa: E402


def journal_entries(folder: str, runs: int) -> list[bytes]:
    """Real whole-run entries, as the flow's thread journals them."""
    entries: list[bytes] = []
    whole = RunLog.whole

    def keep(log: RunLog, run: object) -> bytes:
        entries.append(whole(log, run))
        return entries[-1]
    RunLog.whole = keep  # type: ignore[method-assign]
    try:
        flow = build_flow("writer-gil")
        with Store(os.path.join(folder, "source.duckdb"), flush_interval=0) as store:
            for _ in range(runs):
                flow.run({}, store=store)
    finally:
        RunLog.whole = whole  # type: ignore[method-assign]
    return entries


class Spinner:
    """Another thread running Python (as a flow's thread does) while a batch runs."""

    def __enter__(self) -> "Spinner":
        self.stop = False
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()
        time.sleep(0.02)
        return self

    def _spin(self) -> None:
        total = 0
        while not self.stop:
            for i in range(1000):
                total += i

    def __exit__(self, *exc: object) -> None:
        self.stop = True
        self.thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--interval", type=float, default=0.005)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="tracemem-writer-gil-", dir=os.getcwd())
    entries = journal_entries(folder, args.runs)
    store = Store(os.path.join(folder, "fold.duckdb"))
    con, fold = store.backend.con, store.backend.fold
    batch_no = [0]

    def fresh() -> list[bytes]:  # new run ids for every batch: the same runs folded again
        batch_no[0] += 1
        return [e.replace(e[10:26], b"%016x" % (batch_no[0] * 100_000 + i)) for i, e in enumerate(entries)]

    def arrow() -> None:
        doc = pa.table({"doc": pa.array([b"[%s]" % b",".join(fresh())], type=pa.string())})
        con.register("_bench_doc", doc)
        fold_sql = fold.sql([b"0"]).split("; ", 1)[1]  # the prepared statements and the clean-up
        parse = (f"INSERT INTO {entry_fold.PARSED} SELECT unnest(from_json(doc, "
                 f"'[{entry_fold.TEXT_LIST}]')) FROM _bench_doc; ")
        try:
            con.execute("BEGIN TRANSACTION; " + parse + fold_sql + "COMMIT").fetchall()
        finally:
            con.unregister("_bench_doc")

    def literal() -> None:
        con.execute(fold.sql(fresh(), "BEGIN TRANSACTION; ", "COMMIT")).fetchall()

    def empty() -> None:
        con.execute("BEGIN TRANSACTION; COMMIT").fetchall()

    shapes: dict[str, Callable[[], None]] = {"arrow": arrow, "literal": literal, "empty": empty}
    alone: dict[str, list[float]] = {k: [] for k in shapes}
    busy: dict[str, list[float]] = {k: [] for k in shapes}
    before = sys.getswitchinterval()
    sys.setswitchinterval(args.interval)
    try:
        for _ in range(args.reps):
            for name, shape in shapes.items():
                start = time.perf_counter()
                shape()
                alone[name].append(time.perf_counter() - start)
                with Spinner():
                    start = time.perf_counter()
                    shape()
                    busy[name].append(time.perf_counter() - start)
    finally:
        sys.setswitchinterval(before)
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"one fold batch of {args.runs} runs, median of {args.reps}; switch interval {args.interval * 1e3:g} ms")
    print(f"  {'shape':<10} {'alone ms':>9} {'busy ms':>9} {'GIL waits':>10}")
    for name in shapes:
        a, b = statistics.median(alone[name]), statistics.median(busy[name])
        print(f"  {name:<10} {a * 1e3:>9.2f} {b * 1e3:>9.2f} {(b - a) / args.interval:>10.1f}")


if __name__ == "__main__":
    main()
