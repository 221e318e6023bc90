"""The runner's view of the store for one run: what each finished stage and the run's end hand the writer.

Why its own module: it is the one place that decides, per durability mode and backend, how a run is made
durable before `flow.run` returns (a journal append, a journal row, or nothing until the batch) and what the
background writer gets to write (store/writer.py). A durability "run" sink has no `step_done`, so the runner
calls it only as the run begins and ends (flow/sinks.py); `StageSink` adds what each finished stage does.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..errors import TracememError
from ..record import Decision, ReadFields, StepFields, WriteFields
from ..run import Run
from .backlog import cost_of, queued
from .batch import Batch, Progress, mark_of, run_row
from .journal import end_entry, part_entry, run_entry, step_entry
from .segment_log import JournalError
from .writer import Writer

__all__ = ["StoreSink", "StageSink", "sink_for"]


def sink_for(run_sink: "StoreSink", durability: str) -> "StoreSink":
    """The sink recording one `flow.run` (and its subflows' runs) with this durability: `run_sink`, the store's
    one durability "run" sink (it holds nothing of a run, so every run shares it), or a new `StageSink`."""
    if durability == "stage":
        return StageSink(run_sink.writer)
    if durability != "run":
        raise TracememError(f"durability must be 'run' or 'stage', got {durability!r}")
    return run_sink


class StoreSink:
    """The runner's view of the store for durability "run" runs (see `Store.sink`), and their subflows' runs."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer

    def begin_run(self, run: Run) -> Optional[Callable[..., None]]:
        """Start recording `run`; what the runner calls as each later step begins, if anything (`StageSink`)."""
        self.writer.check()  # a store whose file failed accepts no new runs
        if run.resumed_from is not None:  # its runs row exists (claimed by flow.resume), its record so far too
            mark = run.resumed_from
            self.writer.progress[run.run_id] = Progress(written=mark, done=mark, row=True)
        return None

    def end_run(self, run: Run) -> None:
        writer = self.writer
        runlog = writer.runlog
        resumed = run.resumed_from is not None
        entries: list[bytes] = []  # run journal entries holding all its records: the writer folds them in as they are
        if runlog is not None and not resumed:  # every run is on disk before flow.run returns
            entries = [writer.logged(run, runlog.whole)]
        elif runlog is not None:  # a resumed run: on disk before flow.resume returns
            writer.logged(run, runlog.part, writer.progress[run.run_id].written or run.resumed_from)
            writer.logged(run, runlog.end)
        elif writer.journal_each_run and resumed:  # on disk before flow.resume returns
            progress = writer.progress[run.run_id]
            start = progress.written or run.resumed_from
            first = run.raw_steps[start[0]][0] if len(run.raw_steps) > start[0] else 0
            writer.journal(run.run_id, first, "step", part_entry(run, start))
            writer.journal(run.run_id, 2**31 - 1, "end", end_entry(run))
            progress.journal = "stage"
        elif writer.journal_each_run:  # flow.run returns once its run is on disk
            writer.journal(run.run_id, 0, "run", run_entry(run, writer.lease))
            writer.progress[run.run_id] = Progress(journal="run")
        self._queue(run, entries)

    def _queue(self, run: Run, entries: list[bytes]) -> None:
        """Hand the ended run to the background writer."""
        kept = run if run.resumed_from is not None else queued(run, entries)  # the writer's copy (backlog.queued)
        self.writer.on_end(kept)
        self.writer.enqueue(kept, cost_of(run))


class StageSink(StoreSink):
    """Durability "stage": each finished stage is journaled before the next begins (`step_done`).

    On a run journal with fsync=True (`defers_sync`), a stage's append is synced as the next step begins
    (`_sync_before_step`) or with the run's end, so the last stage shares the end's fdatasync."""

    def __init__(self, writer: Writer) -> None:
        super().__init__(writer)
        runlog = writer.runlog
        self.defers_sync = runlog is not None and runlog.log.fsync
        self.unsynced = False  # a stage was appended since the last sync (a subflow's runs share their parent's sink)

    def begin_run(self, run: Run) -> Optional[Callable[..., None]]:
        super().begin_run(run)
        writer = self.writer
        if run.resumed_from is None:
            if writer.runlog is not None:
                writer.logged(run, writer.runlog.begin)
                writer.progress[run.run_id] = Progress()
            else:
                batch = Batch(writer.lease)
                batch.rows["runs"].append(run_row(run, writer.lease))
                batch.runs[run.run_id] = run
                writer.write_durably(f"starting run {run.run_id}", batch)
                writer.progress[run.run_id] = Progress(row=True)
        writer.inflight[run.run_id] = run
        return self._sync_before_step if self.defers_sync else None

    def _sync_before_step(self, run: Run, *_: Any) -> None:
        """A step of `run` begins: the stages appended before it become power-loss safe first (one fdatasync
        of the journal, shared with any other thread's), so no stage starts before the one it follows is
        on disk."""
        if self.unsynced:
            self.unsynced = False  # (cleared first: a stage appended meanwhile sets it again, or is synced now)
            writer = self.writer
            try:
                writer.runlog.log.sync()  # type: ignore[union-attr]
            except JournalError as err:
                raise writer.journal_failed(run, err) from err

    def step_done(self, run: Run, step: StepFields, reads: list[ReadFields], writes: list[WriteFields],
                  decision: Optional[Decision], rows: list[tuple[str, dict[str, Any]]]) -> None:
        """One journal append (or `step_journal` row); the run's rows reach their tables at its end."""
        writer = self.writer
        progress = writer.progress[run.run_id]
        if writer.runlog is not None:  # (writer.logged, inlined: once per stage)
            try:
                progress.entries.append(writer.runlog.step(run, step, reads, writes, decision, rows,
                                                           sync=not self.defers_sync))
            except JournalError as err:
                raise writer.journal_failed(run, err) from err
            self.unsynced = self.defers_sync
        else:
            writer.journal(run.run_id, step[0], "step", step_entry(step, reads, writes, decision, rows))
        progress.done = mark_of(run)

    def end_run(self, run: Run) -> None:
        writer = self.writer
        entries: list[bytes] = []
        if writer.runlog is not None:  # (syncs the stage before it, with fsync=True)
            writer.logged(run, writer.runlog.end)
            if run.resumed_from is None:
                entries = writer.progress[run.run_id].entries
        else:
            writer.journal(run.run_id, 2**31 - 1, "end", end_entry(run))
            writer.progress[run.run_id].journal = "stage"
        writer.inflight.pop(run.run_id, None)
        self._queue(run, entries)
