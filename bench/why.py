"""`why` beside `backtrack` on long records, each from the file in a fresh process.

    python bench/why.py [--turns 1000] [--steps 10000] [--reps 3] [--quick]

1. A 1,000-turn conversation thread (bench/scale.py's chat: one run per turn, `resume=` the previous
   run), the last turn's `reply`;
2. one run of 10,000 steps (a read → think loop whose answer rests on every round), its `answer`.

For each, fresh processes open the file and answer once: `store.run(id).backtrack(path)` (what
`tracemem backtrack` and the viewer's full graph do) and `why(store.run(id), path)` (the walk, then
the sources ranked, with their folded paths), then the same five more times warm; and the CLI,
start-up included: `tracemem backtrack RUN PATH` beside `tracemem why RUN PATH`. Medians over
`--reps` processes. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pydantic import BaseModel  # noqa: E402

from bench.scale import build_thread  # noqa: E402
from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402


class Loop(BaseModel):
    question: str = ""
    rounds: int = 0
    notes: list[str] = []
    answer: str = ""


def read(s: Loop) -> None:
    s.notes.append(f"read {s.question} ({len(s.notes)})")


def think(s: Loop) -> None:
    s.notes.append(f"thought {len(s.notes)}")


def answer(s: Loop) -> None:
    s.answer = f"after {len(s.notes)} notes: {s.notes[-1]}"


def build_long_run(path: str, steps: int) -> str:
    rounds = max(1, steps // 3)  # three steps a round: read, think and the loop's decision
    flow = (Pipeline("long-loop", Loop).then(read).then(think)
            .loop_to("read", when=lambda s: len(s.notes) < 2 * rounds, max_iterations=rounds + 5)
            .then(answer).build())
    with Store(path) as store:
        return flow.run({"question": "a long task", "rounds": rounds}, store=store).run_id


def child(path: str, run_id: str, what: str, field: str) -> None:
    """In a fresh process: open the file, answer once (cold), then five more times (warm)."""
    from tracemem.trace import why

    t0 = time.perf_counter()
    store = Store(path, read_only=True)
    opened = time.perf_counter()

    def once() -> tuple[int, int]:
        if what == "backtrack":
            trace = store.run(run_id).backtrack(field)
            return trace.graph.number_of_nodes(), 0
        answer = why(store.run(run_id), field)
        str(answer)  # rendered, as the CLI prints it
        return answer.trace.graph.number_of_nodes(), len(answer.causes)

    nodes, causes = once()
    first = time.perf_counter()
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        once()
        warm.append(time.perf_counter() - t)
    store.close()
    print(json.dumps({"open": opened - t0, "first": first - opened, "warm": statistics.median(warm),
                      "nodes": nodes, "causes": causes}))


def fresh(*argv: str) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stderr}")
    return time.perf_counter() - start, out.stdout


def cli() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "tracemem")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "stages.cli"]


def compare(title: str, path: str, run_id: str, field: str, reps: int) -> None:
    print(f"\n## {title}: {field}, from the file, fresh process, median of {reps}")
    print(f"{'':<34} {'first call':>11} {'warm':>10} {'CLI (start-up incl.)':>21}  nodes  sources")
    for what in ("backtrack", "why"):
        runs = [json.loads(fresh(sys.executable, __file__, "--child", path, run_id, what, field)[1])
                for _ in range(reps)]
        through = statistics.median(fresh(*cli(), what, run_id, field, "--db", path)[0] for _ in range(reps))
        first = statistics.median(r["first"] for r in runs) * 1000
        warm = statistics.median(r["warm"] for r in runs) * 1000
        causes = f"{runs[0]['causes']:>8}" if what == "why" else f"{'':>8}"
        print(f"{what:<34} {first:>8.1f} ms {warm:>7.1f} ms {through:>19.2f} s  {runs[0]['nodes']:>5} {causes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100 turns, 1,000 steps, 1 repetition")
    ap.add_argument("--child", nargs=4, metavar=("PATH", "RUN", "WHAT", "FIELD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    if args.quick:
        args.turns, args.steps, args.reps = 100, 1000, 1
    folder = tempfile.mkdtemp(prefix="tracemem-why-")
    try:
        thread = os.path.join(folder, "thread.duckdb")
        t0 = time.perf_counter()
        last = build_thread(thread, args.turns)[-1]
        built = time.perf_counter() - t0
        compare(f"a {args.turns}-turn thread (built in {built:.1f} s)", thread, last, "reply", args.reps)
        long_path = os.path.join(folder, "long.duckdb")
        t0 = time.perf_counter()
        long_id = build_long_run(long_path, args.steps)
        with Store(long_path, read_only=True) as store:
            steps = store.sql("SELECT count(*) FROM steps WHERE run_id = ?", [long_id]).fetchall()[0][0]
        compare(f"one run of {steps} steps (built in {time.perf_counter() - t0:.1f} s)", long_path, long_id,
                "answer", args.reps)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
