"""The step journal: durable progress as rows of the database, where there is no run journal.

A DuckDB file journals to `<file>.journal/` (store/run_log.py). A PostgreSQL database (any
worker must be able to recover another's runs) and `:memory:` journal here instead:
durability "stage" appends one `step_journal` row per finished stage (its rows as JSON)
and one when the run ends; `Store(flush_interval=0)` appends one per run. The background
writer later moves a finished run into the real tables and deletes its journal rows in the
same transaction. Opening after a crash replays what the journal holds (files written by
older versions too): every finished stage is kept, and a run that never ended is marked
`interrupted`.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from ..record import Decision, Read, Step, Write
from ..run import Run
from ..text import clip
from .batch import GIVEN, Batch, Mark, end_facts, padded_run_row, rows_since, run_row
from .log_codec import as_text


def _content(steps: Iterable[Step], reads: Iterable[Read], writes: Iterable[Write],
             decisions: Iterable[Decision], rows: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {"steps": [list(s) for s in steps], "reads": [list(r) for r in reads], "writes": [list(w) for w in writes],
            "decisions": [[d.step, d.chosen, d.evidence] for d in decisions],
            "rows": [[t, r] for t, r in rows if not t.startswith("_")]}


def step_entry(step: Step, reads: list[Read], writes: list[Write], decision: Optional[Decision],
               rows: list[tuple[str, dict[str, Any]]]) -> str:
    return json.dumps(_content([step], reads, writes, [decision] if decision else [], rows), default=as_text)


def end_entry(run: Run) -> str:
    return json.dumps(end_facts(run))


def part_entry(run: Run, start: Mark) -> str:
    """The record a resumed run added since `start` (what it already had in the tables), as one entry."""
    steps, reads, writes, decisions, rows = start
    return json.dumps(_content(run.raw_steps[steps:], run.raw_reads[reads:], run.raw_writes[writes:],
                               run.decisions[decisions:], rows_since(run, rows)), default=as_text)


def run_entry(run: Run, lease: Optional[str] = None) -> str:
    return json.dumps({"run": list(run_row(run, lease)), **_content(run.raw_steps, run.raw_reads, run.raw_writes,
                                                                  run.decisions, rows_since(run))}, default=as_text)


def replay(entries: Iterable[tuple[str, int, str, str]]) -> tuple[Batch, dict[str, Optional[dict[str, Any]]]]:
    """A batch holding what journal entries (run_id, step, kind, payload) recorded, and the runs that
    ended: with their end facts, or None for a run journaled whole (its runs row is in the batch).
    An entry that cannot be read (edited, truncated) is left out and named in its run's notes."""
    batch = Batch()
    ends: dict[str, Optional[dict[str, Any]]] = {}
    width = len(GIVEN["runs"])
    for run_id, step, kind, payload in entries:
        part = Batch()
        try:
            data = json.loads(payload)
            if kind == "end":
                ends[run_id] = dict(data)
                continue
            if kind == "run":
                row = list(data["run"])[:width]
                part.rows["runs"].append(padded_run_row(row))  # older entries: fewer columns
            part.add_steps(run_id, [Step(*s[:11], tuple(s[11])) for s in data["steps"]],
                           [Read(*r) for r in data["reads"]], [Write(*w) for w in data["writes"]],
                           [Decision(*d) for d in data["decisions"]])
            part.add_extra((t, r) for t, r in data["rows"])
        except Exception as err:  # noqa: BLE001 - any malformed entry: keep the rest of the journal
            batch.notes.setdefault(run_id, []).append(
                f"step_journal entry ({kind}, step {step}) could not be read and was left out: "
                f"{type(err).__name__}: {clip(str(err), 120)}; payload began {clip(repr(payload), 80)}")
            continue
        if kind == "run":
            ends[run_id] = None
        batch.merge(part)
    return batch, ends


def recover(con: Any, run_ids: list[str]) -> list[str]:
    """Move the journal of runs whose process is gone into the tables; returns the runs that never ended."""
    if not run_ids:
        return []
    entries = con.execute("SELECT run_id, step, kind, payload FROM step_journal WHERE run_id IN "
                          "(SELECT unnest(?::VARCHAR[])) ORDER BY run_id, step", [run_ids]).fetchall()
    batch, ends = replay(entries)
    unreadable = [r for r in batch.notes if r not in ends]
    if unreadable:  # a run whose runs row was only in an unreadable entry still gets one, saying so
        have = {r for (r,) in con.execute("SELECT run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                                          [unreadable]).fetchall()}
        have |= {row[0] for row in batch.rows["runs"]}
        width = len(GIVEN["runs"])
        for run_id in unreadable:
            if run_id not in have:
                row = [None] * width
                row[0], row[3], row[4] = run_id, "interrupted", "its step_journal entry could not be read (see notes)"
                batch.rows["runs"].append(tuple(row))
    batch.finished = [(run_id, end) for run_id, end in ends.items() if end is not None]
    batch.journaled = list(run_ids)
    batch.insert(con)
    return [r for r in run_ids if r not in ends]
