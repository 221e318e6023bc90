"""Instructions per stage, counted by valgrind: figures a noisy shared machine cannot move.

    python bench/instructions.py [--runs N] [--variants plain,engine,fi0]

Timings on these machines wander by ±25% from one process to the next (another tenant, the
CPU's clock), so a change worth 5% cannot be seen in µs without many repetitions. An
instruction count can: `valgrind --tool=callgrind` counts what the CPU executes, the same for
the same code and input whatever else the machine is doing. Each variant runs the 10-stage
pipeline of bench/overhead.py in a child under callgrind: it sets up, runs 20 times to warm up,
then calls os.getppid() before its --runs runs and os.getpgrp() after them, and callgrind dumps
its counts on entering each (`--dump-before`), so the second dump holds exactly those runs.
Counting the whole child and differencing two run counts, as this script did before, let
start-up noise in: Python re-lists a folder on its path whenever that folder's mtime moved,
and other tests and benches make and remove temporary folders in the checkout, so one
child's imports cost 3.9 million instructions more while a loop made folders there, and CI
printed -4,379 per stage for plain Python. Before the runs the child collects garbage and
freezes what start-up made (`gc.freeze()`), so a collection during the runs walks only what
the runs made, and whether one falls inside them no longer depends on how much start-up
allocated. Counted per thread:
- plain python: the same ten function calls on a dict (the baseline);
- engine: `flow.run({})`, no store;
- fi0: `flow.run({}, store=...)` on a file with `flush_interval=0` (journaled before
  `flow.run` returns). No final flush is counted (the child exits without one): how much of
  the folding it leaves to the flow's thread depends on how far the background writer got,
  which is scheduling, not code (counts that included it, 82.0k and 74.9k, differed by 9% for
  two versions whose engines differ by 1%). What the writer does stays with bench/peers.py's timings.
Only the main thread (the flow's) is counted: under valgrind threads take turns, and DuckDB's
workers spin while they wait for a task, so their counts would measure waiting, not work (and
without --fair-sched=yes a spinning worker can starve the flow's thread for minutes).
Instructions are not time (a cache miss or a GIL wait costs no instruction), so the µs
figures stay with bench/overhead.py and bench/peers.py; this says what the code asks for.
Needs valgrind (Debian: apt-get install valgrind); without it, says so and exits 0.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import gc
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.overhead import STAGES  # noqa: E402

VARIANTS = ("plain", "engine", "fi0")
LABELS = {"plain": "plain python (dict)", "engine": "tracemem engine (no store)",
          "fi0": "tracemem store, flush_interval=0"}


WARM_UP = 20  # runs: Python 3.11 specializes a function's bytecode only after it has run a few times


def counted_runs(run: Callable[[], Any], runs: int) -> None:
    """Warm-up runs, then `runs` runs between the two calls callgrind dumps its counts on."""
    for _ in range(WARM_UP):
        run()
    gc.collect()
    gc.freeze()
    os.getppid()  # callgrind: --dump-before=getppid (what came before: set-up)
    for _ in range(runs):
        run()
    os.getpgrp()  # callgrind: --dump-before=getpgrp (what came before: the runs)


def child(variant: str, runs: int, folder: str) -> None:
    """Run the variant (inside callgrind)."""
    from bench.overhead import build_flow, make_plain
    from bench.peer_pipelines import initial

    if variant == "plain":
        stages = [make_plain(i) for i in range(STAGES)]

        def plain() -> None:
            d = initial()
            for stage in stages:
                stage(d)
        counted_runs(plain, runs)
        return
    flow = build_flow("instructions")
    if variant == "engine":
        counted_runs(lambda: flow.run({}), runs)
        return
    from tracemem.store import Store

    store = Store(os.path.join(folder, "fi0.duckdb"), durability="run", flush_interval=0)
    counted_runs(lambda: flow.run({}, store=store), runs)
    os._exit(0)  # no flush or close (see the docstring); every run is in the journal already


ENV = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def counted(variant: str, runs: int, folder: str) -> int:
    """The main thread's instructions over the runs of one child under callgrind."""
    out = os.path.join(folder, f"{variant}.cg")
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--fair-sched=yes", f"--callgrind-out-file={out}",
           "--dump-before=getppid", "--dump-before=getpgrp",
           sys.executable, os.path.abspath(__file__), "--child", variant, str(runs), folder]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind child {variant} exited {proc.returncode}: {proc.stderr[-2000:]}")
    dumps = sorted(glob.glob(out + ".*-01"))  # one file per dump and thread: -01 is the main thread
    if dumps != [out + ".1-01", out + ".2-01"]:  # another caller of either marker would move the window
        raise RuntimeError(f"callgrind child {variant}: expected two dumps (set-up, runs), got {dumps}")
    with open(out + ".2-01") as f:
        found = re.search(r"^(?:summary|totals):\s*(\d+)", f.read(), re.M)
    for path in glob.glob(out + "*"):
        os.remove(path)
    if found is None:
        raise RuntimeError(f"callgrind wrote no total for {variant}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400, help="runs counted per variant, after the warm-up")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("instructions: valgrind not found (Debian: apt-get install valgrind); nothing counted")
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        ap.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; choose from {','.join(VARIANTS)}")
    folder = tempfile.mkdtemp(prefix="tracemem-instructions-", dir=os.getcwd())
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:  # two children at a time: counts do not depend on it
            got = dict(zip(variants, pool.map(lambda v: counted(v, args.runs, folder), variants)))
        rows = {v: got[v] / (args.runs * STAGES) for v in variants}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"instructions per stage ({STAGES}-stage pipeline, callgrind, {args.runs} runs after {WARM_UP} to warm up)")
    base = rows.get("plain")
    print(f"  {'variant':<36} {'flow thread':>12} {'× plain':>9}")
    for v, flow in rows.items():
        ratio = f"{flow / base:>9.1f}" if base else f"{'-':>9}"
        print(f"  {LABELS[v]:<36} {flow:>12,.0f} {ratio}")


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--child":
    child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
elif __name__ == "__main__":
    main()
