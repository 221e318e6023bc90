"""The fleet backend's costs, side by side with the DuckDB file, in one run.

    python bench/postgres.py [--runs 2000] [--reps 3] [--memories 100000] [--url postgresql://…]
    python bench/postgres.py --quick --no-fsync    # small numbers: a smoke run

Starts a local PostgreSQL (tracemem/store/pg/local.py; fsync on, as a real server) unless --url
names one, and measures each figure on a DuckDB file and on PostgreSQL:

1. µs per stage, the 10-stage pipeline of bench/overhead.py with durability "run" (amortized,
   including the final flush), interleaved with the engine alone (goal ≤ 50 µs/stage);
2. ingest: events (rows) per second written by the batched writer (goal ≥ 50,000/s);
3. ms per run with flush_interval=0 (the run is in the database when flow.run returns), and
   with durability "stage";
4. memory search p50/p95 (recall=True, top 10, one subject, dim 384) at --memories records,
   after warm-up (goal ≤ 10 ms);
5. PostgreSQL only: how long after process A's remember() commits process B's recall returns it
   (goal ≤ 1 s), and B's recall p50 when nothing changed.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.memory import RandomEmbedder, pct  # noqa: E402
from bench.overhead import STAGES, build_flow  # noqa: E402
from bench.timing import queue_whole  # noqa: E402
from tracemem.store import Store  # noqa: E402

WRITER_A = """
import sys, time
from tracemem.store import Store
store = Store(sys.argv[1])
for i in range(int(sys.argv[2])):
    store.memory.remember("fleet", f"fact number {i} mentions zebra{i} and nothing else", confidence=90)
    print(f"{i} {time.time()!r}", flush=True)
    time.sleep(0.05)
store.close()
"""


def per_stage(fn: Callable[[], Any], runs: int, after: Callable[[], None]) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    after()
    return (time.perf_counter() - start) / runs / STAGES * 1e6


def stage_costs(places: dict[str, Callable[..., Store]], runs: int, reps: int) -> None:
    flow = build_flow()
    stores = {k: open_("stages", durability="run") for k, open_ in places.items()}
    variants: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {
        "engine only (no store)": (lambda: flow.run({}), lambda: None)}
    for kind, store in stores.items():
        variants[f"{kind}, durability=run"] = (lambda s=store: flow.run({}, store=s), store.flush)
    for store in stores.values():
        flow.run({}, store=store)
    results: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for label, (fn, after) in variants.items():
            results[label].append(per_stage(fn, runs, after))
    print(f"## µs per stage, 10-stage pipeline, durability 'run' ({reps} reps of {runs} runs, interleaved; "
          f"goal ≤ 50)")
    for label, values in results.items():
        print(f"{label:<32} {statistics.median(values):>9.2f} µs/stage  "
              f"(min {min(values):.2f}, max {max(values):.2f})")
    for store in stores.values():
        store.close()


def ingest(places: dict[str, Callable[..., Store]], runs: int) -> None:
    flow = build_flow()
    prepared = [flow.run({}) for _ in range(runs)]
    rows = sum(1 + len(r.steps) + len(r.reads) + len(r.writes) + len(r.decisions) for r in prepared)
    print(f"\n## ingest: {rows:,} rows from {runs:,} runs, enqueued at once, one flush (goal ≥ 50,000 events/s)")
    for kind, open_ in places.items():
        store = open_("ingest")
        start = time.perf_counter()
        for r in prepared:
            queue_whole(store, r)
        store.flush()
        elapsed = time.perf_counter() - start
        print(f"{kind:<12} {rows / elapsed:>12,.0f} events/s  ({elapsed * 1000:.0f} ms)")
        store.close()


def sync_costs(places: dict[str, Callable[..., Store]], runs: int) -> None:
    flow = build_flow()
    print(f"\n## ms per 10-stage run when each run (or stage) must be durable at once ({runs} runs)")
    for kind, open_ in places.items():
        for label, kwargs in (("flush_interval=0", {"flush_interval": 0}),
                              ("durability=stage", {"durability": "stage"})):
            store = open_(label.split("=")[0], **kwargs)
            flow.run({}, store=store)
            start = time.perf_counter()
            for _ in range(runs):
                flow.run({}, store=store)
            elapsed = (time.perf_counter() - start) / runs * 1000
            store.flush()
            print(f"{kind:<12} {label:<18} {elapsed:>8.2f} ms/run")
            store.close()


def memory_search(places: dict[str, Callable[..., Store]], n: int, queries: int) -> None:
    rng = np.random.default_rng(n)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(6, 16))) for _ in range(n)]
    print(f"\n## memory search, recall=True, top 10, one subject of {n:,} records, dim 384, after warm-up, the two "
          f"stores queried in turn (goal p50 ≤ 10 ms)")
    fill, load, stores = {}, {}, {}
    for kind, open_ in places.items():
        store = open_("memory", embedder=RandomEmbedder())
        t0 = time.perf_counter()
        for start in range(0, n, 5000):
            store.memory.remember_many({"subject": "s", "text": t, "confidence": 80} for t in texts[start:start + 5000])
        fill[kind] = n / (time.perf_counter() - t0)
        if store.backend.kind == "postgres":  # let the server settle: its after-load work is not search time
            store.sql("VACUUM ANALYZE memories")
            store.sql("CHECKPOINT")
        store.close()
        store = stores[kind] = open_("memory", embedder=RandomEmbedder())  # a new process's view: loaded back
        t0 = time.perf_counter()
        store.memory.rebuild_index()
        load[kind] = time.perf_counter() - t0
        for _ in range(20):
            store.memory.search("s", "w1 w2 w3", recall=True, limit=10)
    took: dict[str, list[float]] = {k: [] for k in stores}
    for _ in range(queries):
        q = " ".join(rng.choice(vocab, size=5))
        for kind, store in stores.items():
            t = time.perf_counter()
            store.memory.search("s", q, recall=True, limit=10)
            took[kind].append(1000 * (time.perf_counter() - t))
    for kind, store in stores.items():
        print(f"{kind:<12} p50 {pct(took[kind], 50):>6.2f} ms  p95 {pct(took[kind], 95):>6.2f} ms  "
              f"(fill {fill[kind]:,.0f}/s, index load {load[kind]:.2f} s)")
        store.close()


def cross_process(url: str, count: int) -> None:
    """Process A remembers; this process (B) recalls: the delay from A's commit to B's recall returning it."""
    with Store(url) as b:
        b.memory.search("fleet", "warm up", recall=True)
        a = subprocess.Popen([sys.executable, "-c", WRITER_A, url, str(count)], stdout=subprocess.PIPE, text=True)
        delays, idle = [], []
        for line in a.stdout:
            i, committed = line.split()
            while True:
                found = b.memory.search("fleet", f"zebra{i}", recall=True, limit=3)
                if any(f"zebra{i} " in r.text for r in found.records):
                    delays.append(1000 * (time.time() - float(committed)))
                    break
            t = time.perf_counter()
            b.memory.search("fleet", f"zebra{i}", recall=True, limit=3)
            idle.append(1000 * (time.perf_counter() - t))
        a.wait()
    print(f"\n## PostgreSQL, two processes: A remembers, B recalls ({count} memories; goal ≤ 1000 ms)")
    print(f"from A's commit to B's recall returning it: p50 {pct(delays, 50):.2f} ms, max {max(delays):.2f} ms")
    print(f"B's recall when nothing changed since: p50 {pct(idle, 50):.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--memories", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--url", help="a PostgreSQL database to use instead of starting a local server")
    ap.add_argument("--quick", action="store_true", help="small numbers (a smoke run)")
    ap.add_argument("--no-fsync", action="store_true", help="start the local server with fsync off (smoke runs)")
    ap.add_argument("--only", default="stages,ingest,sync,memory,fleet",
                    help="comma-separated sections to run (default: all of stages,ingest,sync,memory,fleet)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.reps, args.memories, args.queries = 40, 1, 1000, 10
    folder = tempfile.mkdtemp(prefix="tracemem-bench-pg-", dir="/tmp")
    server = None
    try:
        url = args.url
        if url is None:
            from tracemem.store.pg.local import LocalServer

            pg_folder = tempfile.mkdtemp(prefix="tracemem-bench-server-", dir="/tmp")  # reachable by `nobody`
            server = LocalServer.start(pg_folder, durable=not args.no_fsync)
            url = server.ensure_database("bench")
        started = f"started here, fsync {'off' if args.no_fsync else 'on'}"
        print(f"PostgreSQL: {url.split('@')[-1]} ({started if server else 'given'}); "
              f"DuckDB: files in {folder}")
        tag = uuid.uuid4().hex[:8]  # this run's schemas, beside anything else in a given database

        def duck(name: str, **kwargs: Any) -> Store:
            return Store(os.path.join(folder, f"{name}.duckdb"), **kwargs)

        def pg(name: str, **kwargs: Any) -> Store:
            return Store(f"{url}{'&' if '?' in url else '?'}schema=bench_{name}_{tag}", **kwargs)

        places = {"duckdb": duck, "postgres": pg}
        only = set(args.only.split(","))
        if "stages" in only:
            stage_costs(places, args.runs, args.reps)
        if "ingest" in only:
            ingest(places, args.runs)
        if "sync" in only:
            sync_costs(places, max(20, args.runs // 20))
        if "memory" in only:
            memory_search(places, args.memories, args.queries)
        if "fleet" in only:
            cross_process(f"{url}{'&' if '?' in url else '?'}schema=bench_fleet_{tag}", 5 if args.quick else 40)
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.directory, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
