"""Candidates for the durable journal (issue 20), side by side: floors, encodings, and logs.

    python bench/durable_candidates.py [--quick] [--reps 7] [--dir PATH]

Every figure is µs per operation, a median over interleaved repetitions in one process:
fast operations are timed in batches (median of the batch means), fsyncs and commits
one by one, round-robin across candidates in a shuffled order (median of all
operations), so noise from other processes hits every candidate alike. The step entries are real: the ten stages of
bench/overhead.py's pipeline (a Step, two Reads, one Write, no decision).

1. Floors: a 200-byte os.write (O_APPEND), encodings of one step entry (today's
   json.dumps, orjson and msgpack if installed, marshal, a hand-rolled struct
   encoding, and tracemem's LogCodec), crc32, fdatasync/fsync of a small append,
   sqlite3 WAL insert+commit (synchronous NORMAL and FULL), DuckDB INSERT+commit.
2. Candidate journals, per stage, encode included:
   process-crash safe:  (a) segment log append; (b) sqlite3 WAL, synchronous=NORMAL;
   power-loss safe:     (a) + fdatasync per stage, appended or preallocated (c);
                        (b) with synchronous=FULL;
   per run (`flush_interval=0`): one entry per 10-stage run, amortised per stage,
                        process-crash safe, and with one fdatasync per run (group commit).
Prints figures; asserts nothing. Files go to --dir (default: a temporary directory on
the file system of the working directory, so fsync is real, not tmpfs).
"""
from __future__ import annotations

import argparse
import json
import marshal
import os
import random
import shutil
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
import zlib
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.overhead import STAGES, build_flow  # noqa: E402
from tracemem.record import Read, Step, Write  # noqa: E402
from tracemem.store.journal import step_entry  # noqa: E402
from tracemem.store.log_codec import LogCodec, decode  # noqa: E402
from tracemem.store.segment_log import SegmentLog  # noqa: E402
from tracemem.store.batch import end_facts, run_row  # noqa: E402

Entry = tuple[str, Step, list[Read], list[Write]]


def real_entries() -> tuple[list[Entry], Any]:
    run = build_flow().run({})
    return [(run.run_id, s, [r for r in run.reads if r.step == s.step], [w for w in run.writes if w.step == s.step])
            for s in run.steps], run


INT_NONE = -(2**63)
NO_STR = 0xFFFFFFFF


def hand_rolled(run_id: str, s: Step, reads: list[Read], writes: list[Write]) -> bytes:
    """A compact binary encoding: every int as int64 (None as INT_MIN), every string as
    u32 length + UTF-8 (None as length 0xFFFFFFFF), counts first. Decodable, not JSON."""
    ints = [s.step, s.iteration, s.started_at, s.ended_at, INT_NONE if s.routed_by is None else s.routed_by,
            len(reads), len(writes), len(s.logs)]
    strs: list[Optional[str]] = [run_id, s.stage, s.name, s.kind, s.status, s.error, s.child_run_id, *s.logs]
    for r in reads:
        ints += (r.step, r.seq, INT_NONE if r.source_step is None else r.source_step,
                 INT_NONE if r.source_seq is None else r.source_seq)
        strs.append(r.path)
    for w in writes:
        ints += (w.step, w.seq)
        strs += (w.path, w.verb, w.value)
    blobs = [b"" if x is None else x.encode() for x in strs]
    lens = [NO_STR if x is None else len(b) for x, b in zip(strs, blobs)]
    return struct.pack(f"<HH{len(ints)}q{len(lens)}I", len(ints), len(lens), *ints, *lens) + b"".join(blobs)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 reps, few operations")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where the files go (default: a temp dir under the cwd)")
    args = ap.parse_args()
    reps = 2 if args.quick else args.reps
    fast_ops, sync_ops, db_ops = (300, 20, 20) if args.quick else (20000, 300, 200)
    folder = tempfile.mkdtemp(prefix="durable-bench-", dir=args.dir or os.getcwd())
    try:
        run_bench(folder, reps, fast_ops, sync_ops, db_ops)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_bench(folder: str, reps: int, fast_ops: int, sync_ops: int, db_ops: int) -> None:
    import duckdb

    entries, run = real_entries()
    n = len(entries)
    e0 = entries[3]
    codec, std_codec = LogCodec(), LogCodec(fast=False)
    try:
        import orjson
    except ImportError:
        orjson = None
    try:
        import msgpack
    except ImportError:
        msgpack = None
    payload200 = b"x" * 200
    today = step_entry(e0[1], e0[2], e0[3], None, []).encode()
    ours = [codec.step(rid, s, rs, ws, None, []) for rid, s, rs, ws in entries]
    b = Bench()
    files: list[Any] = []

    def p(name: str) -> str:
        return os.path.join(folder, name)

    # -- floors --------------------------------------------------------------------------------
    fd_plain = append_fd(p("plain.bin"))
    files.append(fd_plain)
    b.add("floors", "os.write 200 B, O_APPEND (process-crash safe)", lambda i: os.write(fd_plain, payload200),
          fast_ops)
    b.add("floors", "crc32 of a 250 B entry", lambda i: zlib.crc32(ours[i % n]), fast_ops)
    enc = "encode a step entry"
    b.add("floors", f"{enc}: today's journal.step_entry (json)",
          lambda i: step_entry(entries[i % n][1], entries[i % n][2], entries[i % n][3], None, []).encode(), fast_ops)
    b.add("floors", f"{enc}: json.dumps of the tuples",
          lambda i: json.dumps(entries[i % n]).encode(), fast_ops)
    if orjson is not None:
        b.add("floors", f"{enc}: orjson.dumps (default=tuple)",
              lambda i: orjson.dumps(entries[i % n], default=tuple), fast_ops)
    if msgpack is not None:
        b.add("floors", f"{enc}: msgpack.packb", lambda i: msgpack.packb(entries[i % n]), fast_ops)
    b.add("floors", f"{enc}: marshal.dumps (decode unsafe)",
          lambda i: marshal.dumps((entries[i % n][0], tuple(entries[i % n][1]), list(map(tuple, entries[i % n][2])),
                                   list(map(tuple, entries[i % n][3])))), fast_ops)
    b.add("floors", f"{enc}: hand-rolled struct", lambda i: hand_rolled(*entries[i % n]), fast_ops)
    b.add("floors", f"{enc}: LogCodec ({'orjson' if codec.fast else 'stdlib'})",
          lambda i: codec.step(entries[i % n][0], entries[i % n][1], entries[i % n][2], entries[i % n][3], None, []),
          fast_ops)
    if codec.fast:
        b.add("floors", f"{enc}: LogCodec (stdlib, no orjson)",
              lambda i: std_codec.step(*entries[i % n], None, []), fast_ops)
    b.add("floors", "decode one step entry: LogCodec decode (checked)", lambda i: decode(ours[i % n]), fast_ops)
    fd_sync = append_fd(p("fdatasync.bin"))
    fd_fsync = append_fd(p("fsync.bin"))
    files += [fd_sync, fd_fsync]
    b.add("floors", "os.write 200 B + fdatasync (power-loss safe: the fsync floor)",
          lambda i: (os.write(fd_sync, payload200), os.fdatasync(fd_sync)), sync_ops, each=True)
    b.add("floors", "os.write 200 B + fsync", lambda i: (os.write(fd_fsync, payload200), os.fsync(fd_fsync)),
          sync_ops, each=True)
    cons = {s: sqlite_con(p(f"sqlite-{s}.db"), s) for s in ("NORMAL", "FULL")}
    files += list(cons.values())
    for s, con in cons.items():
        b.add("floors", f"sqlite3 WAL INSERT+commit, synchronous={s}",
              lambda i, con=con: con.execute("INSERT INTO journal VALUES (?, ?, 'step', ?)",
                                             (run.run_id, i, ours[i % n])), fast_ops // 20 if s == "NORMAL" else sync_ops,
              each=s == "FULL")
    for where in ("file", "memory"):
        dcon = duckdb.connect(p("duck.duckdb") if where == "file" else ":memory:")
        dcon.execute("CREATE TABLE step_journal (run_id VARCHAR, step INTEGER, kind VARCHAR, payload VARCHAR)")
        files.append(dcon)
        b.add("floors", f"DuckDB INSERT+commit ({where})",
              lambda i, dcon=dcon: dcon.execute("INSERT INTO step_journal VALUES (?, ?, 'step', ?)",
                                                [run.run_id, i, today.decode()]), db_ops, each=True)

    # -- candidate journals, per stage (encode + record) ---------------------------------------
    def log(name: str, **kw: Any) -> SegmentLog:
        lg = SegmentLog(p(name), **kw)
        files.append(lg)
        return lg

    def stage_into(lg: SegmentLog) -> Callable[[int], Any]:
        return lambda i: lg.append(codec.step(entries[i % n][0], entries[i % n][1], entries[i % n][2],
                                              entries[i % n][3], None, []))
    crash = "per stage, process-crash safe"
    b.add(crash, "(a) segment log: LogCodec + append", stage_into(log("seg-a")), fast_ops)
    b.add(crash, "(a) segment log, stdlib codec + append",
          lambda i, lg=log("seg-a-std"): lg.append(std_codec.step(*entries[i % n], None, [])), fast_ops)
    sq = sqlite_con(p("cand-normal.db"), "NORMAL")
    files.append(sq)
    b.add(crash, "(b) sqlite3 WAL synchronous=NORMAL: LogCodec + INSERT+commit",
          lambda i: sq.execute("INSERT INTO journal VALUES (?, ?, 'step', ?)",
                               (entries[i % n][0], i, codec.step(*entries[i % n], None, []))), fast_ops // 20)
    row, facts = run_row(run), end_facts(run)
    seg_s = log("seg-s")

    def stage_mode(i: int) -> None:
        """What durability "stage" journals: the runs row at the start, each stage, the end facts."""
        if i % STAGES == 0:
            seg_s.append(codec.begin(row))
        seg_s.append(codec.step(*entries[i % n], None, []))
        if i % STAGES == STAGES - 1:
            seg_s.append(codec.end(run.run_id, facts))
    b.add(crash, f"(a) durability 'stage' run: begin + {STAGES} steps + end, per stage", stage_mode,
          fast_ops)

    power = "per stage, power-loss safe"
    b.add(power, "(a) segment log, fdatasync per append", stage_into(log("seg-f", fsync=True, preallocate=False)),
          sync_ops, each=True)
    b.add(power, "(c) segment log, fdatasync per append, preallocated",
          stage_into(log("seg-fp", fsync=True, preallocate=True)), sync_ops, each=True)
    sqf = sqlite_con(p("cand-full.db"), "FULL")
    files.append(sqf)
    b.add(power, "(b) sqlite3 WAL synchronous=FULL: LogCodec + INSERT+commit",
          lambda i: sqf.execute("INSERT INTO journal VALUES (?, ?, 'step', ?)",
                                (entries[i % n][0], i, codec.step(*entries[i % n], None, []))), sync_ops,
          each=True)

    per_run = f"per {STAGES}-stage run (flush_interval=0), amortised per stage"
    steps, reads, writes = run.steps, run.reads, run.writes
    seg_r = log("seg-r")
    b.add(per_run, "(a) one LogCodec.run entry + append, process-crash safe",
          lambda i: seg_r.append(codec.run(row, steps, reads, writes, [], [])) if i % STAGES == 0 else None,
          fast_ops)
    seg_g = log("seg-g", preallocate=True)

    def group(i: int) -> None:
        seg_g.append(codec.step(*entries[i % n], None, []))
        if i % STAGES == STAGES - 1:
            seg_g.sync()
    b.add(per_run, "(a)+(c) an entry per stage, one fdatasync per run (group commit)", group, sync_ops * STAGES)
    # ^ timed in batches of whole runs: one op in ten carries the fsync, so per-op medians would hide it

    print(f"durable journal candidates (entry = Step + 2 Reads + 1 Write, no decision); {reps} interleaved reps; "
          f"files in {folder} "
          f"({os.statvfs(folder).f_bsize} B blocks); orjson {'yes' if orjson else 'no'}; "
          f"step entry {len(ours[3])} B (LogCodec), {len(today)} B (today's json)")
    b.run(reps)
    floor = "os.write 200 B + fdatasync (power-loss safe: the fsync floor)"
    write = "os.write 200 B, O_APPEND (process-crash safe)"
    b.report({"floors": (write, "os.write"), crash: (write, "os.write"), power: (floor, "fsync floor"),
              per_run: (write, "os.write")})
    print(f"\nfsync floor (append + fdatasync): {b.median(floor):.1f} µs; "
          f"per-stage fdatasync with the segment log: "
          f"{b.median('(a) segment log, fdatasync per append') / b.median(floor):.2f}× the floor appended, "
          f"{b.median('(c) segment log, fdatasync per append, preallocated') / b.median(floor):.2f}× preallocated")

    # The same three alone: no sqlite or DuckDB commits between them dirtying the file system's journal.
    alone = Bench()
    fd_alone = append_fd(p("floor-alone.bin"))
    files.append(fd_alone)
    alone.add("fsync alone", "os.write 200 B + fdatasync (the fsync floor)",
              lambda i: (os.write(fd_alone, payload200), os.fdatasync(fd_alone)), sync_ops, each=True)
    alone.add("fsync alone", "(a) segment log, fdatasync per append",
              stage_into(log("alone-f", fsync=True, preallocate=False)), sync_ops, each=True)
    alone.add("fsync alone", "(c) segment log, fdatasync per append, preallocated",
              stage_into(log("alone-fp", fsync=True, preallocate=True)), sync_ops, each=True)
    alone.run(reps)
    alone.report({"fsync alone": ("os.write 200 B + fdatasync (the fsync floor)", "fsync floor")})
    for f in files:
        if isinstance(f, int):
            os.close(f)
        else:
            f.close()


if __name__ == "__main__":
    main()
