"""What a DuckDB call in a background thread costs a busy Python thread beside it.

    python bench/duckdb_gil.py [--rows 1300] [--calls 5]

The store's writer inserts batches from a thread of its own while the caller's thread records
runs. DuckDB's Python client releases the GIL while a query runs, but takes it back during
the query (to check for an interrupt, to read Python objects it scans), and each time it waits
for the busy thread's switch interval. This prints, for a few ways of inserting the same Arrow
table, the time per insert alone and beside a thread running Python, and how fast that thread
ran meanwhile (100% = as fast as alone). Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import duckdb
import pyarrow as pa


def spin(seconds: float) -> int:
    """Loops of pure Python in `seconds`: the busy thread's speed."""
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1300, help="rows per insert (a batch of ~130 10-stage runs' steps)")
    parser.add_argument("--calls", type=int, default=5, help="inserts per measurement")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="tracemem-gil-", dir=os.getcwd())
    try:
        con = duckdb.connect(os.path.join(folder, "gil.duckdb"))
        con.execute("CREATE TABLE t(a BIGINT, b VARCHAR, c BIGINT, d VARCHAR)")
        n = args.rows
        table = pa.table({"a": pa.array(range(n)), "b": pa.array([f"s{i}" for i in range(n)]),
                          "c": pa.array(range(n)), "d": pa.array(["x"] * n)})

        def scan(c: Any) -> None:  # the writer's way: the table found among the calling frame's locals
            locals_ = {"c": c, "batch": table}
            exec("c.execute('BEGIN; INSERT INTO t SELECT * FROM batch; COMMIT')", {}, locals_)  # noqa: S102

        def registered(c: Any) -> None:
            c.register("batch_r", table)
            c.execute("BEGIN; INSERT INTO t SELECT * FROM batch_r; COMMIT")
            c.unregister("batch_r")

        def relation(c: Any) -> None:
            c.execute("BEGIN")
            c.from_arrow(table).insert_into("t")
            c.execute("COMMIT")

        def ten_rows(c: Any) -> None:
            c.execute("BEGIN")
            c.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [(1, "a", 2, "b")] * 10)
            c.execute("COMMIT")

        ways: list[tuple[str, Callable[[Any], None]]] = [
            ("replacement scan of a local (the writer's)", scan), ("register / unregister", registered),
            ("from_arrow(...).insert_into", relation), ("executemany of 10 rows", ten_rows)]
        alone_speed = spin(0.3) / 0.3
        print(f"## a DuckDB insert of {n:,} rows from another thread, beside a thread running Python "
              f"(duckdb {duckdb.__version__}, python {sys.version.split()[0]}, switch interval "
              f"{sys.getswitchinterval() * 1e3:g} ms)")
        print(f"{'way':<44} {'ms alone':>9} {'ms beside':>10} {'busy thread':>12}")
        for name, fn in ways:
            cursor = con.cursor()
            started = time.perf_counter()
            for _ in range(args.calls):
                fn(cursor)
            alone = (time.perf_counter() - started) / args.calls
            worker = threading.Thread(target=lambda: [fn(cursor) for _ in range(args.calls)])
            loops, started = 0, time.perf_counter()
            worker.start()
            while worker.is_alive():
                loops += 1
                time.perf_counter()
            beside = time.perf_counter() - started
            speed = loops / beside / alone_speed
            print(f"{name:<44} {alone * 1e3:>9.1f} {beside / args.calls * 1e3:>10.1f} {speed:>11.0%}")
        con.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
