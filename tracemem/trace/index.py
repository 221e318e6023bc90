"""Lookups over one run's record, built once per run a backtrack walks through.

`RunIndex` holds a loaded run whole; `StoredIndex` (trace/stored_index.py) answers the same questions
from the store, a block of steps at a time, for a run too long to load (the viewer's backtrack page).
The walker asks only through these members.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from ..record import Read, RunRecord, Write
from ..scope.paths import parse_path



class RunIndex:
    """Lookups over one run's record used while walking it."""

    def __init__(self, run: "RunRecord") -> None:
        self.run = run
        failed = {s.step for s in run.steps if s.status != "ok"}
        self.steps = {s.step: s for s in run.steps}
        self.reads: dict[int, list[Read]] = {}
        for r in run.reads:
            self.reads.setdefault(r.step, []).append(r)
        self.writes: dict[tuple[int, int], Write] = {}
        self.by_root: dict[str, list[Write]] = {}
        for w in run.writes:
            if w.step in failed:
                continue
            self.writes[(w.step, w.seq)] = w
            self.by_root.setdefault(parse_path(w.path)[0], []).append(w)
        self.position = {(w.step, w.seq): i for ws in self.by_root.values() for i, w in enumerate(ws)}
        self.decisions = {d.step: d for d in run.decisions}
        self.inputs: dict[str, Any] = json.loads(run.input_json) if run.input_json else {}
        self.given = set(self.inputs) if run.continues else set()
        self._rows_by_step: dict[str, dict[int, list[dict[str, Any]]]] = {}
        self._from_model: dict[int, bool] = {}

    def node_write(self, w: Write) -> str:
        return f"w:{self.run.run_id}:{w.step}:{w.seq}"

    def last_write(self, path: str) -> Optional[Write]:
        wanted = parse_path(path)
        for w in reversed(self.by_root.get(wanted[0], [])):
            p = parse_path(w.path)
            n = min(len(p), len(wanted))
            if p[:n] == wanted[:n]:
                return w
        return None

    def previous(self, w: Write) -> Optional[Write]:
        """The committed write of `w`'s field just before `w` (None: `w` is its first)."""
        pos = self.position[(w.step, w.seq)]
        return self.by_root[parse_path(w.path)[0]][pos - 1] if pos > 0 else None

    def last_upto(self, field: str, step: int) -> Optional[Write]:
        """The last committed write of `field` at or before step `step`."""
        before = [w for w in self.by_root.get(field, ()) if w.step <= step]
        return before[-1] if before else None

    def sections(self, prompt_id: str) -> list[dict[str, Any]]:
        """The sections of prompt `prompt_id`, in order."""
        return [r for r in self.run.rows.get("prompt_sections", ()) if r["prompt_id"] == prompt_id]

    def fields(self) -> Optional[list[str]]:
        """The fields the run wrote, when its record does not hold its writes (None: it does)."""
        return None

    def own_writes(self, root: str) -> Optional[list[Write]]:
        """This run's committed writes of field `root` when its thread (`run.thread`) cannot hold them; None:
        it does."""
        return None

    def model_output(self, read: Read) -> bool:
        """Whether a read saw a value derived from a model's reply, not the user's words: written by a step
        that called a model, or by a step that read such a value (`final` copying the reply into `answer`)."""
        return read.source_step is not None and self.from_model(read.source_step)

    def from_model(self, step: int) -> bool:
        """Whether what `step` wrote may carry a model's reply: it called a model, or read what such a step
        wrote. Worked out for every step at once, in run order, the first time it is asked."""
        if not self._from_model:
            for at in sorted(self.steps):
                self._from_model[at] = bool(self.rows("model_calls", at)) or any(
                    self._from_model.get(r.source_step, False) for r in self.reads.get(at, ())
                    if r.source_step is not None and r.source_step < at)
        return self._from_model.get(step, False)

    def rows(self, table: str, step: int) -> list[dict[str, Any]]:
        """The extra rows (`model_calls`, `memory_uses`, ...) one step emitted."""
        by_step = self._rows_by_step.get(table)
        if by_step is None:
            by_step = self._rows_by_step[table] = {}
            for row in self.run.rows.get(table, ()):
                by_step.setdefault(row["step"], []).append(row)
        return by_step.get(step, [])
