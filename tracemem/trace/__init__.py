"""Backtracking: why a value is what it is (`run.backtrack(path)` returns a `Trace`).

`walk` builds the graph from a run's record (and `sources` extends it beyond the
scope); `trace` renders it.
"""
from .trace import KINDS, Trace, describe, describe_decision

__all__ = ["KINDS", "Trace", "describe", "describe_decision"]
