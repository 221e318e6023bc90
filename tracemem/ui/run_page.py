"""A run's pages: the run (graph, timeline, every step), the scope at a step, and a write's full value.

A run id may be given by a unique prefix, as on the command line; the page then redirects to
the full id, so links and bookmarks are stable.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ..errors import TracememError, UsageError
from ..text import clip
from .queries import has_table, resolve, rows
from .run_view import STEP_WINDOW, build_steps, value_text, window, written_paths
from .scope_diff import scope_at
from .timeline import stage_graph, timeline
from .web import render, run_url, source

__all__ = ["ROUTES", "canonical", "default_path"]


def canonical(request: Request, store: Any) -> tuple[str, Optional[Response]]:
    """The full run id of the URL's `run_id`, and a redirect when the URL gave only a prefix."""
    given = request.path_params["run_id"]
    run_id = resolve(store, given)
    if run_id == given:
        return run_id, None
    path = request.url.path.replace(f"/runs/{given}", run_url(run_id), 1)
    query = f"?{request.url.query}" if request.url.query else ""
    return run_id, RedirectResponse(path + query, status_code=302)


def default_path(paths: list[str]) -> str:
    """What a backtrack starts from when none is asked for: `answer` if written, else the last write."""
    return "answer" if "answer" in paths else (paths[-1] if paths else "")


def _int(request: Request, name: str) -> Optional[int]:
    raw = request.query_params.get(name)
    try:
        return int(raw) if raw else None
    except ValueError:
        raise UsageError(f"{name} must be a step number, got {raw!r}") from None


def _extra(store: Any, run: Any) -> dict[str, Any]:
    """Rows of tables the run loader may not know yet: tool calls and feedback, when the store has them."""
    out: dict[str, Any] = {"tool_calls": None, "feedback": []}
    if "tool_calls" not in run.rows and has_table(store, "tool_calls", "run_id", "step"):
        out["tool_calls"] = rows(store, "SELECT * FROM tool_calls WHERE run_id = ? ORDER BY step", [run.run_id])
    if has_table(store, "feedback", "run_id"):
        out["feedback"] = rows(store, "SELECT * FROM feedback WHERE run_id = ?", [run.run_id])
    return out


def run_page(request: Request) -> Response:
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        run = store.run(run_id)
        extra = _extra(store, run)
        win = window(run, at=_int(request, "at"), prompt=request.query_params.get("prompt"))
        steps = build_steps(run, extra["tool_calls"], win)
        requests = store.requests(run) if has_table(store, "messages", "message_id") else {}
        for view in steps:  # each model call with the exact messages it sent (store/requests.py)
            for call in view.model_calls:
                call["request"] = requests.get(call.get("call_id"))
        rows, hidden = timeline(run, win.lo, win.hi)
        paths = written_paths(run)
        pages = [(lo, min(lo + STEP_WINDOW, win.total)) for lo in range(0, win.total, STEP_WINDOW)]
        context = dict(run=run, steps=steps, graph=stage_graph(run, win.href), timeline=rows,
                       hidden=hidden, paths=paths, path=default_path(paths), feedback=extra["feedback"], win=win,
                       pages=pages,
                       input=json.dumps(run.input, indent=1, ensure_ascii=False, default=str),
                       output=json.dumps(json.loads(run.output_json or "null"), indent=1, ensure_ascii=False))
    return render(request, "run.html", **context)  # the file is closed again before the page is rendered


def scope_page(request: Request) -> Response:
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        run = store.run(run_id)
        view = scope_at(run, request.path_params["step"])
        writes = [{"path": w.path, "verb": w.verb, "value": clip(value_text(w.value), 160),
                   "href": run_url(run_id, f"#w-{w.step}-{w.seq}")} for w in run.writes if w.step == view["step"].step]
    return render(request, "scope.html", run=run, view=view, writes=writes)


def value_page(request: Request) -> Response:
    step, seq = request.path_params["step"], request.path_params["seq"]
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        run = store.run(run_id)
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
