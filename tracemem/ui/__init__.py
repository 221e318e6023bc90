"""`tracemem ui`: a local, offline web viewer over a store (the `ui` extra: Starlette, uvicorn, Jinja2).

    tracemem ui --db demo.duckdb            # http://127.0.0.1:8765/

Pages: runs (filters, pages, new runs appear while an agent writes), a run (stage graph,
timeline, every step's reads linked to the writes they saw, writes, decisions, logs, tool and
model calls with the prompt section by section, the scope at any step with its diff), backtrack
(the causal graph, `explain()`, memories with the turn they were learned in), memory (records,
history, every use), and a read-only SQL console.

The viewer reads the store only between requests and through the public API, so it can run
beside a live agent (see `source`); each page lives in its own module (`*_page`), with the
pieces they draw from beside them (`queries`, `run_view`, `timeline`, `trace_view`, `graphs`,
`scope_diff`).
"""
from .app import create_app, serve
from .source import Source

__all__ = ["Source", "create_app", "serve"]
