"""Recovery: what a journal holds that the tables do not, put in when a store opens.

A DuckDB file's journal (store/write/journal.py) is read from the position the tables
hold (`journal_applied`); PostgreSQL's `step_journal` rows are read for the runs of
writers that are gone (store/opening.py, store/pg/lease.py). Either way the entries are
replayed into one batch: a whole run's rows, a "stage" run's runs row and finished
stages, a resumed run's additions, end facts. A run that never ended is marked
`interrupted` by the caller. What is in the tables already is left out (a journal whose
position was lost is still applied once), and an entry that cannot be read is named in
its run's notes and in the log, never applied.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from ...dbmeta import get_meta, set_meta
from ...record import Decision, Read, Step, Write
from ...text import clip
from .journal import Entry, read_entries
from .rows import GIVEN, Batch

__all__ = ["replay", "recover_rows", "recover_file"]


def replay(entries: Iterable[Entry]) -> tuple[Batch, dict[str, Optional[dict[str, Any]]]]:
    """A batch holding what journal entries recorded, and the runs that ended: with their end facts, or None
    for a run journaled whole (its runs row is in the batch). An unreadable entry is left out, named in notes."""
    batch = Batch()
    ends: dict[str, Optional[dict[str, Any]]] = {}
    width = len(GIVEN["runs"])
    for run_id, step, kind, payload in entries:
        try:
            data = json.loads(payload)
            if kind == "end":
                ends[run_id] = dict(data)
                continue
            if kind in ("run", "begin"):
                batch.rows["runs"].append(padded_run_row(list(data["run"])[:width]))  # older entries: fewer columns
            if kind == "begin":
                continue
            batch.add_steps(run_id, [Step(*s[:11], tuple(s[11])) for s in data["steps"]],
                            [Read(*r) for r in data["reads"]], [Write(*w) for w in data["writes"]],
                            [Decision(*d) for d in data["decisions"]])
            batch.add_extra((t, r) for t, r in data["rows"])
        except Exception as err:  # noqa: BLE001 - any malformed entry: keep the rest of the journal
            batch.notes.setdefault(run_id, []).append(
                f"journal entry ({kind}, step {step}) could not be read and was left out: "
                f"{type(err).__name__}: {clip(str(err), 120)}; it began {clip(repr(payload), 80)}")
            continue
        if kind == "run":
            ends[run_id] = None
    return batch, ends


def padded_run_row(row: Sequence[Any]) -> tuple:
    """A runs row journaled by an older version (fewer columns), padded with NULLs."""
    return tuple(row) + (None,) * (len(GIVEN["runs"]) - len(row))


def _new_only(con: Any, batch: Batch) -> None:
    """Leave out of `batch` the runs rows and steps the tables hold already."""
    ids = sorted({row[0] for row in batch.rows["runs"]} | set(batch.records["steps"][0]))
    if not ids:
        return
    have = {r for (r,) in con.execute("SELECT run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                                      [ids]).fetchall()}
    batch.rows["runs"] = [row for row in batch.rows["runs"] if row[0] not in have]
    done = set(con.execute("SELECT run_id, step FROM steps WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                           [ids]).fetchall())
    for table in ("steps", "reads", "writes"):
        run_ids, records = batch.records[table]
        kept = [(r, rec) for r, rec in zip(run_ids, records) if (r, rec[0]) not in done]
        batch.records[table] = ([r for r, _ in kept], [rec for _, rec in kept])
    for table in ("decisions", *(t for t in batch.rows if t not in ("runs", "decisions", "run_embeddings"))):
        batch.rows[table] = [row for row in batch.rows[table]
                             if "step" not in dict(GIVEN[table]) or (row[0], row[_STEP[table]]) not in done]


_STEP = {t: [c for c, _ in cols].index("step") for t, cols in GIVEN.items() if any(c == "step" for c, _ in cols)}


def _finish(con: Any, batch: Batch, ends: dict[str, Optional[dict[str, Any]]], run_ids: Iterable[str]) -> list[str]:
    """Insert the batch (the ended runs' rows completed); the runs that never ended."""
    batch.finished = [(run_id, end) for run_id, end in ends.items() if end is not None]
    batch.insert(con)
    return [r for r in run_ids if r not in ends]


def recover_rows(con: Any, run_ids: list[str]) -> list[str]:
    """Move the `step_journal` rows of runs whose process is gone into the tables; the runs that never ended."""
    if not run_ids:
        return []
    entries = con.execute("SELECT run_id, step, kind, payload FROM step_journal WHERE run_id IN "
                          "(SELECT unnest(?::VARCHAR[])) ORDER BY run_id, step", [run_ids]).fetchall()
    batch, ends = replay(entries)
    _new_only(con, batch)
    batch.journaled = [(run_id, None) for run_id in run_ids]
    return _finish(con, batch, ends, run_ids)


def recover_file(con: Any, path: str, log: Callable[[str], None]) -> list[str]:
    """Apply what a DuckDB file's journal holds past `journal_applied`, then empty it; the runs found that never
    ended. A journal that belongs to another file (this one was deleted and made again) is moved aside."""
    if os.path.isdir(path):  # a journal of the segmented format older versions wrote: not read, kept aside
        aside = f"{path}.orphaned-{int(time.time())}"
        os.rename(path, aside)
        log(f"{path} is a run journal of an older tracemem version; moved aside to {aside}, not applied")
    if not os.path.exists(path):
        return []
    if _orphan(con, path):
        aside = f"{path}.orphaned-{int(time.time())}"
        os.rename(path, aside)
        log(f"the run journal {path} belongs to another store file (this one was made anew); moved aside to "
            f"{aside}, not applied")
        return []
    start = int(get_meta(con, "journal_applied") or 0)
    entries: list[Entry] = []
    damaged: Optional[str] = None
    for entry, pos, damage in read_entries(path, start if start <= os.path.getsize(path) else 0):
        if damage is not None:
            damaged = f"the run journal {path} held {damage} at byte {pos}: it and what followed were not applied"
            log(damaged)
            break
        if entry[2] != "journal":  # type: ignore[index]  # (its header)
            entries.append(entry)  # type: ignore[arg-type]
    if not entries:
        _emptied(con, path)
        return []
    batch, ends = replay(entries)
    _new_only(con, batch)
    started = list(dict.fromkeys(e[0] for e in entries if e[2] in ("run", "begin", "step")))
    for run_id in started if damaged else ():
        if run_id not in ends:  # a run the damage may have cut short says so
            batch.notes.setdefault(run_id, []).append(damaged)  # type: ignore[arg-type]
    unended = _finish(con, batch, ends, started)
    log(f"recovered {len(set(e[0] for e in entries))} run(s) from the run journal {path}")
    _emptied(con, path)
    return unended


def _orphan(con: Any, path: str) -> bool:
    """Whether the journal at `path` was written for another file: its first entry names another journal id."""
    first = next(read_entries(path, 0), None)
    if first is None or first[0] is None:
        return False
    return first[0][2] == "journal" and first[0][3] != get_meta(con, "journal_id")


def _emptied(con: Any, path: str) -> None:
    """The tables hold the whole journal: truncate it, then say so (a crash between the two re-reads nothing
    twice: the position is past the end of an empty file, so it is read from its start, and nothing is there)."""
    with open(path, "r+b") as f:
        f.truncate(0)
        os.fsync(f.fileno())
    set_meta(con, "journal_applied", "0")
