"""Where a run goes while it happens: the `Sink` protocol and the process-wide sinks.

`Flow.run` gives the runner a list of sinks: the process-wide ones (what
`tracemem.otel.enable()` adds), the store's, and a per-run OpenTelemetry export.
The runner calls each as the run begins, after every finished step, and at its end.
A sink that must act before each later step of the run begins (the event feed says the
step started; a store with `fsync=True` syncs the stage before it, flow/runner.py) returns
what to call from `begin_run`; the others return None, and cost the hot path nothing. A
sink without `step_done` (the store under durability "run") is not called per step.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

from ..record import Decision, ReadFields, StepFields, WriteFields
from ..run import Run

__all__ = ["Sink", "StepStarting", "DefaultSinks", "default_sinks"]

StepStarting = Callable[[Run, int, Any, str, int], None]
"""Called as a step begins, before its stage runs: (run, step number, its StageSpec, its kind, iteration)."""


class Sink(Protocol):
    """Receives a run as it happens (the store, OpenTelemetry export)."""

    def begin_run(self, run: Run) -> Optional[StepStarting]:
        """The run began; what to call as each of its later steps begins, if anything."""

    def step_done(self, run: Run, step: StepFields, reads: list[ReadFields], writes: list[WriteFields],
                  decision: Optional[Decision], rows: list[tuple[str, dict[str, Any]]]) -> None:
        """A step finished (optional: see the module docstring). Its step, reads and writes come as the runner
        records them, their fields as plain tuples (`built(Step, step)` names one: run.Records says why)."""

    def end_run(self, run: Run) -> None: ...


class DefaultSinks:
    """The sinks every run in this process records through (besides its store's)."""

    def __init__(self) -> None:
        self._sinks: list[Sink] = []
        self._lock = threading.Lock()

    def add(self, sink: Sink) -> None:
        with self._lock:
            self._sinks.append(sink)

    def remove_if(self, predicate: Any) -> None:
        """Drop every sink for which `predicate(sink)` is true."""
        with self._lock:
            self._sinks = [s for s in self._sinks if not predicate(s)]

    def all(self) -> list[Sink]:
        """A copy of the current list (a run keeps the sinks it started with)."""
        return list(self._sinks)

    def clear(self) -> None:
        with self._lock:
            self._sinks = []


default_sinks = DefaultSinks()
