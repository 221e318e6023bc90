"""A run's pages: the run (graph, span waterfall, every step), the scope at a step, and a write's full value.

A run id may be given by a unique prefix, as on the command line; the page then redirects to
the full id, so links and bookmarks are stable. A run's page holds one page of its steps
(`STEP_WINDOW`), loaded alone, with what it shows of the whole run computed by the database
(ui/run_outline.py): its cost does not grow with the run.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ..errors import RunNotFoundError, TracememError, UsageError
from ..run import Run
from ..store.read.load import load_runs
from ..text import clip
from .queries import has_table, resolve, rows
from .run_outline import GRAPH_STAGES, paths_written, stage_graph, window
from .run_view import STEP_WINDOW, build_steps, value_text
from .scope_diff import scope_at
from .waterfall import GAP, outline, waterfall
from .web import render, run_url, source

__all__ = ["ROUTES", "canonical", "load_steps"]


def canonical(request: Request, store: Any) -> tuple[str, Optional[Response]]:
    """The full run id of the URL's `run_id`, and a redirect when the URL gave only a prefix."""
    given = request.path_params["run_id"]
    run_id = resolve(store, given)
    if run_id == given:
        return run_id, None
    path = request.url.path.replace(f"/runs/{given}", run_url(run_id), 1)
    query = f"?{request.url.query}" if request.url.query else ""
    return run_id, RedirectResponse(path + query, status_code=302)


def load_steps(store: Any, run_id: str, first: Optional[int], last: Optional[int]) -> Run:
    """Run `run_id` holding steps `first`..`last` alone, with their rows (the whole run when both are None)."""
    steps = None if first is None or last is None else (first, last)
    with store.lock:
        found = load_runs(store, store.backend.con, [run_id], steps=steps).get(run_id)
    if found is None:
        raise RunNotFoundError(f"no run '{run_id}' in {source_label(store)}; see the runs page")
    return found


def source_label(store: Any) -> str:
    return store.snapshot_of or store.path


def _int(request: Request, name: str) -> Optional[int]:
    raw = request.query_params.get(name)
    try:
        return int(raw) if raw else None
    except ValueError:
        raise UsageError(f"{name} must be a step number, got {raw!r}") from None


def _extra(store: Any, run: Any) -> dict[str, Any]:
    """Rows of tables the run loader may not know yet: tool calls (of the page's steps) and feedback, when the
    store has them."""
    out: dict[str, Any] = {"tool_calls": None, "feedback": []}
    if "tool_calls" not in run.rows and has_table(store, "tool_calls", "run_id", "step") and run.steps:
        out["tool_calls"] = rows(store, "SELECT * FROM tool_calls WHERE run_id = ? AND step BETWEEN ? AND ? "
                                        "ORDER BY step", [run.run_id, run.steps[0].step, run.steps[-1].step])
    if has_table(store, "feedback", "run_id"):
        out["feedback"] = rows(store, "SELECT * FROM feedback WHERE run_id = ?", [run.run_id])
    return out


def _stages(request: Request) -> int:
    raw = request.query_params.get("stages")
    try:
        return max(1, min(int(raw), 100_000)) if raw else GRAPH_STAGES
    except ValueError:
        raise UsageError(f"stages must be a whole number, got {raw!r}") from None


def run_page(request: Request) -> Response:
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        win = window(store, run_id, _int(request, "at"), request.query_params.get("prompt"), STEP_WINDOW)
        run = load_steps(store, run_id, win.first, win.last)
        extra = _extra(store, run)
        steps = build_steps(run, extra["tool_calls"], win.href)
        requests = store.requests(run) if has_table(store, "messages", "message_id") else {}
        for view in steps:  # each model call with the exact messages it sent (store/read/requests.py)
            for call in view.model_calls:
                call["request"] = requests.get(call.get("call_id"))
        spans = waterfall(run, outline(store, run_id, run.ended_at), extra["tool_calls"])
        paths, path = paths_written(store, run_id)
        cap = _stages(request)
        graph, more = stage_graph(store, run_id, win.href, cap)
        context = dict(run=run, steps=steps, graph=graph, more_stages=more, stages=cap, waterfall=spans, gap=GAP,
                       paths=paths, path=path, feedback=extra["feedback"], win=win,
                       input=json.dumps(run.input, indent=1, ensure_ascii=False, default=str),
                       output=json.dumps(json.loads(run.output_json or "null"), indent=1, ensure_ascii=False))
    return render(request, "run.html", **context)  # the file is closed again before the page is rendered


def scope_page(request: Request) -> Response:
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        step = request.path_params["step"]
        run = load_steps(store, run_id, 0, step)  # the state after a step replays the writes up to it, no later
        view = scope_at(run, step)
        view["next"] = rows(store, "SELECT min(step) AS s FROM steps WHERE run_id = ? AND step > ?",
                            [run_id, step])[0]["s"]
        writes = [{"path": w.path, "verb": w.verb, "value": clip(value_text(w.value), 160),
                   "href": run_url(run_id, f"#w-{w.step}-{w.seq}")} for w in run.writes if w.step == view["step"].step]
    return render(request, "scope.html", run=run, view=view, writes=writes)


def value_page(request: Request) -> Response:
    step, seq = request.path_params["step"], request.path_params["seq"]
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        run = load_steps(store, run_id, step, step)
    for w in run.writes:
        if w.step == step and w.seq == seq:
            text = w.value if w.value is not None else "null"
            try:
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            except ValueError:
                pass
            return PlainTextResponse(text)
    raise TracememError(f"run {run_id} has no write {step}.{seq}; see {run_url(run_id)}")


ROUTES = [Route("/runs/{run_id}", run_page), Route("/runs/{run_id}/scope/{step:int}", scope_page),
          Route("/runs/{run_id}/value/{step:int}/{seq:int}", value_page)]
