"""A flush writes the runs it finds queued beside the background writer's batch in flight.

Why: a flush used to wait for the batch in flight (half a batch's time on average, ~10 ms
at the rate bench/peers.py produces runs), then write the runs queued meanwhile (DuckDB's
fixed cost of ~7 ms a batch, then ~40 µs a run): one after the other, while the flow's
thread waited. On a DuckDB file the flush now writes them on a second connection while the
batch in flight goes on (DuckDB commits two transactions appending to the same tables side
by side, and both connections work off the GIL), then waits for that batch as before.

It is an optimisation only: whatever does not go in beside (a failure of any kind, or a
backend with one connection) goes back to the front of the queue untouched, for the drain
that follows, which has every fallback (store/writer.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .writer import Writer

__all__ = ["write_beside"]


def write_beside(writer: "Writer") -> None:
    """If the background thread is writing a batch, write (up to a batch of) what is queued now beside it."""
    backlog = writer.backlog
    if not writer.writing() or backlog.failure is not None or not len(backlog):
        return
    taken = backlog.take(backlog.seq)
    try:
        batch = writer.batch_of(taken.runs)
        beside = writer.backend.insert_beside(batch)
    except Exception:  # noqa: BLE001 - the drain writes them again, with its fallbacks, and says what fails
        beside = False
    if not beside:
        backlog.put_back(taken, taken.runs, None)
        return
    if batch.rows["run_embeddings"]:
        writer.on_embeddings(batch.rows["run_embeddings"])
    writer.done(taken)
