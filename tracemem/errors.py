"""Errors a user can act on: each names what failed, where (stage, field, run) and what to do.

Every error tracemem raises on purpose derives from `TracememError`:

    TracememError
    ├── PipelineError        the pipeline declaration is invalid (`Pipeline.build()`)
    ├── ScopeWriteError      a stage wrote a value the scope's schema rejects
    ├── ScopeReadError       a stage read a name the scope does not have (also an AttributeError)
    ├── PathError            text that is not a scope path, e.g. 'messages[0' (also a ValueError)
    ├── UsageError           arguments that cannot work, e.g. prune with no limit (also a ValueError)
    ├── RunNotFoundError     no run with that id in the store (also a LookupError)
    ├── ForkConflictError    two fork branches wrote the same path
    ├── LoopLimitError       a loop exceeded its max_iterations guard
    ├── StageError           wraps what a stage raised, naming the stage and the run
    ├── StageTimeout         a stage ran past its `.then(fn, timeout=...)` (also a TimeoutError)
    ├── RunFailed            a run ended failed; `.run` is the recorded run
    ├── ResumeError          a run cannot be resumed or forked as asked (`flow.resume`, `flow.fork`)
    │   └── AnswerError      a resume's answer does not fit the pause's `expect=` (the run stays paused)
    ├── PauseSignal          what `ctx.interrupt` raises to pause the run (the runner catches it)
    ├── RunCancelled         a streamed run was stopped before its next step (recorded `interrupted`)
    ├── ModelError           a chat model call failed (tracemem.models)
    ├── ReplayMissError      a replayed call asked what the record never did, with no live model (flow.replay)
    ├── MemoryStoreError     a memory operation was refused (tracemem.memory)
    └── StoreError           the store file cannot be opened or written (disk full, corrupt, ...)
        └── StoreLockedError another process (or Store object) holds the store file (tracemem.store)
"""
from __future__ import annotations

from typing import Optional, Protocol

from .text import clip


class FailedRun(Protocol):
    """What `RunFailed` says of its run (a `tracemem.Run`; run.py imports this module)."""

    run_id: str
    pipeline: str
    error: Optional[str]


class TracememError(Exception):
    """Base class of every error tracemem raises on purpose."""


class PipelineError(TracememError):
    """The pipeline declaration is invalid (raised by `Pipeline.build()`)."""


class ScopeWriteError(TracememError):
    """A stage wrote a value the scope's schema rejects."""

    def __init__(self, stage: str, path: str, value: object, reason: str) -> None:
        shown = clip(repr(value), 120)
        super().__init__(
            f"stage '{stage}' wrote an invalid value to '{path}': {shown} — {reason}. "
            f"Fix the stage or widen the field's type in the scope model."
        )
        self.stage, self.path, self.value, self.reason = stage, path, value, reason


class ScopeReadError(TracememError, AttributeError):
    """A stage read a name the scope does not have."""


class PathError(TracememError, ValueError):
    """Text that is not a scope path (`messages[0].content` is one)."""


class UsageError(TracememError, ValueError):
    """A call was given arguments that cannot work; the message says which and what to pass."""


class RunNotFoundError(TracememError, LookupError):
    """No run with that id in the store (never recorded there, or pruned)."""


class ForkConflictError(TracememError):
    """Two fork branches wrote the same scope path."""

    def __init__(self, path: str, first: str, second: str) -> None:
        super().__init__(
            f"fork branches '{first}' and '{second}' both wrote '{path}'; "
            f"parallel branches must write different paths (appends to one list are fine). "
            f"Write to separate fields and combine them in a stage after the fork."
        )
        self.path, self.first, self.second = path, first, second


class LoopLimitError(TracememError):
    """A loop went round more often than its `max_iterations` guard allows."""


class StageError(TracememError):
    """Wraps the exception a stage raised, naming the stage and the run."""

    def __init__(self, stage: str, run_id: str, error: BaseException) -> None:
        super().__init__(f"stage '{stage}' failed in run {run_id}: {type(error).__name__}: {error}")
        self.stage, self.run_id, self.error = stage, run_id, error


class StageTimeout(TracememError, TimeoutError):
    """A stage ran longer than the `timeout=` its `.then(...)` gave it; recorded as the step's error."""

    def __init__(self, stage: str, timeout: float, is_async: bool) -> None:
        how = ("it was cancelled" if is_async else
               "its thread cannot be killed, so it was abandoned: its scope writes, logs and rows are discarded")
        super().__init__(f"stage '{stage}' timed out after {timeout:g} s (.then(..., timeout={timeout:g})); {how}. "
                         f"Make the stage faster or raise its timeout")
        self.stage, self.timeout = stage, timeout


class StoreError(TracememError):
    """The store file cannot be opened or written: the message names the file, what happened
    (disk full, a corrupt file, an unreadable journal entry) and what to do."""


class RunFailed(TracememError):
    """A run ended failed; `.run` is the recorded run (every finished step kept)."""

    def __init__(self, run: FailedRun, cause: Optional[BaseException]) -> None:
        super().__init__(f"run {run.run_id} of '{run.pipeline}' failed: {run.error}")
        self.run = run
        self.__cause__ = cause


class ResumeError(TracememError):
    """A run cannot be resumed or forked as asked: it is not paused, another flow version recorded it,
    another process is resuming it, or the step to fork from does not fit; the message says which."""


class PauseSignal(TracememError):
    """Raised by `ctx.interrupt` to end the stage; the runner turns it into a paused run. A stage that
    catches it (`except Exception:`) still pauses: the runner goes by what `ctx.interrupt` recorded. A tool
    that asks (`ctx.interrupt` in its body) lets it through, so its tool call pauses rather than fails."""


class AnswerError(ResumeError, ValueError):
    """A resume's answer does not have the shape its pause declared (`expect=`): nothing was committed and
    the run is still paused, so resuming it again with a valid answer continues it."""


class RunCancelled(TracememError):
    """A run was stopped from outside between two steps (its `flow.stream` was closed early); it is
    recorded `interrupted`, with every step it finished."""
