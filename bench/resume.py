"""Resume a paused run whose file holds 1,000 recorded steps, and fork from its step 500, in fresh processes.

    python bench/resume.py [--rounds 500] [--reps 5]

The run: a `work` stage in a loop (each round a model call, a read-modify-write
of a counter, an append to a list, and the loop's own recorded decision: 2 steps
a round, so 500 rounds = 1,000 steps), then a `gate` stage that calls the model and
pauses (`ctx.interrupt`). Each measurement runs in a new process on a fresh copy of
the file, so nothing is cached: the process opens the store, then
- resume: `flow.resume(run_id, answer)` — load the record, rebuild the scope by
  replaying its writes, find the place in the program, claim the run — and runs the
  rest (the re-entered gate, its model call answered from the record, and a last stage);
- fork: `flow.fork(run_id, 500)` (the middle step) prepared (the same loading, the state after step 500);
  running the fork's remaining 500 steps is printed apart, as engine speed.
Baseline in the same processes: `store.run(run_id)`, loading the record alone.
Goals: resume ≤ 20 ms, fork ≤ 20 ms. Prints figures, asserts nothing.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pydantic import BaseModel  # noqa: E402

from tracemem import Pipeline  # noqa: E402
from tracemem.flow.resume import fork_execution  # noqa: E402
from tracemem.flow.sync import run_sync  # noqa: E402
from tracemem.models import ScriptedModel  # noqa: E402
from tracemem.store import Store  # noqa: E402


class Work(BaseModel):
    task: str = ""
    rounds: int = 0
    n: int = 0
    notes: list[dict[str, str]] = []
    verdict: str = ""
    done: str = ""


def work(s: Work, ctx) -> None:
    reply = ctx.complete(ctx.env["model"], [{"role": "user", "content": f"{s.task}: step {s.n}"}])
    s.n += 1
    s.notes.append({"step": str(s.n), "note": reply.text})


def gate(s: Work, ctx) -> None:
    summary = ctx.complete(ctx.env["model"], [{"role": "user", "content": f"summarise {len(s.notes)} notes"}]).text
    s.verdict = f"{ctx.interrupt({'summary': summary, 'n': s.n})}: {summary}"


def finish(s: Work) -> None:
    s.done = f"{s.n} rounds, {s.verdict}"


flow = (Pipeline("long", Work).then(work).loop_to("work", when=lambda s: s.n < s.rounds, max_iterations=100_000)
        .then(gate).then(finish).build())
ENV = {"model": ScriptedModel(default="ok, noted")}


def child(kind: str, path: str, run_id: str, fork_step: int) -> None:
    """One measurement in this fresh process; prints JSON."""
    t0 = time.perf_counter()
    store = Store(path)
    t1 = time.perf_counter()
    out: dict[str, float] = {"open_ms": (t1 - t0) * 1e3}
    if kind == "load":
        store.run(run_id)
        out["load_ms"] = (time.perf_counter() - t1) * 1e3
    elif kind == "resume":
        run = flow.resume(run_id, "approved", store=store, by="bench", env=ENV)
        t2 = time.perf_counter()
        store.flush()
        out.update(resume_ms=(t2 - t1) * 1e3, flush_ms=(time.perf_counter() - t2) * 1e3,
                   steps=len(run.steps), live_calls=len(ENV["model"].calls))
        assert run.ok, run.error
    else:
        exe = fork_execution(flow.program, run_id, fork_step, store=store, env=ENV, listeners=[store.listener()])
        t2 = time.perf_counter()
        run = run_sync(exe.execute(True, async_mode=False), "the bench flow has no async stage")  # timed apart
        t3 = time.perf_counter()
        store.flush()  # the fork's own 501 steps go to the file first: the warm figure is the fork alone
        again = time.perf_counter()
        fork_execution(flow.program, run_id, fork_step, store=store, env=ENV, listeners=[store.listener()])
        out.update(fork_ms=(t2 - t1) * 1e3, fork_run_ms=(t3 - t2) * 1e3, fork_steps=len(run.steps),
                   fork_warm_ms=(time.perf_counter() - again) * 1e3)
    store.close()
    print(json.dumps(out))


def build(path: str, rounds: int) -> tuple[str, int]:
    with Store(path) as store:
        run = flow.run({"task": "audit", "rounds": rounds}, store=store, env=ENV)
        assert run.status == "paused", run.error
        steps = len(run.steps)
    return run.run_id, steps


def measure(kind: str, base: str, run_id: str, reps: int, fork_step: int) -> list[dict]:
    results = []
    for i in range(reps):
        copy = f"{base}.{kind}{i}.duckdb"
        shutil.copyfile(base, copy)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, copy, run_id,
                               str(fork_step)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"{kind} child failed:\n{done.stderr}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        os.remove(copy)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=500, help="loop rounds (2 recorded steps each)")
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per figure")
    ap.add_argument("--child", nargs=4, metavar=("KIND", "PATH", "RUN", "FORK_STEP"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, path, run_id, fork_step = args.child
        child(kind, path, run_id, int(fork_step))
        return
    folder = tempfile.mkdtemp(prefix="tracemem-resume-")
    try:
        base = os.path.join(folder, "long.duckdb")
        run_id, steps = build(base, args.rounds)
        size = os.path.getsize(base) / 1e6
        half = args.rounds  # the middle step: 1,000 steps → fork from step 500
        load = measure("load", base, run_id, args.reps, half)
        resume = measure("resume", base, run_id, args.reps, half)
        fork = measure("fork", base, run_id, args.reps, half)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def fig(rows: list[dict], key: str) -> str:
        values = [r[key] for r in rows]
        return f"{min(values):7.2f} {statistics.median(values):8.2f}"

    def ratio(rows: list[dict], key: str) -> str:
        return f"{min(r[key] for r in rows) / min(r['load_ms'] for r in load):.2f}x"

    print(f"## resume and fork from a file: a paused run of {steps} recorded steps ({size:.1f} MB file), "
          f"{args.reps} fresh processes each; goals ≤ 20 ms")
    print(f"  {'ms in a fresh process (min, median)':50} {'min':>7} {'median':>8}")
    print(f"  {'open the store':50} {fig(load, 'open_ms')}")
    print(f"  {'baseline: load the run record (store.run)':50} {fig(load, 'load_ms')}")
    print(f"  {'resume: load, rebuild, claim, run the last stages':50} {fig(resume, 'resume_ms')}   "
          f"{ratio(resume, 'resume_ms')} the load; {int(resume[0]['steps'])} steps after, "
          f"{int(resume[0]['live_calls'])} live model calls")
    print(f"  {'  then flush it to the file':50} {fig(resume, 'flush_ms')}")
    print(f"  {f'fork from step {args.rounds}: load, rebuild the state':50} {fig(fork, 'fork_ms')}   "
          f"{ratio(fork, 'fork_ms')} the load; again in the same process {min(r['fork_warm_ms'] for r in fork):.2f}")
    print(f"  {'  then run its ' + str(int(fork[0]['fork_steps'])) + ' steps to the pause (engine speed)':50} "
          f"{fig(fork, 'fork_run_ms')}")


if __name__ == "__main__":
    main()
