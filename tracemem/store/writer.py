"""The writer: everything about getting runs from the runner to disk.

It owns the queue of finished runs, the background thread that writes them in
columnar batches, the step journal, and each run's progress towards its tables.
The runner reaches it only through `StoreSink` (what `Store.sink()` returns).

Durability "run" (default): a finished run is queued whole and written by the
background thread within `flush_interval` seconds (and on flush/close/exit), so a
crash loses at most the runs of that last interval and never half a run.
`flush_interval=0` journals each run before `flow.run` returns.
Durability "stage": the run row is written when the run starts, and each finished
stage is journaled before the next starts; reopening a file after a crash replays
the journal and marks such a run `interrupted`.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from ..errors import TracememError
from ..record import Decision, Read, Step, Write
from ..run import Run
from .batch import EXTRA_TABLES, Batch, Progress, mark_of, run_row
from .journal import end_entry, part_entry, run_entry, step_entry
from .snapshots import embedding_rows


class Writer:
    """Writes finished runs (and journaled stages) into the store's tables."""

    def __init__(self, backend: Any, path: str, flush_interval: float, snapshot_embedder: Any,
                 on_embeddings: Callable[[list[tuple]], None],
                 on_end: Callable[[Run], None] = lambda run: None,
                 on_written: Callable[[int], None] = lambda count: None) -> None:
        self.backend = backend  # where batches and journal rows go (store/backend.py)
        self.lock = backend.write_lock
        self.path = path
        self.flush_interval = flush_interval  # 0: each run is journaled before flow.run returns
        self.snapshot_embedder = snapshot_embedder
        self.on_embeddings = on_embeddings  # told about new run embeddings once they are in the tables
        self.on_end = on_end  # told about each run as it ends (the store keeps its state for resume=<run id>)
        self.on_written = on_written  # told how many runs each batch wrote, on this thread (the store grows)
        self.progress: dict[str, Progress] = {}  # journaled runs not yet moved whole into the tables
        self.inflight: dict[str, Run] = {}  # durability "stage" runs still running
        self.pending: list[Run] = []
        self.errors: list[BaseException] = []
        self.closed = False
        self._cv = threading.Condition()
        self._drain_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def sink(self, durability: str) -> "StoreSink":
        return StoreSink(self, durability)

    # -- durable progress --------------------------------------------------------------
    def write_now(self, batch: Batch) -> None:
        with self.lock:
            self.backend.insert(batch)
            if batch.rows["run_embeddings"]:
                self.on_embeddings(batch.rows["run_embeddings"])

    def journal(self, run_id: str, step: int, kind: str, payload: str) -> None:
        """One durable journal row (see store/journal.py)."""
        with self.lock:
            self.backend.journal(run_id, step, kind, payload)

    # -- the queue -----------------------------------------------------------------------
    def enqueue(self, run: Run) -> None:
        with self._cv:
            self.pending.append(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tracemem-writer", daemon=True)
                self._thread.start()
            if len(self.pending) >= 256:
                self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self.pending and not self.closed:
                    self._cv.wait(self.flush_interval if self.flush_interval > 0 else 0.05)
                if self.closed and not self.pending:
                    return
            self.drain()

    def drain(self) -> None:
        """Write every queued run now, in one batch (run by run if the batch fails)."""
        with self._drain_lock:
            with self._cv:
                runs, self.pending = self.pending, []
            if not runs:
                return
            batch = Batch()
            try:
                for run in runs:
                    batch.add_run(run, self.progress.get(run.run_id))
                batch.add_embeddings(embedding_rows(self.snapshot_embedder, runs))
                self.write_now(batch)
            except BaseException:
                self._write_each(runs)
                return
            for run in runs:
                self.progress.pop(run.run_id, None)
            self.on_written(len(runs))

    def _write_each(self, runs: list[Run]) -> None:
        """After a failed batch: write run by run, so one bad run never blocks the others. A run whose
        extra rows (e.g. a `model_calls` row with a wrong type) or query embedding cannot be written is
        written without them; a run that still fails is kept queued. Errors are raised by the next flush()."""
        for i, run in enumerate(runs):
            try:
                self.write_now(self._run_batch(run, extra=True))
                self.progress.pop(run.run_id, None)
                continue
            except BaseException as err:
                first = err
            try:
                self.write_now(self._run_batch(run, extra=False))
                self.progress.pop(run.run_id, None)
                extra = ", ".join(sorted(run.rows) + (["query embedding"] if run.query else []))
                self.errors.append(TracememError(
                    f"run {run.run_id} of '{run.pipeline}' was written without its {extra}, which could not be "
                    f"written: {first}"))
            except BaseException as err:  # kept and raised by the next flush()
                with self._cv:
                    self.pending[:0] = runs[i:]
                self.errors.append(TracememError(f"writing runs to {self.path} failed: {err}; they are kept queued"))
                return

    def _run_batch(self, run: Run, extra: bool) -> Batch:
        batch = Batch()
        batch.add_run(run, self.progress.get(run.run_id), extra=extra)
        if extra:
            batch.add_embeddings(embedding_rows(self.snapshot_embedder, [run]))
        return batch

    def materialize(self) -> None:
        """Move the finished stages of running "stage" runs from the journal into their tables,
        so a query sees every finished stage (runs end up whole either way)."""
        with self._drain_lock:
            for run in list(self.inflight.values()):
                progress = self.progress.get(run.run_id)
                done = progress.done if progress is not None else None
                if progress is None or done is None or done == progress.written:
                    continue
                batch = Batch()
                batch.add_part(run, progress.written, done)
                start = progress.written[0] if progress.written else 0
                batch.journaled_steps.append((run.run_id, [s.step for s in run.steps[start:done[0]]]))
                self.write_now(batch)
                progress.written = done

    def flush(self) -> None:
        """Write every queued run now (and every finished stage of running "stage" runs); raise what
        went wrong since the last flush."""
        if self.inflight:
            self.materialize()
        self.drain()
        if self.errors:
            errors, self.errors = self.errors, []
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise TracememError(f"{errors[0]}{more}") from errors[0]

    def stop(self) -> None:
        """Stop the background thread (after a final flush by the caller)."""
        with self._cv:
            self.closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)


class StoreSink:
    """The runner's view of the store for one run (see `Store.sink`)."""

    def __init__(self, writer: Writer, durability: str) -> None:
        if durability not in ("run", "stage"):
            raise TracememError(f"durability must be 'run' or 'stage', got {durability!r}")
        self.writer = writer
        self.durability = durability

    def begin_run(self, run: Run) -> None:
        if run.resumed_from is not None:  # its runs row exists (claimed by flow.resume), its record so far too
            mark = run.resumed_from
            self.writer.progress[run.run_id] = Progress(written=mark, done=mark, resumed=True)
            if self.durability == "stage":
                self.writer.inflight[run.run_id] = run
            return
        if self.durability == "stage":
            batch = Batch()
            batch.rows["runs"].append(run_row(run))
            self.writer.write_now(batch)
            self.writer.progress[run.run_id] = Progress()
            self.writer.inflight[run.run_id] = run

    def step_done(self, run: Run, step: Step, reads: list[Read], writes: list[Write],
                  decision: Optional[Decision], rows: list[tuple[str, dict[str, Any]]]) -> None:
        for table, _ in rows:
            if table not in EXTRA_TABLES and not table.startswith("_"):
                raise TracememError(f"stage '{step.stage}' emitted a row for unknown table '{table}'; "
                                    f"known: {', '.join(sorted(EXTRA_TABLES))}")
        if self.durability == "stage":  # one journal insert; the run's rows reach their tables at its end
            self.writer.journal(run.run_id, step.step, "step", step_entry(step, reads, writes, decision, rows))
            self.writer.progress[run.run_id].done = mark_of(run)

    def end_run(self, run: Run) -> None:
        writer = self.writer
        writer.on_end(run)
        if self.durability == "stage":
            writer.journal(run.run_id, 2**31 - 1, "end", end_entry(run))
            writer.progress[run.run_id].journal = "stage"
            writer.inflight.pop(run.run_id, None)
        elif writer.flush_interval <= 0 and run.resumed_from is not None:  # on disk before flow.resume returns
            progress = writer.progress[run.run_id]
            start = progress.written or run.resumed_from
            first = run.steps[start[0]].step if len(run.steps) > start[0] else 0
            writer.journal(run.run_id, first, "step", part_entry(run, start))
            writer.journal(run.run_id, 2**31 - 1, "end", end_entry(run))
            progress.journal = "stage"
        elif writer.flush_interval <= 0:  # flow.run returns once its run is on disk
            writer.journal(run.run_id, 0, "run", run_entry(run))
            writer.progress[run.run_id] = Progress(journal="run")
        writer.enqueue(run)
