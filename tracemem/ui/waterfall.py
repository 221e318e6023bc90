"""A run's span waterfall: each step a bar, the model calls and tool calls it made as bars beneath it.

Where did a run's time and tokens go? Langfuse and Phoenix answer with a waterfall of spans, and
so does the run page: steps, and inside them each model call (its model, tokens in → out) and tool
call, on one time scale. A run that waited for a person (a pause, then a resume) would spend
nearly all of its scale on the wait and draw every step as a sliver; so a wait is cut out of the
scale and drawn as a gap of fixed width that says how long it was and who answered. A stretch
between steps counts as a wait when a person's answer was given in it, or when it is longer than a
second and than every step of the run taken together (a resume of an interrupted run), never for
a moment the machine was busy elsewhere.

The page holds one window of a run's steps (ui/run_outline.py); the scale, the waits and the
token totals are the whole run's, worked out by the database (`outline`), so every window is
drawn on the same scale and the page's cost does not grow with the run.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from ..run import Run
from .queries import has_table, rows

__all__ = ["GAP", "IDLE", "Outline", "Waterfall", "outline", "waterfall"]

GAP = 4.0  # percent of the scale a cut-out wait takes
IDLE = 1_000_000_000  # ns: a stretch with no person's answer in it is cut out only when longer (and than all steps)


@dataclass
class Waterfall:
    """Rows for the page (a step, then its calls), the waits cut out, and the run's token totals."""

    rows: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    tokens_in: int = 0
    tokens_out: int = 0
    calls: int = 0
    busy_ms: float = 0.0
    hidden: int = 0  # steps beyond the rows drawn


def _ns(value: Any) -> Optional[int]:
    """A recorded time as nanoseconds since the epoch (live rows hold ints, loaded ones naive UTC datetimes)."""
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(aware.timestamp() * 1_000_000) * 1000
    return None


class _Scale:
    """Real time → percent of the bar, with the waits cut out (each drawn GAP wide)."""

    def __init__(self, start: int, end: int, waits: list[tuple[int, int]]) -> None:
        self.start, self.waits = start, sorted(waits)
        cut = sum(b - a for a, b in self.waits)
        self.unit = (100.0 - GAP * len(self.waits)) / max(end - start - cut, 1)

    def at(self, t: int) -> float:
        shift, gaps = 0, 0.0
        for a, b in self.waits:
            if t >= b:
                shift, gaps = shift + (b - a), gaps + GAP
            elif t > a:
                return round((a - self.start - shift) * self.unit + gaps + GAP * (t - a) / (b - a), 3)
        return round((t - self.start - shift) * self.unit + gaps, 3)


@dataclass
class Outline:
    """The whole run's time scale (ns), the waits in it, and its model calls' totals."""

    start: int
    end: int
    waits: list[dict[str, Any]]
    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    busy_ms: float = 0.0


_SPAN = ("SELECT coalesce(sum(epoch_ns(ended_at) - epoch_ns(started_at)), 0) AS busy, min(epoch_ns(started_at)) "
         "AS first, max(epoch_ns(ended_at)) AS last FROM steps WHERE run_id = ?")
_WAITS = """WITH o AS (SELECT step, epoch_ns(ended_at) AS done, lead(epoch_ns(started_at)) OVER (ORDER BY step) AS next
                  FROM steps WHERE run_id = ?)
    SELECT o.step, o.done, o.next {who} FROM o {join}
    WHERE o.next > o.done AND ({person} o.next - o.done > ?) ORDER BY o.step LIMIT 100"""


def outline(store: Any, run_id: str, ended_at: Optional[int]) -> Outline:
    """The scale, waits and token totals of run `run_id`, from the database (a few aggregate queries)."""
    span = rows(store, _SPAN, [run_id])[0]
    busy = int(span["busy"] or 0)
    people = has_table(store, "human_inputs", "run_id", "answered_at")
    sql = _WAITS.format(
        who=", h.answered_by AS person, h.at AS answered" if people else ", NULL AS person, NULL AS answered",
        join=("LEFT JOIN (SELECT answered_by, epoch_ns(answered_at) AS at FROM human_inputs WHERE run_id = ?) h "
              "ON h.at BETWEEN o.done AND o.next") if people else "",
        person="h.at IS NOT NULL OR" if people else "")
    idle = max(busy, IDLE)
    found = rows(store, sql, [run_id, run_id, idle] if people else [run_id, idle])
    waits: list[dict[str, Any]] = []
    for r in found:
        if waits and waits[-1]["after_step"] == r["step"]:
            continue  # two answers in one wait
        waits.append({"start": r["done"], "end": r["next"], "after_step": r["step"], "by": r.get("person"),
                      "person": r.get("answered") is not None, "ms": (r["next"] - r["done"]) / 1e6})
    totals = rows(store, "SELECT count(*) AS n, sum(input_tokens) AS tin, sum(output_tokens) AS tout FROM model_calls "
                         "WHERE run_id = ?", [run_id])[0]
    start = int(span["first"] or 0)
    end = max(int(span["last"] or 0), ended_at or 0, start + 1)
    return Outline(start, end, waits, totals["n"] or 0, int(totals["tin"] or 0), int(totals["tout"] or 0), busy / 1e6)


def _calls(models: Any, tools: Any, scale: _Scale) -> dict[int, list[dict[str, Any]]]:
    """The model and tool calls of each step, placed on the scale (a call recorded without a start is left out)."""
    out: dict[int, list[dict[str, Any]]] = {}
    spans = [(c, "latency_ms", {"kind": "model", "name": c.get("model") or "model", "tokens_in": c.get("input_tokens"),
                                "tokens_out": c.get("output_tokens"), "replayed": bool(c.get("replayed"))})
             for c in models]
    spans += [(t, "duration_ms", {"kind": "tool", "name": t.get("name") or "tool"}) for t in tools]
    for row, took, shown in spans:
        start = _ns(row.get("started_at"))
        if start is None:
            continue
        ms = float(row.get(took) or 0.0)
        left = scale.at(start)
        out.setdefault(row["step"], []).append({**shown, "ms": ms, "error": row.get("error"), "left": left,
                                                "width": max(scale.at(start + int(ms * 1e6)) - left, 0.3)})
    return out


def waterfall(run: Run, whole: Outline, tool_calls: Optional[list[dict[str, Any]]] = None,
              limit: int = 500) -> Waterfall:
    """The waterfall of the steps `run` holds (at most `limit`) on the whole run's scale, waits cut out.
    `tool_calls`: the steps' tool calls, when the run's rows lack them."""
    scale = _Scale(whole.start, whole.end, [(g["start"], g["end"]) for g in whole.waits])
    gaps = [{**g, "left": scale.at(g["start"])} for g in whole.waits]
    tools = run.rows.get("tool_calls") if tool_calls is None else tool_calls
    by_step = _calls(run.rows.get("model_calls", ()), tools or (), scale)
    out = []
    for s in run.steps[:limit]:
        if not s.ended_at:
            continue
        left = scale.at(s.started_at)
        out.append({"kind": "step", "step": s.step, "stage": s.stage, "status": s.status, "step_kind": s.kind,
                    "ms": (s.ended_at - s.started_at) / 1e6, "left": left,
                    "width": max(scale.at(s.ended_at) - left, 0.4)})
        out += [{**c, "step": s.step} for c in by_step.get(s.step, ())]
    return Waterfall(out, gaps, whole.tokens_in, whole.tokens_out, whole.calls, whole.busy_ms,
                     max(0, len(run.steps) - limit))
