"""What the read-only SQL fence (tracemem/store/read/user_sql.py) costs: opening it, and each query through it.

    python bench/user_sql.py [--runs 2000] [--queries 200]

Fills a store with `--runs` 5-stage runs, then compares, on the same file in the same run:
- the first query of a read-only Store (which builds the fenced instance: a new in-memory DuckDB
  that ATTACHes the file READ_ONLY and locks itself) with a plain `duckdb.connect(path, read_only=True)`;
- per-query p50 of a point lookup and of a GROUP BY over `steps`, fenced vs the store's own connection.
Prints figures and ratios; asserts nothing.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time

import duckdb
from pydantic import BaseModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402


class S(BaseModel):
    n: int = 0


def bump(s: S) -> None:
    s.n += 1


def p50_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-usersql-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = os.path.join(folder, "bench.duckdb")
    pipeline = Pipeline("bench", S)
    for i in range(5):
        pipeline = pipeline.then(bump, id=f"bump{i}")
    flow = pipeline.build()
    with Store(path) as store:
        for _ in range(args.runs):
            flow.run({}, store=store)
    point = "SELECT status FROM runs WHERE run_id = (SELECT min(run_id) FROM runs)"
    group = "SELECT stage, count(*), max(ended_at - started_at) FROM steps GROUP BY stage"

    opens_plain, opens_fenced = [], []
    for _ in range(5):
        start = time.perf_counter()
        con = duckdb.connect(path, read_only=True)
        con.sql(point).fetchall()
        opens_plain.append((time.perf_counter() - start) * 1000)
        con.close()
        with Store(path, read_only=True) as store:
            start = time.perf_counter()
            store.sql(point).fetchall()  # builds the fence
            opens_fenced.append((time.perf_counter() - start) * 1000)
    print(f"store: {args.runs} runs, {args.runs * 5} steps ({os.path.getsize(path) / 1e6:.1f} MB)")
    plain_open, fenced_open = statistics.median(opens_plain), statistics.median(opens_fenced)
    print(f"first query, plain read-only connect:    {plain_open:8.2f} ms")
    print(f"first query, fenced (builds the fence):  {fenced_open:8.2f} ms  ({fenced_open / plain_open:.1f}x)")
    with Store(path, read_only=True) as store:
        store.sql("SELECT 1").fetchall()
        own = store.con.cursor()
        for label, query in (("point lookup", point), ("GROUP BY over steps", group)):
            plain = p50_ms(lambda: own.sql(query).fetchall(), args.queries)
            fenced = p50_ms(lambda: store.sql(query).fetchall(), args.queries)
            print(f"{label:20s} p50: store's own connection {plain:7.3f} ms, fenced {fenced:7.3f} ms "
                  f"({fenced / plain:.2f}x)")


if __name__ == "__main__":
    main()
