"""The run journal of a DuckDB file: runs and stages made durable by one append, folded in later.

Why: a DuckDB commit costs 300–600 µs here whatever it holds, so committing per stage
(durability "stage") or per run (`flush_interval=0`) was hundreds of times the cost of
the hardware's floor. Instead the writer appends each journal entry (log_codec) to a
segment log beside the file (`agent.duckdb.journal/`, segment_log) and returns; the
background writer still moves whole runs into the tables in columnar batches, and once a
batch has committed, the log is checkpointed past every run it no longer needs.

What is appended, before the call that promises it returns:
- durability "run" (every `flush_interval`): the whole run, as `flow.run` returns;
- durability "stage": the runs row when a run starts, each stage as it finishes, and the
  end facts when it ends.
With `fsync=True` those are also fdatasync'd (power-loss safe): a whole run as it is appended;
under durability "stage", a stage as the next step begins (before its stage runs), the last with
the end facts, and the runs row with the first stage.

Recovery (`replay`, on the next open, before any run is written) applies the records past
the checkpoint in one transaction, skipping what the tables already hold: a run whose runs
row is there and finished, or a stage whose step is there. So replaying twice (a crash
during recovery, or between a commit and its checkpoint) applies nothing twice, and the log
is checkpointed only after that transaction commits. A torn or corrupt record is found by
its checksum (or by decoding), reported, and never applied.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..record import Decision, Read, Step, Write
from ..run import Run
from .batch import Batch, Mark, end_facts, padded_run_row, rows_since, run_row
from .log_codec import CodecError, Entry, LogCodec, decode
from .log_format import journal_dir
from .segment_log import SegmentLog

__all__ = ["RunLog", "open_run_log"]

_OWNER = "store"  # the journal's owner file: the salt of the DuckDB file it belongs to


class RunLog:
    """Journal entries for the runs of one writing Store (see the module docstring)."""

    def __init__(self, log: SegmentLog, lease: Optional[str]) -> None:
        self.log = log
        self.lease = lease
        self.codec = LogCodec()
        self._first: dict[str, int] = {}  # runs whose records the tables do not hold yet -> their first LSN
        self._lock = threading.Lock()

    def _append(self, run_id: str, data: bytes, sync: bool = True) -> None:
        if run_id not in self._first:  # registered before its record exists: a checkpoint never passes it
            with self._lock:
                self._first.setdefault(run_id, self.log.end)
        self.log.append(data, sync)

    # -- what the writer journals ---------------------------------------------------------------
    def begin(self, run: Run) -> None:
        """A durability "stage" run started: its runs row (synced with its first stage: until a stage
        finishes, a run lost to a power cut had nothing to lose)."""
        self._append(run.run_id, self.codec.begin(run_row(run, self.lease)), sync=False)

    def step(self, run: Run, step: Step, reads: list[Read], writes: list[Write], decision: Optional[Decision],
             rows: list[tuple[str, dict[str, Any]]], sync: bool = True) -> bytes:
        """A finished stage of a durability "stage" run, whose entry it returns (see `whole`); `sync=False`:
        its caller syncs it before the next step begins (store/store_sink.py)."""
        entry = self.codec.step(run.run_id, step, reads, writes, decision, rows)
        self._append(run.run_id, entry, sync)
        return entry

    def part(self, run: Run, start: Mark) -> None:
        """What a resumed run added since `start` (what the tables already hold), as one entry."""
        steps, reads, writes, decisions, counts = start
        self._append(run.run_id, self.codec.part(run.run_id, run.raw_steps[steps:], run.raw_reads[reads:],
                                                 run.raw_writes[writes:], run.decisions[decisions:],
                                                 rows_since(run, counts)))

    def end(self, run: Run) -> None:
        """A run ended: the facts its runs row learns."""
        self._append(run.run_id, self.codec.end(run.run_id, end_facts(run)))

    def whole(self, run: Run) -> bytes:
        """A finished run in one entry (durability "run"), which it returns: the writer folds it into the tables
        as it is (store/entry_fold.py)."""
        entry = self.codec.run(run_row(run, self.lease), run.raw_steps, run.raw_reads, run.raw_writes, run.decisions,
                               rows_since(run))
        self._append(run.run_id, entry)
        return entry

    # -- after the tables hold runs ----------------------------------------------------------------
    def written(self, run_ids: Sequence[str]) -> None:
        """These runs are whole in the tables (their batch committed): checkpoint past what no run needs."""
        with self._lock:
            for run_id in run_ids:
                self._first.pop(run_id, None)
            upto = min(self._first.values(), default=self.log.end)
        # outside the lock, which a flow's append may need meanwhile: a run registered since starts at or past
        # `upto`; a marker lost to a power cut only replays applied runs
        self.log.checkpoint(upto, sync=False)

    def close(self) -> None:
        self.log.close()


def replay(con: Any, log: SegmentLog, say: Callable[[str], None]) -> None:
    """Apply the records past the checkpoint that the tables do not hold yet (one transaction), then
    checkpoint; `say` what was found damaged or unreadable."""
    read = log.read()
    reports = [f"journal {log.path}: {d.reason} at LSN {d.lsn} in {Path(d.segment).name} "
               f"({d.skipped} bytes not applied)" for d in [*log.opening_damage, *read.damage]]
    entries: dict[str, list[Entry]] = defaultdict(list)
    for record in read.records:
        try:
            entry = decode(record.data)
        except CodecError as err:
            reports.append(f"journal {log.path}: the record at LSN {record.lsn} was not applied: {err}")
            continue
        entries[entry.run_id].append(entry)
    if entries:
        batch = _missing(con, entries, reports)
        if len(batch) or batch.finished or batch.notes:
            batch.insert(con)
    for report in reports:
        say(report)
    log.checkpoint(read.upto)


def _missing(con: Any, entries: dict[str, list[Entry]], reports: list[str]) -> Batch:
    """A batch of what `entries` hold and the tables do not (see the module docstring)."""
    ids = list(entries)
    status = dict(con.execute("SELECT run_id, status FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                              [ids]).fetchall())
    have = set(con.execute("SELECT run_id, step FROM steps WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                           [ids]).fetchall())
    damaged = list(reports)
    batch = Batch()
    for run_id, found in entries.items():
        row = run_id in status
        ended = status.get(run_id) not in (None, "running")
        for entry in found:
            if entry.kind in ("begin", "run"):
                if row:
                    continue  # its runs row is there (a whole run's batch wrote all of it at once)
                batch.rows["runs"].append(padded_run_row(entry.run or ()))
                row = True
                if entry.kind == "begin":
                    continue
            elif ended:
                continue
            elif entry.kind == "end":
                if row:
                    batch.finished.append((run_id, dict(entry.end or {})))
                else:
                    reports.append(f"run {run_id}: its end was journaled but not its start; left out")
                continue
            elif any((run_id, s.step) in have for s in entry.steps):
                continue  # a stage (or a resumed part) already folded in: written whole, in one batch
            batch.add_steps(run_id, entry.steps, entry.reads, entry.writes, entry.decisions)
            batch.add_extra(entry.rows)
        if damaged and not ended:
            batch.notes.setdefault(run_id, []).append(
                "recovered from the journal after the process ended; the journal's last record was damaged "
                "(torn by the crash) and not applied, so this run may lack the record being written then: "
                + "; ".join(damaged)[:400])
    return batch


def open_run_log(path: str, con: Any, salt: str, *, fsync: bool, lease: Optional[str],
                 say: Callable[[str], None]) -> RunLog:
    """The run journal beside the DuckDB file `path`: a journal left by another file of the same name
    (one deleted and created again) is moved aside, never applied; this file's is replayed."""
    folder = journal_dir(path)
    owner = folder / _OWNER
    if folder.is_dir() and (not owner.exists() or owner.read_text().strip() != salt):
        aside = folder.with_name(f"{folder.name}.orphaned-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        shutil.move(str(folder), str(aside))
        say(f"{folder} belonged to an earlier file named {path} (its salt differs): moved to {aside}, "
            f"not applied")
    log = SegmentLog(folder, fsync=fsync)
    try:
        if not owner.exists():
            owner.write_text(salt)
        replay(con, log, say)
    except BaseException:
        log.close()
        raise
    return RunLog(log, lease)
