"""A producer faster than the writer: how deep the queue gets, how far the writer falls behind,
and what a SIGKILL loses — for the bounded default next to an unbounded queue (the baseline).

    python bench/pressure.py [--seconds 3] [--threads 2]

1. In process: producer threads run flows into one store for a few seconds while a
   monitor samples the writer's queue every 5 ms. Printed per workload: runs/s, the
   deepest queue (runs, cost units), the oldest unwritten run's age (max over samples),
   the peak lag (the longest any run waited between `flow.run` returning and being
   on disk) and how often `flow.run` waited for room.
2. SIGKILL: a child process produces runs and prints each returned run id; the parent
   kills it and counts the returned runs missing from the file, and how long before
   the kill the oldest of them had returned: the loss window, per durability mode.

bench/store.py prints this as its "producer faster than the writer" section.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any, Callable

from pydantic import BaseModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.overhead import build_flow  # noqa: E402
from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402
from tracemem.store.write.writer import BATCH_COST, MAX_COST, MAX_LAG  # noqa: E402

UNBOUNDED = 10**15
BLOB = "y" * 20_000


class Blob(BaseModel):
    text: str = ""
    n: int = 0


def write_blob(s: Any) -> None:
    s.text = BLOB
    s.n = s.n + 1


def blob_flow() -> Any:
    return Pipeline("blob", Blob).then(write_blob).build()


WORKLOADS: dict[str, Callable[[], Any]] = {"10-stage runs (~40 rows)": build_flow,
                                           "one 20 kB value per run": blob_flow}


def in_process(make_flow: Callable[[], Any], seconds: float, threads: int, max_queue: int,
               folder: str) -> dict[str, float]:
    flow = make_flow()
    path = os.path.join(folder, f"p{time.monotonic_ns()}.duckdb")
    store = Store(path, max_queue=max_queue, max_lag=UNBOUNDED if max_queue == UNBOUNDED else MAX_LAG)
    flow.run({}, store=store)
    store.flush()
    stop = time.monotonic() + seconds
    counts = [0] * threads
    peak_age = 0.0
    done = threading.Event()

    def produce(i: int) -> None:
        while time.monotonic() < stop:
            flow.run({}, store=store)
            counts[i] += 1

    def monitor() -> None:
        nonlocal peak_age
        while not done.is_set():
            peak_age = max(peak_age, store.writer.queue.oldest_age())
            time.sleep(0.005)

    watcher = threading.Thread(target=monitor)
    watcher.start()
    workers = [threading.Thread(target=produce, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    flush_started = time.perf_counter()
    store.flush()
    final_flush = time.perf_counter() - flush_started
    done.set()
    watcher.join()
    writer = store.writer.queue
    store.close()
    return {"runs_per_s": sum(counts) / elapsed, "peak_runs": writer.peak_pending, "peak_cost": writer.peak_cost,
            "oldest_age_s": max(peak_age, writer.peak_lag), "peak_lag_s": writer.peak_lag,
            "waits": writer.producer_waits, "final_flush_s": final_flush}


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from bench.pressure import blob_flow
    from tracemem.store import Store
    store = Store({path!r}, **{kwargs!r})
    flow = blob_flow()
    out = sys.stdout
    print("ready", flush=True)
    while True:
        run = flow.run({{}}, store=store)
        out.write(f"{{time.time()}} {{run.run_id}}\\n")
        out.flush()
""")


def killed(seconds: float, kwargs: dict[str, Any], folder: str) -> dict[str, float]:
    """Produce runs in a child, SIGKILL it after `seconds`, and count what the file lacks."""
    path = os.path.join(folder, f"k{time.monotonic_ns()}.duckdb")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(root=root, path=path, kwargs=kwargs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    returned: list[tuple[float, str]] = []
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"child failed: {proc.stderr.read() if proc.stderr else ''}")

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if len(parts) == 2:
                returned.append((float(parts[0]), parts[1]))

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(seconds)
    killed_at = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    reader.join(timeout=30)
    with Store(path) as store:
        present = {r for (r,) in store.sql("SELECT run_id FROM runs WHERE status = 'ok'").fetchall()}
    lost = [(t, r) for t, r in returned if r not in present]
    window = killed_at - min(t for t, _ in lost) if lost else 0.0
    return {"returned": len(returned), "lost": len(lost), "window_s": window}


def report(seconds: float, threads: int) -> None:
    folder = tempfile.mkdtemp(prefix="tracemem-pressure-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    print(f"\n## producer faster than the writer ({threads} producer threads, {seconds:g} s each; "
          f"bounds max_queue={MAX_COST:,} cost units and max_lag={MAX_LAG:g} s, batches ≤ {BATCH_COST:,} units; "
          f"1 unit = 1 row or 64 chars)")
    print(f"{'workload':<26} {'queue':<10} {'runs/s':>8} {'max queued':>11} {'max cost':>10} "
          f"{'oldest unwritten s':>19} {'peak lag s':>11} {'waits':>7} {'final flush s':>14}")
    for name, make in WORKLOADS.items():
        for label, bound in (("bounded", MAX_COST), ("unbounded", UNBOUNDED)):
            r = in_process(make, seconds, threads, bound, folder)
            print(f"{name:<26} {label:<10} {r['runs_per_s']:>8,.0f} {r['peak_runs']:>11,} {r['peak_cost']:>10,} "
                  f"{r['oldest_age_s']:>19.3f} {r['peak_lag_s']:>11.3f} {r['waits']:>7,} {r['final_flush_s']:>14.3f}")
    print(f"\n## SIGKILL after {seconds:g} s of a producer writing one 20 kB value per run "
          f"(returned = flow.run had returned)")
    print(f"{'durability':<34} {'returned':>9} {'lost':>6} {'loss window s':>14}")
    modes = (("run (default), bounded queue", {}), ("run, unbounded queue (baseline)", {"max_queue": UNBOUNDED, "max_lag": UNBOUNDED}),
             ("run, flush_interval=0", {"flush_interval": 0}), ("stage", {"durability": "stage"}))
    for label, kwargs in modes:
        r = killed(seconds, kwargs, folder)
        print(f"{label:<34} {r['returned']:>9,} {r['lost']:>6,} {r['window_s']:>14.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    report(args.seconds, args.threads)


if __name__ == "__main__":
    main()
