"""Accountability at scale: `store.affected` and `store.blame` on a store of 100k runs and 10k memories.

The store is built once, straight into the tables (columnar inserts of what a
4-stage agent records: recall → assemble_prompt → call_model → answer), then
timed in a fresh Store: `affected` of a memory 20 runs used (goal ≤ 100 ms),
`affected` of a memory learned in a run whose answers spread, and `blame` over
every judged run (goal ≤ 1 s).

    python bench/blame.py               # 100k runs, 10k memories
    python bench/blame.py --runs 2000   # a quick look
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tracemem.store import Store  # noqa: E402
from tracemem.store.write.rows import COLUMNS  # noqa: E402


def insert(con, table: str, columns: dict) -> None:
    arrow = pa.table(columns)
    con.register("_bench", arrow)
    con.execute(f"INSERT INTO {table} ({', '.join(chr(34) + c + chr(34) for c in columns)}) SELECT * FROM _bench")
    con.unregister("_bench")


def build(path: str, n_runs: int, n_memories: int, seed: int = 3) -> tuple[str, str]:
    rng = np.random.default_rng(seed)
    store = Store(path)
    con = store.con
    run_ids = np.array([f"{i:016x}" for i in range(n_runs)], dtype=object)
    now = np.datetime64("2026-11-01T00:00:00", "ns")
    started = now + np.arange(n_runs).astype("timedelta64[s]")
    subjects = np.array([f"user{i % 1000}" for i in range(n_runs)], dtype=object)
    insert(con, "runs", {"run_id": run_ids, "pipeline": np.full(n_runs, "support", dtype=object),
                         "pipeline_hash": np.full(n_runs, "h1", dtype=object),
                         "status": np.full(n_runs, "ok", dtype=object), "started_at": pa.array(started),
                         "ended_at": pa.array(started), "input": np.full(n_runs, "{}", dtype=object),
                         "subject": subjects})
    steps = np.tile(np.arange(1, 5, dtype=np.int32), n_runs)
    rid4 = np.repeat(run_ids, 4)
    insert(con, "steps", {"run_id": rid4, "step": steps, "stage": np.tile(np.array(
        ["recall", "assemble_prompt", "call_model", "answer"], dtype=object), n_runs),
        "kind": np.full(4 * n_runs, "stage", dtype=object), "iteration": np.zeros(4 * n_runs, dtype=np.int32),
        "status": np.full(4 * n_runs, "ok", dtype=object)})
    fields = np.tile(np.array(["memories", "prompt", "reply", "answer"], dtype=object), n_runs)
    insert(con, "writes", {"run_id": rid4, "step": steps, "seq": np.full(4 * n_runs, 2, dtype=np.int32),
                           "path": fields, "verb": np.full(4 * n_runs, "set", dtype=object),
                           "value": np.full(4 * n_runs, '"x"', dtype=object)})
    rid3 = np.repeat(run_ids, 3)
    insert(con, "reads", {"run_id": rid3, "step": np.tile(np.arange(2, 5, dtype=np.int32), n_runs),
                          "seq": np.ones(3 * n_runs, dtype=np.int32),
                          "path": np.tile(np.array(["memories", "prompt", "reply"], dtype=object), n_runs),
                          "source_step": np.tile(np.arange(1, 4, dtype=np.int32), n_runs),
                          "source_seq": np.full(3 * n_runs, 2, dtype=np.int32)})
    memory_ids = np.array([f"m_{i:014x}" for i in range(n_memories)], dtype=object)
    mem_subject = np.array([f"user{i % 1000}" for i in range(n_memories)], dtype=object)
    uses = rng.integers(1, n_memories, (n_runs, 3))  # each run injects 3 memories ...
    bad_runs = rng.choice(n_runs, 20, replace=False)  # ... and 20 of them the planted bad memory, all judged wrong
    uses[bad_runs, 0] = 0
    innocent = np.setdiff1d(np.arange(n_runs), bad_runs)
    learned_in = run_ids[rng.choice(innocent, n_memories)]  # the planted memory's runs taught nothing
    insert(con, "memories", {"memory_id": memory_ids, "subject": mem_subject,
                             "text": np.array([f"fact {i}" for i in range(n_memories)], dtype=object),
                             "confidence": np.full(n_memories, 80.0), "review_state": np.full(n_memories, "fresh",
                                                                                                dtype=object),
                             "source_run_id": learned_in, "source_step": np.full(n_memories, 4, dtype=np.int32),
                             "created_at": pa.array(np.full(n_memories, now)),
                             "updated_at": pa.array(np.full(n_memories, now))})
    insert(con, "memory_uses", {"run_id": np.repeat(run_ids, 3), "step": np.ones(3 * n_runs, dtype=np.int32),
                                "memory_id": memory_ids[uses.ravel()],
                                "outcome": np.full(3 * n_runs, "injected", dtype=object)})
    insert(con, "model_calls", {"run_id": run_ids, "step": np.full(n_runs, 3, dtype=np.int32),
                                "call_id": run_ids, "model": np.full(n_runs, "m1", dtype=object)})
    judged = rng.choice(n_runs, n_runs // 10, replace=False)
    wrong = set(bad_runs.tolist()) | set(judged[:10].tolist())  # and 10 wrong answers with other causes
    judged = np.array(sorted(set(judged.tolist()) | set(bad_runs.tolist())))
    insert(con, "feedback", {"feedback_id": run_ids[judged], "run_id": run_ids[judged],
                             "path": np.full(len(judged), "answer", dtype=object),
                             "verdict": np.array(["wrong" if j in wrong else "right" for j in judged.tolist()],
                                                 dtype=object), "at": pa.array(np.full(len(judged), now))})
    con.execute("CHECKPOINT")
    store.close()
    return str(memory_ids[0]), str(memory_ids[uses[0, 1]])


def timed(fn, reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--memories", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    assert set(COLUMNS)  # the tables this bench fills are the store's own
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "blame.duckdb")
        t = time.perf_counter()
        bad, _ = build(path, args.runs, args.memories)
        print(f"## accountability on {args.runs:,} runs and {args.memories:,} memories "
              f"(built in {time.perf_counter() - t:.1f} s)")
        with Store(path) as store:
            report = store.affected(bad)
            assert len(report.runs) == 20, len(report.runs)
            a_med, a_min = timed(lambda: store.affected(bad), args.reps)
            ranked = store.blame()
            assert ranked.ranked[0].id == bad, ranked.ranked[:3]
            b_med, b_min = timed(lambda: store.blame(), args.reps)
        print(f"{'measure':44} {'median ms':>10} {'min ms':>8}  goal")
        print(f"{'affected(memory used by 20 runs)':44} {a_med:10.1f} {a_min:8.1f}  ≤ 100 ms")
        print(f"{'blame over every judged run':44} {b_med:10.1f} {b_min:8.1f}  ≤ 1,000 ms")
        print(f"blame ranks the planted memory first: {ranked.ranked[0].kind}:{ranked.ranked[0].id} "
              f"(ochiai {ranked.ranked[0].score}, wrong with {ranked.ranked[0].wrong_with}, "
              f"right with {ranked.ranked[0].right_with})")


if __name__ == "__main__":
    main()
