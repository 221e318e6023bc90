"""Backtracking: why a value is what it is (`run.backtrack(path)` returns a `Trace`).

`walk` builds the graph from a run's record (and `sources` extends it beyond the
scope); `trace` renders it, each node as the line `node_text` words. `why(run, path)` answers with the sources alone, ranked (and,
with `verify=k` and a model, tested).
"""
from .causes import Cause
from .node_text import describe, describe_decision
from .trace import KINDS, Trace
from .ranked import Why, why

__all__ = ["KINDS", "Cause", "Trace", "Why", "describe", "describe_decision", "why"]
