"""What the benchmarks share: a run's step entries, a finished run queued whole, and interleaved timing.

`Bench` times candidates in turns (fast operations in batches, fsyncs and commits one by one,
round-robin in a shuffled order), so noise from other processes hits every candidate alike;
`append_fd` and `sqlite_con` open what the floors are measured on. Used by bench/peers_durability.py.
"""
from __future__ import annotations

import os
import random
import sqlite3
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.overhead import build_flow  # noqa: E402
from tracemem.record import Read, Step, Write  # noqa: E402
from tracemem.store.write.listener import cost_of  # noqa: E402
from tracemem.store.write.rows import Piece, RunFacts, run_records, run_row  # noqa: E402

Entry = tuple[str, Step, list[Read], list[Write]]


def real_entries() -> tuple[list[Entry], Any]:
    run = build_flow().run({})
    return [(run.run_id, s, [r for r in run.reads if r.step == s.step], [w for w in run.writes if w.step == s.step])
            for s in run.steps], run


def queue_whole(store: Any, run: Any) -> None:
    """Queue a finished run for the store's writer as one piece, past the journal: what the ingest figures time."""
    records = run_records(run)
    store.writer.queue.put(Piece(RunFacts.of(run), run_row(run, store.lease), records, None, None,
                                 cost_of(records, run)))


class Bench:
    """Candidates timed in turns: each call of `fn(i)` is one operation. Fast operations are
    timed in batches, candidate after candidate; slow ones (`each=True`: fsyncs, commits) one
    by one, round-robin, so a burst of disk traffic from elsewhere hits all of them alike."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, Callable[[int], Any], int, bool]] = []
        self.results: dict[str, list[float]] = {}

    def add(self, group: str, label: str, fn: Callable[[int], Any], ops: int, each: bool = False) -> None:
        self.rows.append((group, label, fn, ops, each))
        self.results[label] = []

    def run(self, reps: int) -> None:
        for _, _, fn, ops, _ in self.rows:  # warm up
            for i in range(min(ops, 20)):
                fn(i)
        slow = [(label, fn, ops) for _, label, fn, ops, each in self.rows if each]
        clock = time.perf_counter
        rng = random.Random(20)
        for rep in range(reps):
            for _, label, fn, ops, each in self.rows:
                if not each:
                    start = clock()
                    for i in range(ops):
                        fn(i)
                    self.results[label].append((clock() - start) / ops * 1e6)
            for i in range(max((ops for _, _, ops in slow), default=0)):
                rng.shuffle(slow)  # what runs before a candidate (a DuckDB commit, say) varies too
                for label, fn, ops in slow:
                    if i < ops:
                        j = rep * ops + i
                        start = clock()
                        fn(j)
                        self.results[label].append((clock() - start) * 1e6)

    def median(self, label: str) -> float:
        return statistics.median(self.results[label])

    def report(self, ratios: dict[str, tuple[str, str]]) -> None:
        """One table per group; `ratios`: group -> (label of its baseline, the baseline's short name)."""
        group = None
        for g, label, _, _, _ in self.rows:
            if g != group:
                group = g
                base = ratios.get(g)
                print(f"\n## {g}")
                print(f"{'operation':<64} {'µs median':>10} {'min–max':>17}  {'× ' + base[1] if base else ''}")
            vals = self.results[label]
            ratio = f"{self.median(label) / self.median(base[0]):.2f}" if base else ""
            print(f"{label:<64} {self.median(label):>10.2f} {min(vals):>8.2f}–{max(vals):<8.2f}  {ratio}")


def append_fd(path: str, flags: int = 0) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | flags, 0o644)


def sqlite_con(path: str, sync: str) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(f"PRAGMA synchronous={sync}")
    con.execute("CREATE TABLE IF NOT EXISTS journal (run_id TEXT, step INTEGER, kind TEXT, payload BLOB)")
    return con
