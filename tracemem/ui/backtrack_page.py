"""The backtrack page: pick a path and see why it is what it is — the "why" list first (its sources,
ranked, each with its folded path), then the folded causal graph (the value, the answering model
call, the top sources; "+" on a box draws what lies behind it, node by node), the memories it
reached (with the run and turn each was learned in), and the influence ranking, labelled as the
correlational measure it is. `full=1` (or narrowing with only/focus) draws the whole graph beside
`explain()`. `backtrack.json` is `trace.to_json()` for tools.
"""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from urllib.parse import urlencode

from ..cli.render import to_json
from ..errors import UsageError
from ..trace import why
from ..trace.stored_index import StoredIndex
from ..trace.walk import backtrack
from .run_outline import paths_written
from .queries import rows
from .run_page import canonical, load_steps
from .trace_view import MAX_DRAWN, folded_svg, memory_sources, trace_svg
from .web import render, run_url, source

__all__ = ["DEPTH", "NODES", "ONLY_KINDS", "ROUTES"]

WHOLE = 5000  # steps of a run loaded whole for a backtrack (fewer queries than reading it block by block)
NODES_MOST = 20_000  # the largest walk (and drawing) a page may ask for
DEPTH, NODES = 64, 2000  # run.backtrack's own budget, unless the page asks for a deeper walk
ONLY_KINDS = ("memory", "model_call", "prompt_section", "run", "decision", "input", "step")


def _bound(request: Request, name: str, default: int, most: int) -> int:
    raw = request.query_params.get(name)
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise UsageError(f"{name} must be a whole number, got {raw!r}") from None
    if not 1 <= value <= most:
        raise UsageError(f"{name} must be between 1 and {most}, got {value}")
    return value


def _trace(request: Request, store: Any, run_id: str) -> tuple[Any, Any, list[str], str]:
    """The run and the trace asked for. A run of up to WHOLE steps is loaded whole; a longer one by its head, the
    walk loading the blocks of steps it reaches (trace/stored_index.py), so its cost follows the walk."""
    total = rows(store, "SELECT count(*) AS n FROM steps WHERE run_id = ?", [run_id])[0]["n"]
    run = load_steps(store, run_id, None if total <= WHOLE else -1, None if total <= WHOLE else -1)
    index = None if total <= WHOLE else StoredIndex(store, run, lambda first, last: load_steps(store, run_id, first,
                                                                                                last))
    paths, default = paths_written(store, run_id)
    given = [p.strip() for p in request.query_params.getlist("path") if p.strip()]  # the typed path wins
    path = given[-1] if given else default
    if not path:
        raise UsageError(f"run {run_id} wrote nothing, so there is no value to backtrack; pick another run")
    depth = _bound(request, "depth", DEPTH, 100_000)
    nodes = _bound(request, "nodes", NODES, NODES_MOST)
    return run, backtrack(run, path, max_depth=depth, max_nodes=nodes, index=index), paths, path


def backtrack_page(request: Request) -> Response:
    only = (request.query_params.get("only") or "").strip() or None
    focus = (request.query_params.get("focus") or "").strip() or None
    if only is not None and only not in ONLY_KINDS:
        raise UsageError(f"only must be one of {', '.join(ONLY_KINDS)}, got {only!r}")
    full = request.query_params.get("full") == "1" or bool(only or focus)
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        run, trace, paths, path = _trace(request, store, run_id)
        answer = why(trace)
        context = dict(run=run, trace=trace, paths=paths, path=path, only=only or "", full=full,
                       focus=focus or "", kinds=ONLY_KINDS, answer=answer, hidden=0,
                       explain=trace.explain(max_lines=200, only=only, focus=focus),
                       memories=memory_sources(trace), influence=trace.influence() if not trace.missing else [],
                       reached=trace.runs(), nodes=trace.graph.number_of_nodes(),
                       deeper=_bound(request, "depth", DEPTH, 100_000) * 8)
        if full:
            shown = trace.narrowed(only=only, focus=focus) if (only or focus) and not trace.missing else trace
            cap = _bound(request, "drawn", MAX_DRAWN, NODES_MOST)
            context["graph"], context["hidden"] = trace_svg(shown, run_url, cap)
            context["more"] = str(request.url.include_query_params(drawn=cap * 2).query)
            context["shown"] = shown.graph.number_of_nodes()
        else:
            opened = [n for n in request.query_params.getlist("open") if n in trace.graph]

            def expand(nodes: list[str]) -> str:
                return "?" + urlencode([("path", path)] + [("open", n) for n in nodes]) + "#trace-graph"
            context["graph"], context["shown"] = folded_svg(answer, opened, run_url, expand)
            context["opened"] = opened
    return render(request, "backtrack.html", **context)


def backtrack_json(request: Request) -> Response:
    with source(request).reading() as store:
        run_id, redirect = canonical(request, store)
        if redirect:
            return redirect
        _, trace, _, _ = _trace(request, store, run_id)
        return Response(to_json(trace.to_json()), media_type="application/json")


ROUTES = [Route("/runs/{run_id}/backtrack", backtrack_page), Route("/runs/{run_id}/backtrack.json", backtrack_json)]
