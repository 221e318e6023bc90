"""What a running flow says as it goes: typed events for `flow.stream()` / `flow.astream()`.

A chat UI needs more than the final answer: the tokens as the model writes them,
which tool it is calling, which branch was taken, and when the run is over. These
events carry exactly that, as they happen, for any flow:

    RunStarted → StepStarted → TokenDelta … / ToolCallEvent (requested) … → ToolCallEvent (finished,
    a tool step) → StepFinished (its writes) → DecisionEvent (a decider) → … → RunFinished | RunPaused
    | RunFailedEvent

`EventFeed` makes them: it is a `Sink` (run started, step finished with its writes and
decision, run ended) plus the runner's two live hooks, a step beginning and a model
token arriving (`ctx.complete` streams its call while a feed is attached). Without a
feed the runner pays one `is None` check per step. A subflow's steps stream too, with
the child run's id; the run events (started, finished, failed) are the streamed run's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Sequence, Union

from ..record import Decision, ReadFields, Step, StepFields, StepKind, Write, WriteFields, built

if TYPE_CHECKING:
    from ..run import Run
    from .spec import StageSpec

__all__ = ["RunStarted", "StepStarted", "StepFinished", "TokenDelta", "ToolCallEvent", "DecisionEvent",
           "RunFinished", "RunPaused", "RunFailedEvent", "FlowEvent", "EventFeed"]


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    pipeline: str
    kind: Literal["run_started"] = "run_started"


@dataclass(frozen=True)
class StepStarted:
    run_id: str
    step: int
    stage: str
    name: str
    step_kind: StepKind
    iteration: int
    kind: Literal["step_started"] = "step_started"


@dataclass(frozen=True)
class StepFinished:
    """A step ended: ok (its writes committed, `writes` in order) or failed (`error`; nothing committed)."""

    run_id: str
    step: int
    stage: str
    name: str
    step_kind: StepKind
    iteration: int
    status: str
    error: Optional[str]
    writes: tuple[Write, ...]
    started_at: int  # ns since epoch
    ended_at: int
    kind: Literal["step_finished"] = "step_finished"

    @property
    def duration_ms(self) -> float:
        return (self.ended_at - self.started_at) / 1e6

    def written(self, path: str) -> list[Any]:
        """The values this step wrote to `path` or below it, decoded from JSON (appends included)."""
        return [json.loads(w.value) if w.value is not None else None for w in self.writes
                if w.path == path or w.path.startswith((path + ".", path + "["))]


@dataclass(frozen=True)
class TokenDelta:
    """A fragment of a model's reply text, as it arrived (from `ctx.complete` in step `step`)."""

    run_id: str
    step: int
    stage: str
    text: str
    kind: Literal["token"] = "token"


@dataclass(frozen=True)
class ToolCallEvent:
    """A tool call: `requested` when the model's reply asks for it, `finished` when its tool step
    ran it (`result` is what went back to the model, `error` what went wrong)."""

    run_id: str
    step: int
    call_id: str
    name: str
    arguments: Optional[dict[str, Any]]
    status: Literal["requested", "finished"]
    result: Optional[str] = None
    error: Optional[str] = None
    duration_ms: Optional[float] = None
    kind: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True)
class DecisionEvent:
    run_id: str
    step: int
    stage: str
    chosen: str
    evidence: Any = field(default=None, compare=False)
    kind: Literal["decision"] = "decision"


@dataclass(frozen=True)
class RunFinished:
    """The run ended ok; `run` is the recorded Run (`run.output` the final scope)."""

    run_id: str
    status: str
    run: "Run" = field(compare=False, repr=False)
    kind: Literal["run_finished"] = "run_finished"


@dataclass(frozen=True)
class RunFailedEvent:
    """The run ended failed (or `interrupted`); `error` says why, `run` keeps what it recorded."""

    run_id: str
    status: str
    error: Optional[str]
    run: "Run" = field(compare=False, repr=False)
    kind: Literal["run_failed"] = "run_failed"


@dataclass(frozen=True)
class RunPaused:
    """The run paused for a person: `pending` is what it asks (the `ctx.interrupt` payload), `stage` where it
    continues, `expect` the answer's declared type (import path; None: any JSON). `flow.resume(run_id, answer)`
    continues it, in this process or another."""

    run_id: str
    stage: Optional[str]
    pending: Any
    expect: Optional[str]
    run: "Run" = field(compare=False, repr=False)
    kind: Literal["run_paused"] = "run_paused"


FlowEvent = Union[RunStarted, StepStarted, StepFinished, TokenDelta, ToolCallEvent, DecisionEvent, RunFinished,
                  RunPaused, RunFailedEvent]


def _arguments(value: Any) -> Optional[dict[str, Any]]:
    if isinstance(value, str):  # a row loaded back, or JSON text
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


class EventFeed:
    """Turns what the runner does into `FlowEvent`s handed to `emit` (a Sink plus two live hooks)."""

    def __init__(self, emit: Callable[[Any], None]) -> None:
        self.emit = emit

    # -- the runner's live hooks ------------------------------------------------------
    def step_started(self, run: "Run", step: int, spec: "StageSpec", kind: StepKind, iteration: int) -> None:
        self.emit(StepStarted(run.run_id, step, spec.id, spec.name, kind, iteration))

    def token_callback(self, run_id: str, step: int, stage: str,
                       also: Optional[Callable[[str], None]] = None) -> Callable[[str], None]:
        """The `on_token` that `ctx.complete` hands the model (calling the stage's own `on_token` too)."""
        emit = self.emit

        def on_token(text: str) -> None:
            if text:
                emit(TokenDelta(run_id, step, stage, text))
            if also is not None:
                also(text)

        return on_token

    def tool_requested(self, run_id: str, step: int, stage: str, calls: Sequence[Any]) -> None:
        for call in calls:
            self.emit(ToolCallEvent(run_id, step, call.id, call.name, call.arguments, "requested"))

    # -- the Sink protocol ------------------------------------------------------------
    def begin_run(self, run: "Run") -> Callable[..., None]:
        if run.parent_run_id is None:  # a subflow's run shows as its parent's subflow step
            self.emit(RunStarted(run.run_id, run.pipeline))
        return self.step_started

    def step_done(self, run: "Run", fields: StepFields, reads: list[ReadFields], writes: list[WriteFields],
                  decision: Optional[Decision], rows: list[tuple[str, dict[str, Any]]]) -> None:
        step = built(Step, fields)
        for table, row in rows:
            if table == "tool_calls":
                self.emit(ToolCallEvent(run.run_id, step.step, row["call_id"], row["name"],
                                        _arguments(row.get("arguments")), "finished", row.get("result"),
                                        row.get("error"), row.get("duration_ms")))
        self.emit(StepFinished(run.run_id, step.step, step.stage, step.name, step.kind, step.iteration, step.status,
                               step.error, tuple(built(Write, w) for w in writes), step.started_at, step.ended_at))
        if decision is not None:
            self.emit(DecisionEvent(run.run_id, step.step, step.stage, decision.chosen, decision.evidence))

    def end_run(self, run: "Run") -> None:
        if run.parent_run_id is not None:
            return
        if run.status == "ok":
            self.emit(RunFinished(run.run_id, run.status, run))
        elif run.status == "paused":
            at = run.resume_at or {}
            self.emit(RunPaused(run.run_id, at.get("stage"), run.pending, at.get("expect"), run))
        else:
            self.emit(RunFailedEvent(run.run_id, run.status, run.error, run))
