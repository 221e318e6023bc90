"""What a run's page shows of the whole run, however long: which page of steps, the stage graph, the
timeline's scale, the paths it wrote. The database computes each (a count, an aggregate, a window
function), so a page of a 200,000-step run reads what a page of a 200-step one does: the run's head,
one page of steps with their rows (store/read/load.py `load_runs(steps=…)`), and these answers.

The stage graph groups steps the way the runner ran them: a step on its own, or the branches of one
fork (consecutive `fork-branch` steps of different stages) side by side; one column per stage at the
group where it first ran, one arrow per transition between consecutive groups (×N when taken N
times, labelled with the branch a decider chose the first time). A run with more stages than the page draws shows
the first ones and says how many more there are ("show more" asks for twice as many).

Every query is written once for DuckDB and PostgreSQL (the functions both lack are in the
PostgreSQL schema: store/pg/schema.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .graphs import Edge, Node, layout, svg
from .queries import rows

__all__ = ["GRAPH_STAGES", "PAGER_SPAN", "WIDE", "Window", "paths_written", "stage_graph", "window"]

GRAPH_STAGES = 150  # stages the stage graph draws unless the page asks for more
PAGER_SPAN = 5  # pages of steps linked on either side of the one shown


@dataclass
class Window:
    """Which steps of a run one page shows: positions lo..hi-1 of `total`, step numbers first..last."""

    lo: int
    hi: int
    total: int
    first: Optional[int] = None
    last: Optional[int] = None
    numbers: frozenset[int] = frozenset()
    pages: list[tuple[int, int, bool, bool]] = field(default_factory=list)  # linked pages: (first, last step,
    # shown, pages skipped before it)

    def href(self, step: Optional[int], anchor: str) -> str:
        """A link to `#anchor` on the page that shows `step` (this one, or the page of the run that does)."""
        if step is None or step in self.numbers:
            return f"#{anchor}"
        return f"?at={step}#{anchor}"


def window(store: Any, run_id: str, at: Optional[int], prompt: Optional[str], size: int) -> Window:
    """The page of `size` steps holding step `at` (or the model call of prompt `prompt`); the first by default."""
    if at is None and prompt:
        found = rows(store, "SELECT step FROM model_calls WHERE run_id = ? AND prompt_id = ? UNION ALL "
                            "SELECT step FROM prompts WHERE run_id = ? AND prompt_id = ?",
                     [run_id, prompt, run_id, prompt])
        at = found[0]["step"] if found else None
    total = rows(store, "SELECT count(*) AS n FROM steps WHERE run_id = ?", [run_id])[0]["n"]
    index = 0
    if at is not None and rows(store, "SELECT 1 AS x FROM steps WHERE run_id = ? AND step = ?", [run_id, at]):
        index = rows(store, "SELECT count(*) AS n FROM steps WHERE run_id = ? AND step < ?", [run_id, at])[0]["n"]
    lo = index // size * size
    hi = min(lo + size, total)
    numbers = [r["step"] for r in rows(store, f"SELECT step FROM steps WHERE run_id = ? ORDER BY step "
                                              f"LIMIT {int(size)} OFFSET {int(lo)}", [run_id])]
    win = Window(lo, hi, total, numbers[0] if numbers else None, numbers[-1] if numbers else None, frozenset(numbers))
    if total > size:
        win.pages = _pages(store, run_id, lo, total, size)
    return win


def _pages(store: Any, run_id: str, lo: int, total: int, size: int) -> list[tuple[int, int, bool, bool]]:
    """The pages the pager links: the first, the last, and PAGER_SPAN on either side of the one shown."""
    count = -(-total // size)
    here = lo // size
    shown = sorted({0, count - 1, *range(max(0, here - PAGER_SPAN), min(count, here + PAGER_SPAN + 1))})
    wanted = [i * size for i in shown] + [min((i + 1) * size, total) - 1 for i in shown]
    at = {r["i"]: r["step"] for r in rows(
        store, "SELECT i, step FROM (SELECT step, row_number() OVER (ORDER BY step) - 1 AS i FROM steps "
               "WHERE run_id = ?) t WHERE i IN (SELECT unnest(?::BIGINT[]))", [run_id, wanted])}
    return [(at[i * size], at[min((i + 1) * size, total) - 1], i == here, n > 0 and i - shown[n - 1] > 1)
            for n, i in enumerate(shown)]


def paths_written(store: Any, run_id: str, cap: int = 500) -> tuple[list[str], str]:
    """Paths the run wrote, in first-written order (at most `cap`), and the one a backtrack starts from:
    `answer` if written, else the path first written last."""
    ordered = ("SELECT path, step, seq FROM (SELECT path, step, seq, row_number() OVER (PARTITION BY path "
               "ORDER BY step, seq) AS nth FROM writes WHERE run_id = ?) w WHERE nth = 1")
    paths = [r["path"] for r in rows(store, f"{ordered} ORDER BY step, seq LIMIT {int(cap)}", [run_id])]
    if "answer" in paths or rows(store, "SELECT 1 AS x FROM writes WHERE run_id = ? AND path = 'answer' LIMIT 1",
                                 [run_id]):
        return paths, "answer"
    last = rows(store, f"{ordered} ORDER BY step DESC, seq DESC LIMIT 1", [run_id])
    return paths, last[0]["path"] if last else ""


_UNITS = """WITH s AS (
    SELECT step, stage, kind, status, routed_by, epoch_ns(ended_at) - epoch_ns(started_at) AS ns,
           lag(kind) OVER (ORDER BY step) AS prev_kind, lag(stage) OVER (ORDER BY step) AS prev_stage
    FROM steps WHERE run_id = ?),
u AS MATERIALIZED (
    SELECT s.*, sum(CASE WHEN kind = 'fork-branch' AND prev_kind = 'fork-branch' AND stage <> prev_stage
                         THEN 0 ELSE 1 END) OVER (ORDER BY step) AS unit
    FROM s)"""


WIDE = 5  # columns of boxes that fit a 1440 px page side by side


def stage_graph(store: Any, run_id: str, href: Callable[[int, str], str], cap: int = GRAPH_STAGES) -> tuple[str, int]:
    """The stages that ran, as an SVG (the first `cap` of them by first run), and how many more there are."""
    stages = rows(store, f"""{_UNITS}
        SELECT stage, min(kind) AS kind, count(*) AS n, min(step) AS first,
               min(unit) AS unit, bool_or(status <> 'ok') AS failed, sum(ns) AS ns
        FROM u GROUP BY stage ORDER BY first""", [run_id])
    drawn, hidden = stages[:cap], max(0, len(stages) - cap)
    keep = {s["stage"] for s in drawn}
    edges = rows(store, f"""{_UNITS},
        pairs AS MATERIALIZED (SELECT a.stage AS src, b.stage AS dst, b.step, b.routed_by
                               FROM u a JOIN u b ON b.unit = a.unit + 1),
        firsts AS (SELECT src, dst, count(*) AS n, min(step) AS step FROM pairs GROUP BY src, dst)
        SELECT f.src, f.dst, f.n, CASE WHEN r.stage = f.src THEN coalesce(d.chosen, '') ELSE '' END AS label
        FROM firsts f JOIN pairs p ON p.src = f.src AND p.dst = f.dst AND p.step = f.step
        LEFT JOIN u r ON r.step = p.routed_by
        LEFT JOIN decisions d ON d.run_id = ? AND d.step = p.routed_by""", [run_id, run_id]) if keep else []
    columns = {unit: n for n, unit in enumerate(sorted({s["unit"] for s in drawn}))}
    nodes = []
    for s in drawn:
        sub = f"{s['kind']}" + (f" ×{s['n']}" if s["n"] > 1 else "") + f" · {(s['ns'] or 0) / 1e6:.1f} ms"
        classes = f"kind-{s['kind']}" + (" failed" if s["failed"] else "")
        tooltip = f"{s['stage']}: {s['n']} run(s), first at step {s['first']}"
        nodes.append(Node(s["stage"], columns[s["unit"]], s["stage"], sub, classes,
                          href(s["first"], f"step-{s['first']}"), tooltip))
    arrows = [Edge(e["src"], e["dst"], "flow", e["label"] or "", e["n"]) for e in edges
              if e["src"] in keep and e["dst"] in keep]
    tall = len(columns) > WIDE  # more columns than a page is wide: top-down rows instead
    return svg(layout(nodes, arrows, vertical=tall), css_class="graph stage-graph", label=f"stage graph of {run_id}"), \
        hidden
