"""Blast radius: every run and every value that depended on a source, from the record alone.

A source enters a run at a step: a memory where recall injected it (or a prompt
line quoted it), a prompt-section source where a prompt was assembled from it, a
model where it was called, a past run where `load_snapshot` loaded it. From there
dependence flows forward along what was recorded, never along text similarity:
- within a run, a step that read a tainted write taints the writes it made after
  that read; a decider that read one taints the steps it routed;
- across runs, a run that continued a tainted one (`resume=`) is tainted where it
  read carried-over fields whose last write was tainted; a memory extracted in a
  tainted step is itself a source; a run that loaded a tainted run as a snapshot
  is tainted from that step; a subflow's parent step is tainted with its child.
Each affected run lists the value paths that depended on the source and how the
source reached it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...scope.paths import root_of
from .sources import Source, parse_source

ALL = -1  # an entry that taints the whole run (its pipeline version is the source)


@dataclass
class AffectedRun:
    """One run that depended on the source: the values that did, and how the source got there."""

    run_id: str
    via: str
    paths: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)


@dataclass
class AffectedReport:
    """`store.affected(source)`: the runs and values that depended on it."""

    source: Source
    runs: dict[str, AffectedRun]
    memories: list[str]  # memories learned from tainted steps (themselves sources, followed)

    def __str__(self) -> str:
        if not self.runs:
            return f"nothing recorded depended on {self.source}"
        lines = [f"{len(self.runs)} run(s) depended on {self.source}"]
        for r in self.runs.values():
            shown = ", ".join(r.paths[:8]) + (" …" if len(r.paths) > 8 else "")
            lines.append(f"  {r.run_id}  {shown or '(no value written after it)'}  ← {r.via}")
        if self.memories:
            lines.append("memories learned from them: " + ", ".join(self.memories))
        return "\n".join(lines)


class _Record:
    """The reads, writes and routing of the runs being walked, loaded in bulk."""

    def __init__(self, con: Any, run_ids: list[str]) -> None:
        ids = [run_ids]
        self.steps: dict[str, dict[int, Optional[int]]] = {r: {} for r in run_ids}  # step → routed_by
        for rid, step, routed in con.execute(
                "SELECT run_id, step, routed_by FROM steps WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
                "AND status = 'ok' ORDER BY run_id, step", ids).fetchall():
            self.steps[rid][step] = routed
        self.reads: dict[tuple[str, int], list[tuple]] = {}
        for rid, step, seq, path, sstep, sseq in con.execute(
                "SELECT run_id, step, seq, path, source_step, source_seq FROM reads "
                "WHERE run_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY run_id, step, seq", ids).fetchall():
            self.reads.setdefault((rid, step), []).append((seq, path, sstep, sseq))
        self.writes: dict[tuple[str, int], list[tuple]] = {}
        self.last_write: dict[str, dict[str, tuple[int, int]]] = {r: {} for r in run_ids}  # run → field → write
        for rid, step, seq, path in con.execute(
                "SELECT w.run_id, w.step, w.seq, w.path FROM writes w JOIN steps s USING (run_id, step) "
                "WHERE w.run_id IN (SELECT unnest(?::VARCHAR[])) AND s.status = 'ok' ORDER BY w.run_id, w.step, w.seq",
                ids).fetchall():
            self.writes.setdefault((rid, step), []).append((seq, path))
            self.last_write[rid][root_of(path)] = (step, seq)
        self.given: dict[str, set[str]] = {}  # a resumed run's own input fields (not carried over)
        self.children: dict[tuple[str, int], str] = {}
        for rid, keys, continues in con.execute(
                "SELECT run_id, json_keys(input), continues_run_id FROM runs WHERE run_id IN "
                "(SELECT unnest(?::VARCHAR[]))", ids).fetchall():
            self.given[rid] = set(keys or ()) if continues else set()
        for rid, step, child in con.execute(
                "SELECT run_id, step, child_run_id FROM steps WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
                "AND child_run_id IS NOT NULL", ids).fetchall():
            self.children[(rid, step)] = child


# Where each kind of source enters a run: (SQL giving run, step, how; its parameters from the source id).
_ENTRIES: dict[str, tuple[str, Callable[[str], list[Any]]]] = {
    "memory": ("SELECT run_id, step, 'memory ' || memory_id || ' injected' FROM memory_uses "
               "WHERE memory_id = ? AND outcome = 'injected' UNION "
               "SELECT run_id, step, 'memory ' || source_id || ' quoted in a prompt' FROM prompt_sections "
               "WHERE source_kind = 'memory' AND source_id = ?", lambda i: [i, i]),
    "run": ("SELECT run_id, step, 'loaded run ' || source_run_id || ' as a snapshot' FROM snapshot_uses "
            "WHERE source_run_id = ?", lambda i: [i]),
    "section": ("SELECT run_id, step, 'prompt section from ' || source_kind || ':' || source_id FROM prompt_sections "
                "WHERE source_kind = ? AND source_id = ?", lambda i: list(i.partition(":")[::2])),
    "model": ("SELECT run_id, step, 'called model ' || model FROM model_calls WHERE model = ?", lambda i: [i]),
    "stage": ("SELECT s.run_id, s.step, 'ran stage ' || s.stage FROM steps s JOIN runs r USING (run_id) "
              "WHERE s.stage = ? AND r.pipeline_hash = ? AND s.status = 'ok'", lambda i: list(i.rpartition("@")[::2])),
    "tool": ("SELECT run_id, step, 'called tool ' || name FROM tool_calls WHERE name = ?", lambda i: [i]),
    "pipeline": (f"SELECT run_id, {ALL}, 'ran pipeline version ' || pipeline_hash FROM runs WHERE pipeline_hash = ?",
                 lambda i: [i]),
}


def _entries(con: Any, source: Source) -> list[tuple[str, int, str]]:
    """(run, step, how) where the source entered a run directly."""
    sql, params = _ENTRIES[source.kind]
    return [tuple(r) for r in con.execute(sql, params(source.id)).fetchall()]  # type: ignore[misc]


def _propagate(record: _Record, run_id: str, entry_steps: dict[int, str], carried: set[str]
               ) -> tuple[set[int], set[str], set[str]]:
    """Forward taint through one run: (tainted steps, paths written tainted, fields whose final value is
    tainted — for the runs that continue this one)."""
    carried = carried - record.given.get(run_id, set())
    tainted: set[tuple[int, int]] = set()
    steps: set[int] = set()
    paths: set[str] = set()
    whole = ALL in entry_steps
    for step, routed_by in record.steps.get(run_id, {}).items():
        start: Optional[int] = 0 if whole or step in entry_steps or (routed_by in steps) else None
        for seq, path, sstep, sseq in record.reads.get((run_id, step), ()):
            if start is not None and start <= seq:
                break
            if (sstep is not None and (sstep, sseq) in tainted) or (sstep is None and root_of(path) in carried):
                start = seq
                break
        if start is None:
            continue
        steps.add(step)
        for seq, path in record.writes.get((run_id, step), ()):
            if seq > start or start == 0:
                tainted.add((step, seq))
                paths.add(path)
    last = record.last_write.get(run_id, {})
    final = {f for f, w in last.items() if w in tainted} | {f for f in carried if f not in last}
    return steps, paths, final


def affected(con: Any, source: Any, *, max_runs: int = 100_000) -> AffectedReport:
    """Every run and value that depended on `source` (see the module docstring)."""
    src = parse_source(source, con)
    report = AffectedReport(src, {}, [])
    pending: dict[str, dict[int, str]] = {}  # run → entry step → how
    carried_in: dict[str, set[str]] = {}  # run → carried-over fields that arrive tainted
    for run_id, step, how in _entries(con, src):
        pending.setdefault(run_id, {})[step] = how
    seen = {src.id} if src.kind == "memory" else set()  # memories already followed
    while pending and len(report.runs) < max_runs:
        batch, pending = pending, {}
        record = _Record(con, list(batch))
        tainted_steps: dict[str, set[int]] = {}
        final_fields: dict[str, set[str]] = {}
        for run_id, entries in batch.items():
            steps, paths, final = _propagate(record, run_id, entries, carried_in.pop(run_id, set()))
            if not steps and not final:
                continue
            how = entries[min(entries)] if entries else "carried over from the run it continues"
            known = report.runs.setdefault(run_id, AffectedRun(run_id, how))
            roots = {root_of(p) for p in paths}
            known.paths = sorted(set(known.paths) | paths | {f"{f} (carried)" for f in final if f not in roots})
            known.steps = sorted(set(known.steps) | steps)
            for step in steps:
                child = record.children.get((run_id, step))
                if child and child not in report.runs:
                    pending.setdefault(child, {})[ALL] = f"subflow of run {run_id}"
            if steps:
                tainted_steps[run_id] = steps
            if final:
                final_fields[run_id] = final
        _follow(con, tainted_steps, final_fields, pending, carried_in, report, seen)
    return report


def _follow(con: Any, tainted: dict[str, set[int]], final: dict[str, set[str]], pending: dict[str, dict[int, str]],
            carried_in: dict[str, set[str]], report: AffectedReport, seen: set[str]) -> None:
    """Queue what a batch of tainted runs passes the taint on to (a few queries per batch, not per run)."""
    pairs = [(r, s) for r, steps in tainted.items() for s in steps]
    ids = sorted(tainted)
    learned = con.execute(
        "SELECT m.memory_id, m.source_run_id FROM memories m JOIN (SELECT unnest(?::VARCHAR[]) AS r, "
        "unnest(?::INTEGER[]) AS s) t ON m.source_run_id = t.r AND m.source_step = t.s",
        [[p[0] for p in pairs], [p[1] for p in pairs]]).fetchall() if pairs else []
    fresh = {m: r for m, r in learned if m not in seen}
    seen.update(fresh)
    report.memories.extend(sorted(fresh))
    if fresh:
        for rid, step, how, memory_id in con.execute(
                "SELECT run_id, step, 'memory ' || memory_id || ' injected', memory_id FROM memory_uses "
                "WHERE outcome = 'injected' AND memory_id IN (SELECT unnest(?::VARCHAR[])) UNION "
                "SELECT run_id, step, 'memory ' || source_id || ' quoted in a prompt', source_id FROM "
                "prompt_sections WHERE source_kind = 'memory' AND source_id IN (SELECT unnest(?::VARCHAR[]))",
                [sorted(fresh), sorted(fresh)]).fetchall():
            if rid != fresh[memory_id]:
                pending.setdefault(rid, {})[step] = f"{how}, learned in run {fresh[memory_id]}"
    if ids:
        for rid, step, source_run in con.execute(
                "SELECT run_id, step, source_run_id FROM snapshot_uses WHERE source_run_id IN "
                "(SELECT unnest(?::VARCHAR[]))", [ids]).fetchall():
            if rid not in report.runs or step not in report.runs[rid].steps:
                pending.setdefault(rid, {})[step] = f"loaded run {source_run} as a snapshot"
        for parent, parent_step, child in con.execute(
                "SELECT parent_run_id, parent_step, run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
                "AND parent_run_id IS NOT NULL", [ids]).fetchall():
            if parent not in report.runs:
                pending.setdefault(parent, {})[parent_step] = f"subflow run {child}"
    if final:
        for nxt, previous in con.execute(
                "SELECT run_id, continues_run_id FROM runs WHERE continues_run_id IN (SELECT unnest(?::VARCHAR[]))",
                [sorted(final)]).fetchall():
            carried_in.setdefault(nxt, set()).update(final[previous])
            pending.setdefault(nxt, {})
