"""Backtracking: why a value is what it is (`run.backtrack(path)` returns a `Trace`).

`walk` builds the graph from a run's record (and `sources` extends it beyond the
scope); `trace` renders it.
"""
from .trace import Trace, describe, describe_decision

__all__ = ["Trace", "describe", "describe_decision"]
