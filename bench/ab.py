"""Two checkouts of tracemem side by side: µs per stage of each store mode, interleaved.

    git worktree add /tmp/before <rev>            # the checkout to compare against
    python bench/ab.py --before /tmp/before [--modes run,zero,stage,stage-fsync] [--reps 7]

Why: on a shared machine a figure from another day says little; a change is "no slower"
only against its baseline measured in the same minutes. Each repetition runs one child
process per checkout and mode, alternating which goes first; a child imports tracemem from
its checkout only, runs bench/overhead.py's 10-stage pipeline into a fresh DuckDB file and
times the runs and the final flush (what reaching the tables costs). Prints medians and the
after/before ratio of the wall-clock time and of the process's CPU time (all threads: the flow's, the
writer's, DuckDB's), which other load on a shared machine disturbs less; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {"run": ("{}", 1500), "zero": ('{"flush_interval": 0}', 300), "stage": ('{"durability": "stage"}', 300),
         "stage-fsync": ('{"durability": "stage", "fsync": True}', 40)}  # both checkouts need fsync=

CHILD = """
import ast, os, shutil, sys, tempfile, time
tree, bench, options, runs = sys.argv[1], sys.argv[2], ast.literal_eval(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, tree)
import tracemem
assert tracemem.__file__.startswith(tree), f"tracemem came from {tracemem.__file__}, not {tree}"
sys.path.insert(1, bench)
from bench.overhead import build_flow
from tracemem.store import Store
folder = tempfile.mkdtemp(dir=bench)
flow = build_flow()
try:
    with Store(os.path.join(folder, "ab.duckdb"), **options) as store:
        for _ in range(20):
            flow.run({}, store=store)
        store.flush()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(runs):
            flow.run({}, store=store)
        store.flush()
        print((time.perf_counter() - start) / runs / 10 * 1e6, (time.process_time() - cpu) / runs / 10 * 1e6)
finally:
    shutil.rmtree(folder)
"""


def measure(tree: str, mode: str) -> tuple[float, float]:
    options, runs = MODES[mode]
    done = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(tree), HERE, options, str(runs)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{tree} ({mode}) failed:\n{done.stderr[-2000:]}")
    wall, cpu = map(float, done.stdout.split())
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout of the baseline (git worktree add DIR REV)")
    ap.add_argument("--after", default=HERE, help="the checkout measured against it (default: this one)")
    ap.add_argument("--modes", default="run,zero,stage", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    trees = {"before": args.before, "after": args.after}
    modes = args.modes.split(",")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {(t, m): [] for t in trees for m in modes}
    for rep in range(args.reps):
        for mode in modes:
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for which in order:
                results[(which, mode)].append(measure(trees[which], mode))
    for title, part in (("wall-clock", 0), ("CPU time of the process (all threads; less sensitive to other load)", 1)):
        print(f"## µs per stage, {title}, 10-stage pipeline, runs + final flush ({args.reps} reps, interleaved, "
              f"load average {os.getloadavg()[0]:.1f})")
        print(f"{'mode':<12} {'before':>9} {'after':>9} {'after/before':>13}   before min–max      after min–max")
        for mode in modes:
            b, a = ([r[part] for r in results[(t, mode)]] for t in ("before", "after"))
            print(f"{mode:<12} {statistics.median(b):>9.1f} {statistics.median(a):>9.1f} "
                  f"{statistics.median(a) / statistics.median(b):>13.2f}   {min(b):>7.1f}–{max(b):<9.1f} "
                  f"{min(a):>7.1f}–{max(a):.1f}")

if __name__ == "__main__":
    main()
