"""Which rows cite a run: the evidence `prune` never removes by accident.

One list, so a table that adds a new way of depending on a run (feedback on a run's
answer, a fork of it) plugs in with one line here. Each citation names the table,
the column holding the cited run's id, and the column holding the citing run's id —
None when the citing row outlives any prune (a memory), so what it cites is always
kept. A run cited by a run that is itself kept is kept, transitively: the earlier
turns of a thread whose last turn is kept, the snapshot a kept run loaded, and
what those cite in turn. A table not in the file (an older schema) is skipped.
"""
from __future__ import annotations

from typing import NamedTuple, Optional


class Citation(NamedTuple):
    """Rows of `table` whose `cited` column names a run that must outlive them."""

    table: str
    cited: str  # column holding the cited run's id
    citing: Optional[str]  # column holding the citing run's id (None: the row outlives every prune)
    reason: str  # how the prune report says why it kept such a run: "kept N run(s) {reason}"


CITATIONS: tuple[Citation, ...] = (
    Citation("memories", "source_run_id", None, "that memories cite"),
    Citation("runs", "continues_run_id", "run_id", "whose thread continues in kept runs"),
    Citation("snapshot_uses", "source_run_id", "run_id", "that kept runs loaded as snapshots"),
    Citation("feedback", "run_id", None, "that people judged (feedback)"),
    Citation("runs", "forked_from_run_id", "run_id", "that kept runs were forked from"),
)
