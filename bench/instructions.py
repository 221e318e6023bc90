"""Instructions per stage, counted by valgrind: figures a noisy shared machine cannot move.

    python bench/instructions.py [--runs N] [--variants plain,engine,fi0]

Timings on these machines wander by ±25% from one process to the next (another tenant, the
CPU's clock), so a change worth 5% cannot be seen in µs without many repetitions. An
instruction count can: `valgrind --tool=callgrind` counts what the CPU executes, the same for
the same code and input whatever else the machine is doing. Each variant runs the 10-stage
pipeline of bench/overhead.py in a child under callgrind twice, with --runs and 5×--runs runs,
and the difference is divided by the stages between them, so start-up (imports, opening
the store) cancels out. Each variant first runs once outside callgrind, so both counted children
import the same compiled modules: in a fresh checkout, two children compiling them side by side
raced to write the bytecode cache, and one of them counted the compiling (a plain-Python figure
of -2,868 per stage, in CI). Counted per thread:
- plain python: the same ten function calls on a dict (the baseline);
- engine: `flow.run({})`, no store;
- fi0: `flow.run({}, store=...)` on a file with `flush_interval=0` (journaled before
  `flow.run` returns). The child exits right after its runs, without a flush or `close()`:
  how much of the folding a final flush leaves to the flow's thread depends on how far the
  background writer got, which is scheduling, not code (counts that included it, 82.0k and
  74.9k, differed by 9% for two versions whose engines differ by 1%), and `close()`'s checkpoint is not what the timed
  benches measure. What the writer does stays with bench/peers.py's timings.
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
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.overhead import STAGES  # noqa: E402

VARIANTS = ("plain", "engine", "fi0")
LABELS = {"plain": "plain python (dict)", "engine": "tracemem engine (no store)",
          "fi0": "tracemem store, flush_interval=0"}


def child(variant: str, runs: int, folder: str) -> None:
    """Run `runs` runs of the variant (inside callgrind)."""
    from bench.overhead import build_flow, make_plain
    from bench.peer_pipelines import initial

    if variant == "plain":
        stages = [make_plain(i) for i in range(STAGES)]
        for _ in range(runs):
            d = initial()
            for stage in stages:
                stage(d)
        return
    flow = build_flow("instructions")
    if variant == "engine":
        for _ in range(runs):
            flow.run({})
        return
    from tracemem.store import Store

    store = Store(os.path.join(folder, f"fi0-{runs}.duckdb"), durability="run", flush_interval=0)
    for _ in range(runs):
        flow.run({}, store=store)
    os._exit(0)  # no flush or close (see the docstring); every run is in the journal already


ENV = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def child_command(variant: str, runs: int, folder: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--child", variant, str(runs), folder]


def counted(variant: str, runs: int, folder: str) -> int:
    """The main thread's instructions in one child under callgrind."""
    out = os.path.join(folder, f"{variant}-{runs}.cg")
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--fair-sched=yes", f"--callgrind-out-file={out}",
           *child_command(variant, runs, folder)]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind child {variant} {runs} exited {proc.returncode}: {proc.stderr[-2000:]}")
    with open(out + "-01") as f:  # one file per thread: -01 is the main thread
        found = re.search(r"^(?:summary|totals):\s*(\d+)", f.read(), re.M)
    for path in glob.glob(out + "-*"):
        os.remove(path)
    if found is None:
        raise RuntimeError(f"callgrind wrote no total for {variant} {runs}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="runs of the shorter child (the longer runs 5×)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("instructions: valgrind not found (Debian: apt-get install valgrind); nothing counted")
        return
    variants = [v for v in args.variants.split(",") if v]
    stages = 4 * args.runs * STAGES
    folder = tempfile.mkdtemp(prefix="tracemem-instructions-", dir=os.getcwd())
    try:
        for v in variants:  # once outside callgrind: the bytecode cache holds what the children import
            subprocess.run(child_command(v, 1, folder), cwd=ROOT, env=ENV, capture_output=True, check=True)
        jobs = [(v, n) for v in variants for n in (args.runs, 5 * args.runs)]
        with ThreadPoolExecutor(max_workers=2) as pool:  # two children at a time: counts do not depend on it
            got = dict(zip(jobs, pool.map(lambda job: counted(job[0], job[1], folder), jobs)))
        rows = {v: (got[v, 5 * args.runs] - got[v, args.runs]) / stages for v in variants}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"instructions per stage ({STAGES}-stage pipeline, callgrind, {args.runs} vs {5 * args.runs} runs "
          f"differenced)")
    base = rows.get("plain")
    print(f"  {'variant':<36} {'flow thread':>12} {'× plain':>9}")
    for v, flow in rows.items():
        ratio = f"{flow / base:>9.1f}" if base else f"{'-':>9}"
        print(f"  {LABELS[v]:<36} {flow:>12,.0f} {ratio}")


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--child":
    child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
elif __name__ == "__main__":
    main()
