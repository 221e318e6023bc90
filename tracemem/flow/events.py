"""What a running flow says as it goes: one stream of typed events, for every listener.

The runner emits these as the run happens, to every listener passed to it (a callable
taking an event): the store records from them, the OpenTelemetry export builds spans
from them, `flow.stream()` hands them to a chat UI, and a user's own hook sees the same:

    RunStarted → StepStarted → TokenDelta … / ToolCallEvent (requested) … → StepFinished (its
    record: step, reads, writes, decision, rows) → DecisionEvent (a decider) → … →
    RunFinished | RunPaused | RunFailedEvent

Events carry ids and values (the recorded `Step`, `Read`s, `Write`s; the run's record,
`Run`, at its start and end), never the runner's own objects. Listeners are independent
of one another's order: each keeps its own state. Tokens and requested tool calls come
from `ctx.complete` and go to the stream only (`EventFeed`, which `flow.stream` attaches).
A subflow's steps are events too, with the child run's id and `parent_run_id` set. A listener
that needs only each run's start and end says so with an attribute `steps = False` (the store
in its default durability), one that needs no `StepStarted` with `step_starts = False`: no
event is built that no listener hears.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Sequence, Union

from ..record import Decision, Read, Step, StepKind, Write

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["RunStarted", "StepStarted", "StepFinished", "TokenDelta", "ToolCallEvent", "DecisionEvent",
           "RunFinished", "RunPaused", "RunFailedEvent", "RunEnded", "FlowEvent", "Listener", "EventFeed", "ended"]


@dataclass(frozen=True)
class RunStarted:
    """A run began (or a paused or interrupted one carries on: `resumed` then says how much of its record
    came before, as counts of its steps, reads, writes, decisions and rows by table)."""

    run_id: str
    pipeline: str
    run: "Run" = field(compare=False, repr=False)
    resumed: Optional[tuple[Any, ...]] = field(default=None, compare=False, repr=False)
    kind: Literal["run_started"] = "run_started"


@dataclass(frozen=True)
class StepStarted:
    run_id: str
    step: int
    stage: str
    name: str
    step_kind: StepKind
    iteration: int
    parent_run_id: Optional[str] = field(default=None, compare=False, repr=False)
    kind: Literal["step_started"] = "step_started"


@dataclass(frozen=True)
class StepFinished:
    """A step ended: ok (its writes committed, `writes` in order) or failed (`error`; nothing committed). The
    step's own fields (`step`, `stage`, `name`, `step_kind`, `iteration`, `status`, `error`, `started_at`,
    `ended_at`) are those of `record`, the step as recorded."""

    run_id: str
    record: Step
    writes: tuple[Write, ...]
    reads: tuple[Read, ...] = field(default=(), compare=False, repr=False)
    decision: Optional[Decision] = field(default=None, compare=False, repr=False)
    rows: tuple[tuple[str, dict[str, Any]], ...] = field(default=(), compare=False, repr=False)  # (table, row)
    parent_run_id: Optional[str] = field(default=None, compare=False, repr=False)
    kind: Literal["step_finished"] = "step_finished"

    step = property(lambda self: self.record.step, doc="The step's number in its run.")
    stage = property(lambda self: self.record.stage, doc="The stage's id.")
    name = property(lambda self: self.record.name)
    step_kind = property(lambda self: self.record.kind, doc="stage, decider, map-item, tool, ...")
    iteration = property(lambda self: self.record.iteration)
    status = property(lambda self: self.record.status, doc="ok, failed or paused.")
    error = property(lambda self: self.record.error)
    started_at = property(lambda self: self.record.started_at, doc="ns since the epoch")
    ended_at = property(lambda self: self.record.ended_at, doc="ns since the epoch")

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
Listener = Callable[[Any], None]
"""What hears a run's events: any callable taking one (it ignores the kinds it does not need)."""
RunEnded = (RunFinished, RunPaused, RunFailedEvent)


def ended(run: "Run") -> Any:
    """The event that ends `run`: finished, paused (with what it asks) or failed (interrupted too)."""
    if run.status == "ok":
        return RunFinished(run.run_id, run.status, run)
    if run.status == "paused":
        at = run.resume_at or {}
        return RunPaused(run.run_id, at.get("stage"), run.pending, at.get("expect"), run)
    return RunFailedEvent(run.run_id, run.status, run.error, run)


def _arguments(value: Any) -> Optional[dict[str, Any]]:
    if isinstance(value, str):  # a row loaded back, or JSON text
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


class EventFeed:
    """The listener `flow.stream` attaches: every event of the streamed run (a subflow's steps too, not its run
    events) goes to `emit`, tool results as `ToolCallEvent`s; `ctx.complete` adds tokens and requested calls."""

    def __init__(self, emit: Callable[[Any], None]) -> None:
        self.emit = emit

    def __call__(self, event: Any) -> None:
        if isinstance(event, StepFinished):
            for table, row in event.rows:
                if table == "tool_calls":
                    self.emit(ToolCallEvent(event.run_id, event.step, row["call_id"], row["name"],
                                            _arguments(row.get("arguments")), "finished", row.get("result"),
                                            row.get("error"), row.get("duration_ms")))
        elif isinstance(event, (RunStarted, *RunEnded)) and event.run.parent_run_id is not None:
            return  # a subflow's run shows as its parent's subflow step
        self.emit(event)

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
