"""Scale: long conversation threads and big stores.

    python bench/scale.py [--turns 1000] [--heap-turns 500,1000,2000,4000] [--runs 1000000]
                          [--prune-runs 100000] [--build-seconds 600] [--quick]

1. A 1,000-turn conversation thread (one run per turn, `resume=` the previous run)
   recorded into a file. In a fresh process: open the file and backtrack the last
   turn's `reply` (first call, then the median of 5 more); the same through the CLI
   (`tracemem backtrack RUN reply`, wall clock, start-up included) beside the CLI's
   bare start-up (`tracemem --help`).
2. `resume=<run id>` per turn at turn 1,000 (and at turn 10, to show whether the
   cost grows with the thread).
3. Python heap (tracemalloc) of a live thread continued with the `Run` itself, at
   500/1k/2k/4k turns, and the fitted exponent (1 = linear).
4. A 1M-run store built once (columnar inserts straight into the tables, time-boxed:
   the size reached and the time taken are printed): `store.runs(limit=20)` and
   `store.run(id)` (random ids). A 100k-run store: `prune(keep_last=100)`.
Memory-search figures are bench/memory_scale.py's. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pydantic import BaseModel  # noqa: E402

from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402
from tracemem.store.tables import index  # noqa: E402


class Chat(BaseModel):
    user: str = ""
    messages: list[dict[str, str]] = []
    reply: str = ""


def respond(scope: Chat) -> None:
    history = scope.messages
    scope.messages.append({"role": "user", "content": scope.user})
    scope.reply = f"reply {len(history) // 2}: " + ("ok " * 60)[:160]
    scope.messages.append({"role": "assistant", "content": scope.reply})


CHAT = Pipeline("scale-chat", Chat).then(respond).build()
MESSAGE = ("hello there " * 20)[:160]


def fit_exponent(points: list[tuple[int, float]]) -> float:
    """Slope of log(y) over log(x): 1 = linear, 2 = quadratic."""
    xs = [math.log(x) for x, y in points if y > 0]
    ys = [math.log(y) for x, y in points if y > 0]
    if len(xs) < 2:
        return float("nan")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def verdict(value: float, goal: float) -> str:
    return "met" if value <= goal else f"gap ×{value / goal:.1f}"


# -- 1. a long thread -------------------------------------------------------------
def build_thread(path: str, turns: int) -> list[str]:
    ids: list[str] = []
    with Store(path) as store:
        previous = None
        for turn in range(turns):
            previous = CHAT.run({"user": f"{turn}: {MESSAGE}"}, store=store, resume=previous)
            ids.append(previous.run_id)
    return ids


def child_backtrack(path: str, run_id: str) -> None:
    """Run in a fresh process: open, backtrack once (cold), then 5 more times."""
    t0 = time.perf_counter()
    store = Store(path, read_only=True)
    opened = time.perf_counter()
    trace = store.run(run_id).backtrack("reply")
    first = time.perf_counter()
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        store.run(run_id).backtrack("reply")
        warm.append(time.perf_counter() - t)
    store.close()
    print(json.dumps({"open": opened - t0, "first": first - opened, "warm": statistics.median(warm),
                      "nodes": trace.graph.number_of_nodes(), "edges": trace.graph.number_of_edges(),
                      "runs": len(trace.runs()), "truncated": trace.truncated}))


def fresh(*argv: str) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stderr}")
    return elapsed, out.stdout


def cli() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "tracemem")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "stages.cli"]


def bench_backtrack(folder: str, turns: int, reps: int) -> dict[str, Any]:
    path = os.path.join(folder, "thread.duckdb")
    t = time.perf_counter()
    ids = build_thread(path, turns)
    built = time.perf_counter() - t
    children = [json.loads(fresh(sys.executable, __file__, "--child-backtrack", path, ids[-1])[1])
                for _ in range(reps)]
    python = statistics.median(fresh(sys.executable, "-c", "pass")[0] for _ in range(reps))
    startup = statistics.median(fresh(*cli(), "--help")[0] for _ in range(reps))
    through_cli = statistics.median(fresh(*cli(), "backtrack", ids[-1], "reply", "--db", path)[0]
                                    for _ in range(reps))
    shape = children[0]
    print(f"\n## backtrack the last reply of a {turns}-turn thread (built in {built:.1f} s), fresh process, "
          f"median of {reps}")
    print(f"trace: {shape['nodes']} nodes, {shape['edges']} edges, {shape['runs']} runs, "
          f"truncated={shape['truncated']}")
    first = statistics.median(c["first"] for c in children) * 1e3
    print(f"{'measure':<46} {'figure':>10} {'goal':>10}  verdict")
    print(f"{'open the file (Store, read-only)':<46} {statistics.median(c['open'] for c in children) * 1e3:>7.1f} ms "
          f"{'':>10}")
    print(f"{'backtrack from the file, first call':<46} {first:>7.1f} ms {'≤ 50 ms':>10}  {verdict(first, 50)}")
    print(f"{'backtrack from the file, warm (median of 5)':<46} "
          f"{statistics.median(c['warm'] for c in children) * 1e3:>7.1f} ms")
    print(f"{'python -c pass':<46} {python:>8.2f} s")
    print(f"{'CLI start-up (tracemem --help)':<46} {startup:>8.2f} s")
    print(f"{'CLI backtrack RUN reply, start-up included':<46} {through_cli:>8.2f} s {'≤ 0.8 s':>10}  "
          f"{verdict(through_cli, 0.8)}")
    return {"path": path, "ids": ids}


# -- 2. resume by id ----------------------------------------------------------------
def per_turn_by_id(path: str, last: str, turns: int) -> tuple[float, float]:
    """(ms of the first turn resumed by id on a freshly opened store, median ms per turn after it)."""
    with Store(path) as store:
        t = time.perf_counter()
        previous = CHAT.run({"user": "first"}, store=store, resume=last).run_id
        first = time.perf_counter() - t
        times = []
        for turn in range(turns):
            t = time.perf_counter()
            previous = CHAT.run({"user": f"more {turn}"}, store=store, resume=previous).run_id
            times.append(time.perf_counter() - t)
    return first * 1e3, statistics.median(times) * 1e3


def per_turn_live(path: str, last: str, turns: int) -> float:
    """Median ms per turn continuing with the `Run` itself (the comparison: no lookup by id)."""
    with Store(path) as store:
        previous: Any = store.run(last, scope=Chat)
        times = []
        for turn in range(turns):
            t = time.perf_counter()
            previous = CHAT.run({"user": f"live {turn}"}, store=store, resume=previous)
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_resume(folder: str, thread: dict[str, Any], turns: int) -> None:
    long_copy = os.path.join(folder, "resume-long.duckdb")
    shutil.copyfile(thread["path"], long_copy)
    short = os.path.join(folder, "resume-short.duckdb")
    short_ids = build_thread(short, 10)
    first_10, at_10 = per_turn_by_id(short, short_ids[-1], 20)
    first_n, at_n = per_turn_by_id(long_copy, thread["ids"][-1], 20)
    live_n = per_turn_live(long_copy, thread["ids"][-1], 20)
    print(f"\n## resume=<run id>: ms per turn, `flow.run(..., resume=previous_run_id)` in a loop (median of 20), "
          f"and the first such turn after opening the file (its thread replayed from the file once)")
    print(f"{'measure':<46} {'figure':>10} {'goal':>10}  verdict")
    print(f"{'per turn at turn 10':<46} {at_10:>7.2f} ms")
    print(f"{f'per turn at turn {turns}':<46} {at_n:>7.2f} ms {'≤ 2 ms':>10}  {verdict(at_n, 2)}")
    print(f"{f'resume=<the Run itself>, per turn at turn {turns}':<46} {live_n:>7.2f} ms")
    print(f"{'first turn after opening, at turn 10':<46} {first_10:>7.2f} ms")
    print(f"{f'first turn after opening, at turn {turns}':<46} {first_n:>7.2f} ms")
    print(f"growth of the per-turn cost from turn 10 to turn {turns}: ×{at_n / at_10:.2f} (1 = flat)")


# -- 3. heap of a live thread ---------------------------------------------------------
def heap_points(marks: list[int], folder: Optional[str]) -> list[tuple[int, float]]:
    store = Store(os.path.join(folder, "heap.duckdb")) if folder else None
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    points = []
    previous = None
    for turn in range(1, max(marks) + 1):
        previous = CHAT.run({"user": f"{turn}: {MESSAGE}"}, store=store, resume=previous)
        if turn in marks:
            if store is not None:
                store.flush()
            gc.collect()
            points.append((turn, (tracemalloc.get_traced_memory()[0] - base) / 1e6))
    tracemalloc.stop()
    if store is not None:
        store.close()
    return points


def bench_heap(folder: str, marks: list[int]) -> None:
    print(f"\n## Python heap (tracemalloc) of a live thread continued with the Run itself")
    print(f"{'turns':>8} {'with a store MB':>16} {'no store MB':>12}")
    with_store = heap_points(marks, folder)
    without = heap_points(marks, None)
    for (turns, a), (_, b) in zip(with_store, without):
        print(f"{turns:>8} {a:>16.1f} {b:>12.1f}")
    print(f"heap growth exponent: {fit_exponent(with_store):.2f} with a store, {fit_exponent(without):.2f} "
          f"without (goal: linear in turns, 1.0)")


# -- 4. big stores -----------------------------------------------------------------------
RUN_ID = "lower(lpad(to_hex(hash(i + {seed})), 16, '0'))"  # 16 hex characters, as tracemem.ids makes them


def fill(con: Any, start: int, stop: int, seed: int) -> None:
    """Runs start..stop of a 3-stage pipeline (3 steps, reads, writes; a model call with a prompt of 2
    sections; a memory use), in run order, as the writer would insert them (one batch per table)."""
    rid = RUN_ID.format(seed=seed)
    at = "make_timestamp_ns(1700000000000000000 + i * 1000000000)"  # one run a second
    rng = f"range({start}, {stop}) t(i)"
    con.execute(f"""INSERT INTO runs (run_id, pipeline, pipeline_hash, status, started_at, ended_at, input, output,
        pid, host, subject, query) SELECT {rid}, 'bench', 'h1', 'ok', {at}, {at} + INTERVAL 3 MILLISECOND,
        '{{"question": "q' || i || '"}}', '{{"answer": "a' || i || '"}}', 1, 'bench', 'user' || (i % 1000),
        'q' || i FROM {rng}""")
    con.execute(f"""INSERT INTO steps (run_id, step, stage, name, kind, iteration, status, started_at, ended_at)
        SELECT {rid}, s, 'stage' || s, 'stage' || s, 'stage', 0, 'ok', {at}, {at} FROM {rng}, range(3) u(s)
        ORDER BY i, s""")
    con.execute(f"""INSERT INTO reads SELECT {rid}, s, 0, CASE s WHEN 0 THEN 'question' ELSE 'draft' END,
        CASE s WHEN 0 THEN NULL ELSE s - 1 END, CASE s WHEN 0 THEN NULL ELSE 0 END FROM {rng}, range(3) u(s)
        ORDER BY i, s""")
    con.execute(f"""INSERT INTO writes SELECT {rid}, s, 0, CASE s WHEN 2 THEN 'answer' ELSE 'draft' END, 'set',
        '"v' || i || '"' FROM {rng}, range(3) u(s) ORDER BY i, s""")
    con.execute(f"""INSERT INTO model_calls (run_id, step, call_id, model, provider, prompt_id, response,
        input_tokens, output_tokens, latency_ms) SELECT {rid}, 1, 'c' || i, 'm', 'p', 'p' || i, 'r', 10, 5, 1.0
        FROM {rng}""")
    con.execute(f"""INSERT INTO prompts SELECT 'p' || i, {rid}, 1, 'text', NULL FROM {rng}""")
    con.execute(f"""INSERT INTO prompt_sections (prompt_id, idx, kind, text, start_char, end_char, source_kind,
        source_id, run_id, step) SELECT 'p' || i, k, 'rules', 'text', 0, 4, NULL, NULL, {rid}, 1
        FROM {rng}, range(2) u(k) ORDER BY i, k""")
    con.execute(f"""INSERT INTO memory_uses SELECT {rid}, 0, 'm' || (i % 5000), 'injected', NULL, 0.5, 0
        FROM {rng}""")


def build_store(path: str, runs: int, seconds: float, seed: int = 0) -> tuple[int, float]:
    """Fill a store with up to `runs` runs within `seconds`; returns (runs built, seconds taken)."""
    chunk = 100_000 if runs >= 200_000 else max(1, runs // 4)
    start = time.perf_counter()
    built = 0
    with Store(path) as store:
        with store.lock:
            while built < runs and time.perf_counter() - start < seconds:
                n = min(chunk, runs - built)
                store.con.execute("BEGIN TRANSACTION")
                fill(store.con, built, built + n, seed)
                store.con.execute("COMMIT")
                built += n
                index(store.con)  # as the writer does once the store holds INDEX_FROM runs: later rows are indexed
            store.con.execute("CHECKPOINT")
    return built, time.perf_counter() - start


def median_ms(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_big(folder: str, runs: int, prune_runs: int, seconds: float) -> None:
    path = os.path.join(folder, "big.duckdb")
    built, took = build_store(path, runs, seconds)
    print(f"\n## a store of {built:,} runs (built in {took:.1f} s, time box {seconds:.0f} s"
          f"{'' if built == runs else f'; stopped short of {runs:,}'}), {os.path.getsize(path) / 1e6:.0f} MB")
    rid = RUN_ID.format(seed=0)
    with Store(path, read_only=True) as store:
        wanted = [r[0] for r in store.sql(
            f"SELECT {rid} FROM range(0, {built}) t(i) USING SAMPLE 25 ROWS").fetchall()]
        listing = store.runs(limit=20)
        assert len(listing) == 20 and listing[0]["steps"] == 3
        first_list = median_ms(lambda: store.runs(limit=20), 1)
        lists = median_ms(lambda: store.runs(limit=20), 15)
        first_run = median_ms(lambda: store.run(wanted[0]), 1)
        ids = iter(wanted[1:])
        point = median_ms(lambda: store.run(next(ids)), 20)
    print(f"{'measure':<46} {'figure':>10} {'goal':>10}  verdict")
    print(f"{f'store.runs(limit=20) at {built:,} runs':<46} {lists:>7.2f} ms {'≤ 5 ms':>10}  {verdict(lists, 5)}"
          f"   (first call {first_list:.1f} ms)")
    print(f"{f'store.run(id) at {built:,} runs, random ids':<46} {point:>7.2f} ms {'≤ 10 ms':>10}  "
          f"{verdict(point, 10)}   (first call {first_run:.1f} ms)")
    if built >= 10 * prune_runs:  # the other shape: a slice of a big store (its indexes are updated, not rebuilt)
        with Store(path) as store:
            t = time.perf_counter()
            report = store.prune(keep_last=built - prune_runs)
            elapsed = time.perf_counter() - t
        print(f"{f'prune of the oldest {len(report.runs):,} of {built:,} runs':<46} {elapsed:>8.2f} s")
    os.remove(path)
    small = os.path.join(folder, "prune.duckdb")
    built, took = build_store(small, prune_runs, seconds, seed=1)
    with Store(small) as store:
        t = time.perf_counter()
        report = store.prune(keep_last=100)
        elapsed = time.perf_counter() - t
        left = store.sql("SELECT count(*) FROM runs").fetchall()[0][0]
    print(f"{f'prune(keep_last=100) of {built:,} runs':<46} {elapsed:>8.2f} s {'≤ 1 s':>10}  {verdict(elapsed, 1)}"
          f"   (removed {len(report.runs):,}, {left:,} left; built in {took:.1f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--heap-turns", default="500,1000,2000,4000")
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--prune-runs", type=int, default=100_000)
    ap.add_argument("--build-seconds", type=float, default=600, help="time box for building the big store")
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per CLI/backtrack figure")
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes")
    ap.add_argument("--child-backtrack", nargs=2, metavar=("PATH", "RUN"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_backtrack:
        child_backtrack(*args.child_backtrack)
        return
    if args.quick:
        args.turns, args.heap_turns, args.runs, args.prune_runs, args.reps = 100, "50,100,200", 20_000, 5_000, 1
    folder = tempfile.mkdtemp(prefix="tracemem-scale-")
    try:
        random.seed(0)
        thread = bench_backtrack(folder, args.turns, args.reps)
        bench_resume(folder, thread, args.turns)
        bench_heap(folder, [int(x) for x in args.heap_turns.split(",")])
        bench_big(folder, args.runs, args.prune_runs, args.build_seconds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
