"""tracemem: agent pipelines that explain themselves.

Every stage, read, write, decision, model call, prompt section and memory use is
recorded, so any answer can be traced back to what produced it.
"""
from .context import StageContext
from .decide import decide
from .errors import (ForkConflictError, LoopLimitError, PipelineError, ScopeReadError, ScopeWriteError,
                     StageError, TracememError)
from .pipeline import Pipeline
from .record import Decision, Read, Step, Write
from .run import Run
from .errors import RunFailed
from .flow import Flow
from . import sources as _sources  # registers backtracking beyond the scope  # noqa: E402,F401

__all__ = [
    "Pipeline", "Flow", "Run", "RunFailed", "StageContext", "decide",
    "Step", "Read", "Write", "Decision",
    "TracememError", "PipelineError", "ScopeWriteError", "ScopeReadError", "ForkConflictError",
    "LoopLimitError", "StageError",
]
