"""The store's costs: µs per stage with every step recorded, ingest rate, and bytes per chat turn.

    python bench/store.py [--runs N] [--turns 500]

1. The 10-stage pipeline of bench/overhead.py recorded into a DuckDB file, with
   durability "run" (amortized, including the final flush) and "stage", next to
   the engine alone and plain Python, interleaved in one process.
2. Events (rows) per second ingested by the batched Arrow writer.
3. A chat of N turns, one run per turn resuming the previous one: each turn reads
   the history and appends a 200-character user message and a 200-character
   reply. File size after a CHECKPOINT at 50/100/200/500 turns and the fitted
   growth exponent (1 = linear, 2 = quadratic).
4. A producer faster than the writer (bench/pressure.py): the bounded queue's depth
   and lag next to an unbounded one, and what a SIGKILL loses per durability mode
   (`--pressure-seconds 0` skips it).
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import atexit
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from pydantic import BaseModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.overhead import STAGES, build_flow, make_plain, FIELDS  # noqa: E402
from bench.pressure import report as pressure_report  # noqa: E402
from bench.timing import queue_whole  # noqa: E402
from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402


class Chat(BaseModel):
    user: str = ""
    messages: list[dict[str, str]] = []
    reply: str = ""


def respond(scope: Chat) -> None:
    history = scope.messages
    scope.messages.append({"role": "user", "content": scope.user})
    scope.reply = ("ok " * 70)[:200] if len(history) >= 0 else ""
    scope.messages.append({"role": "assistant", "content": scope.reply})


CHAT = Pipeline("chat", Chat).then(respond).build()


def file_bytes(store: Store) -> int:
    """Size of the file after a checkpoint (DuckDB allocates it in blocks of store.block_size)."""
    store.flush()
    with store.lock:
        store.con.execute("CHECKPOINT")
    size = os.path.getsize(store.path)
    if os.path.exists(store.path + ".wal"):
        size += os.path.getsize(store.path + ".wal")
    return size


def chat_growth(turns: int, folder: str, marks: tuple[int, ...] = (50, 100, 200, 500)) -> list[tuple[int, int]]:
    path = os.path.join(folder, "chat.duckdb")
    store = Store(path)
    base = file_bytes(store)
    sizes = [(0, base)]
    previous = None
    message = ("hello there " * 20)[:200]
    for turn in range(1, turns + 1):
        previous = CHAT.run({"user": message}, resume=previous, store=store)
        if turn in marks or turn == turns:
            sizes.append((turn, file_bytes(store)))
    store.close()
    return sizes


def growth_exponent(points: list[tuple[int, int]]) -> float:
    """Slope of log(bytes added) over log(turns)."""
    base = points[0][1]
    xs = [math.log(t) for t, b in points[1:] if b > base]
    ys = [math.log(b - base) for t, b in points[1:] if b > base]
    if len(xs) < 2:
        return float("nan")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def per_stage(fn: Any, runs: int, after: Any = None) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    if after:
        after()
    return (time.perf_counter() - start) / runs / STAGES * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--pressure-seconds", type=float, default=3.0)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="tracemem-bench-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    flow = build_flow()
    plain = [make_plain(i) for i in range(STAGES)]
    store_run = Store(os.path.join(folder, "run.duckdb"), durability="run")
    store_stage = Store(os.path.join(folder, "stage.duckdb"), durability="stage")
    store_sync = Store(os.path.join(folder, "sync.duckdb"), durability="run", flush_interval=0)

    def run_plain() -> None:
        d = {f: i for i, f in enumerate(FIELDS)}
        for stage in plain:
            stage(d)

    # every store variant runs as many runs: each measurement ends with a flush (a DuckDB commit of ~5 ms),
    # which over a twentieth of the runs made the journaled modes look 30% slower than they are
    stage_runs = args.runs
    variants = {
        "plain python (dict)": (lambda: run_plain(), None, args.runs),
        "engine only (no store)": (lambda: flow.run({}), None, args.runs),
        "store, durability=run": (lambda: flow.run({}, store=store_run), store_run.flush, args.runs),
        "store, run, flush_interval=0": (lambda: flow.run({}, store=store_sync), store_sync.flush, stage_runs),
        "store, durability=stage": (lambda: flow.run({}, store=store_stage), store_stage.flush, stage_runs),
    }
    results: dict[str, list[float]] = {k: [] for k in variants}
    flow.run({}, store=store_run)
    for _ in range(args.reps):
        for label, (fn, after, runs) in variants.items():
            results[label].append(per_stage(fn, runs, after))
    print(f"## µs per stage, 10-stage pipeline, every read/write recorded ({args.reps} reps, interleaved)")
    print("goal: ≤ 20 µs/stage amortized with durability 'run'")
    base = statistics.median(results["plain python (dict)"])
    print(f"{'variant':<28} {'median':>9} {'min–max':>17} {'× plain':>9}")
    for label, values in results.items():
        med = statistics.median(values)
        print(f"{label:<28} {med:>9.2f} {min(values):>8.2f}–{max(values):<8.2f} {med / base:>9.1f}")

    # ingest: pre-built runs, one flush
    runs = [flow.run({}) for _ in range(args.runs)]
    rows = sum(1 + len(r.steps) + len(r.reads) + len(r.writes) + len(r.decisions) for r in runs)
    ingest = Store(os.path.join(folder, "ingest.duckdb"))
    start = time.perf_counter()
    for r in runs:
        queue_whole(ingest, r)
    ingest.flush()
    elapsed = time.perf_counter() - start
    print(f"\n## ingest: {rows:,} rows from {len(runs):,} runs in {elapsed * 1000:.0f} ms = "
          f"{rows / elapsed:,.0f} events/s (goal ≥ 100,000/s)")
    for s in (store_run, store_stage, store_sync, ingest):
        s.close()

    points = chat_growth(args.turns, folder)
    print(f"\n## {args.turns}-turn chat (one run per turn, resume=previous; 200-char message + 200-char reply)")
    print(f"{'turns':>6} {'file bytes':>12} {'added':>12} {'bytes/turn':>11}")
    for turns, size in points:
        added = size - points[0][1]
        print(f"{turns:>6} {size:>12,} {added:>12,} {added / turns if turns else 0:>11,.0f}")
    print(f"growth exponent {growth_exponent(points):.2f} (1 = linear); "
          f"added over {points[-1][0]} turns: {(points[-1][1] - points[0][1]) / 1e6:.2f} MB (goal ≤ 1 MB)")
    if args.pressure_seconds > 0:
        pressure_report(args.pressure_seconds, threads=2)


if __name__ == "__main__":
    main()
