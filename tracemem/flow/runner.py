"""Executing a compiled `Program`: one step path that every node kind goes through.

`Execution.step` is that path: begin (number the step, find the decision that routed
here, tell the listeners) → call the stage with its view (and context) → conclude
(what a kind decides from the result: a branch's key, a loop's round) → record the
step, committed, failed or paused, in one try. A failure is recorded and ends the run
`failed`; `ctx.interrupt` ends it `paused`. The node kinds differ only in what they do
around that path (flow/kinds.py: stage, branch, loop; flow/parallel.py: fork and map,
several steps at once; flow/subflow.py: a child run inside a step).

A run can start part-way: flow/resume.py builds a `StartPoint` (the scope, step
numbers, iteration counts, loops and where to continue, rebuilt from a recorded run)
and the runner carries on from it. Listeners (the store, OpenTelemetry, a stream, a
user's hook) hear the run as typed events (flow/events.py) and never see the runner.

One coroutine runs every flow. A flow with no async stage is driven without an event
loop (the coroutine never suspends); one with async stages runs under `asyncio.run`
or `await flow.arun(...)`.
"""
from __future__ import annotations

import os
import threading
import time
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from ..errors import RunCancelled, RunFailed, StageError, TracememError
from ..masking import Masker, mask_step, run_masker
from ..record import Decision, ResumePoint, Step, StepKind
from ..run import Run
from ..scope.recorder import RunState, StepRecorder, new_view
from ..scope.tracked import unwrap
from .context import EMPTY, ReadOnlyArgs, StageContext
from .effects import LIVE
from .events import (DecisionEvent, EventFeed, Listener, RunFailedEvent, RunFinished, RunPaused, RunStarted,
                     StepFinished, StepStarted)
from .program import Instruction, Program
from .spec import StageSpec
from .steps import MAPPED, Abort, Begun, LoopState, Paused, StartPoint, deliver
from .timeout import call_with_timeout, detached

PROCESS_SALT = os.urandom(16)  # hashes secrets of runs recorded without a store

Conclude = Callable[[Begun, Any], Optional[Decision]]
"""What a node kind decides from its stage's result before the step is recorded (a branch's key, a loop's
round): the step's decision; raising fails the step."""


class Execution:
    """One run while it executes: its record, its state, and the one step path."""

    def __init__(self, program: Program, inputs: Any, *, env: Optional[Mapping[str, Any]] = None,
                 store: Any = None, subject: Optional[str] = None, listeners: Sequence[Listener] = (),
                 parent: Optional[tuple[str, int]] = None, resume: Union[Run, ResumePoint, None] = None,
                 start: Optional[StartPoint] = None) -> None:
        self.program, self.inputs, self.store, self.subject, self.parent = program, inputs, store, subject, parent
        self.env: Mapping[str, Any] = MappingProxyType(dict(env)) if env else EMPTY
        self.salt = store.salt if store is not None else PROCESS_SALT
        self.listeners = list(listeners)
        self.step_listeners: list[Listener] = []  # set as the run starts (`flow.stream` adds its listener before)
        self.start_listeners: list[Listener] = []  # those of them that hear a step start too
        self.secret_fields = bool(program.schema.secret)  # the scope has fields to mask in what is recorded
        self.resume = resume  # the run this one continues (a conversation thread)
        self.start = start  # where a resumed run or a fork starts (None: a fresh run)
        self.next_step, self.counts, self.loops = (start.next_step, dict(start.counts), start.loops or LoopState()) \
            if start else (0, {}, LoopState())
        self.deliver, self.gate, self.replay, self.resume_child = (
            start.deliver, start.gate, start.replay, start.resume_child) if start else (None, -1, None, None)
        self.effects = start.effects or LIVE if start else LIVE
        self.async_mode = False
        self.events: Optional[EventFeed] = None  # set while the run streams (flow.stream): tokens go there
        self.cancel: Optional[threading.Event] = None  # set: stop before the next step, run `interrupted`

    # -- the run ------------------------------------------------------------------------
    def run_sync(self, raise_on_error: bool) -> Run:
        """Run a flow with no async stage: its coroutine never suspends, so it is driven without an event loop
        (what `asyncio.run` would cost is saved; flow/sync.py does the same for a sync branch)."""
        coro = self.execute(raise_on_error, async_mode=False)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        coro.close()
        raise TracememError(f"flow '{self.program.name}' suspended without async stages; use `await flow.arun(...)`")

    async def execute(self, raise_on_error: bool, async_mode: bool) -> Run:
        self.async_mode = async_mode
        # the listeners that hear each step (one with `steps = False` hears the run's start and end only)
        self.step_listeners = [listener for listener in self.listeners if getattr(listener, "steps", True)]
        self.start_listeners = [listener for listener in self.step_listeners if getattr(listener, "step_starts", True)]
        run = self._begin_run()
        start = self.start
        if self.listeners:
            self.emit(RunStarted(run.run_id, run.pipeline, run, start.resumed if start else None))
        cause: Optional[BaseException] = None
        try:
            if start is not None and start.prelude is not None:  # a fork's edits, its first step
                await self.step(EDITS, start.prelude, "edit")
            pc, end = start.pc if start else 0, len(self.program.ins)
            while pc < end:
                if self.cancel is not None and self.cancel.is_set():
                    raise RunCancelled(f"run {run.run_id} was stopped before its next step (the event stream "
                                       "was closed)")
                pc = await self.run_node(self.program.ins[pc], pc)
            run.status = "ok"
        except Paused as paused:
            run.status, run.pending, run.resume_at = "paused", paused.pause.payload, paused.pause.record(paused.pc)
        except Abort as abort:
            run.status, run.error, cause = "failed", str(abort), abort.cause
        except BaseException as exc:  # KeyboardInterrupt, cancellation: keep what was recorded
            run.status, run.error = "interrupted", f"{type(exc).__name__}: {exc}"
            self._end_run(run)
            raise
        self._end_run(run)
        if run.status not in ("ok", "paused") and raise_on_error:
            raise RunFailed(run, cause)
        return run

    async def run_node(self, ins: Instruction, pc: int) -> int:
        """Run instruction `pc` by its node kind; returns the next instruction's index. The kinds build on the
        step path below, so they are bound on top of it (flow/kinds.py: `Runner`), not imported here."""
        raise NotImplementedError

    def emit(self, event: Any, listeners: Optional[Sequence[Listener]] = None) -> None:
        """Hand an event to every listener (a step's event: to `step_listeners`)."""
        for listener in self.listeners if listeners is None else listeners:
            listener(event)

    def _begin_run(self) -> Run:
        """The run's record and state: a started-from point's (a resume, a fork), else a fresh run's (the input,
        or a thread's state plus the input)."""
        program, start = self.program, self.start
        if start is not None and start.run is not None:
            self.run, self.args = start.run, start.args
            self.state = RunState(program.schema, start.data, self.salt)
            self.state.last_write.update(start.last_write)
            return self.run
        previous = self.resume
        if previous is None:
            data = recorded = program.schema.initial(self.inputs, program.name)
        else:
            base = previous.output if isinstance(previous.output, program.scope) else program.schema.rebuild(
                previous.state_at())
            data, recorded = program.schema.resume({f: getattr(base, f) for f in program.schema.fields},
                                                   self.inputs, program.name)
        self.state = RunState(program.schema, data, self.salt)
        self.args = dict(data)  # the run input (a stage's ctx.args: ReadOnlyArgs, copies that never reach the scope)
        notes: list[str] = []  # what had to change to store the input (e.g. escaped text)
        input_json = program.schema.dump_scope(recorded, self.salt, notes)
        if self.secret_fields:  # (a new run has met no model credentials yet)
            input_json = self.masker(None).text(input_json)
        run = self.run = Run(  # (its id: 64 random bits, as tracemem/ids.py makes every other)
            run_id=os.urandom(8).hex(), pipeline=program.name, pipeline_hash=program.hash, schema=program.schema,
            input_json=input_json, started_at=time.time_ns(), subject=self.subject,
            parent_run_id=self.parent[0] if self.parent else None, parent_step=self.parent[1] if self.parent else None)
        run.store, run.tools, run.notes = self.store, program.tools, notes
        if previous is not None:
            run.continue_from(previous)
        self._note_query(data)
        return run

    def _note_query(self, data: dict[str, Any]) -> None:
        if self.program.query and self.run.query is None:
            self.run.query = str(unwrap(data.get(self.program.query)) or "") or None

    def _end_run(self, run: Run) -> None:
        data, run.ended_at = self.state.data, time.time_ns()
        run.output = self.program.schema.construct(data)
        restored = self.start is not None and self.start.run is not None  # (its record may hold failed steps')
        writes = run.committed_writes() if restored else run.writes
        masked = self.secret_fields or self.state.secrets
        run.output_json = self.program.schema.dump_output(
            data, writes, self.salt, run.notes, dumped=not (masked or self.state.escaped or restored))
        if masked:
            run.output_json, run.error = map(self.masker(None).text, (run.output_json, run.error))
        self._note_query(data)
        if not self.listeners:
            return
        if run.status == "ok":
            self.emit(RunFinished(run.run_id, run.status, run))
        elif run.status == "paused":
            at = run.resume_at or {}
            self.emit(RunPaused(run.run_id, at.get("stage"), run.pending, at.get("expect"), run))
        else:
            self.emit(RunFailedEvent(run.run_id, run.status, run.error, run))

    # -- the one step path ------------------------------------------------------------------
    def begin(self, ins: Instruction, spec: StageSpec, kind: StepKind) -> Begun:
        """Number a step, tell the listeners it starts, and hand it what a resumed run delivers to it."""
        step = self.next_step = self.next_step + 1
        iteration = self.counts.get(spec.id, 0)
        self.counts[spec.id] = iteration + 1
        if self.start_listeners:
            self.emit(StepStarted(self.run.run_id, step, spec.id, spec.name, kind, iteration, self.run.parent_run_id),
                      self.start_listeners)
        begun = Begun(spec, self.state, step, kind, iteration, self.loops.routed_by(ins) if ins.regions else None)
        if self.deliver is not None and self.deliver.stage == spec.id and kind not in MAPPED:  # (a map: parallel.py)
            deliver(begun, self.deliver, self.effects, self.run.run_id, True)
            self.deliver = None
        return begun

    async def call(self, begun: Begun, fn: Optional[Callable[..., Any]] = None) -> Any:
        """Call the stage function with its view (and context, if it takes one), within its timeout."""
        spec, rec = begun.spec, begun.rec
        call = fn or spec.fn
        view = new_view(self.program.view_class, rec)
        ctx = spec.takes_ctx and StageContext(self.run, rec, spec.name, begun.iteration, ReadOnlyArgs(self.args), self.env,
                                              self.store, begun.answers, begun.replay or self.replay,
                                              item=begun.item, events=self.events, effects=begun.effects or self.effects)
        if spec.timeout is not None:  # an abandoned sync stage keeps writing into `rec`, which is then dropped
            return await call_with_timeout((lambda: call(view, ctx)) if ctx else (lambda: call(view)), spec.id,
                                           spec.timeout, spec.is_async, self.async_mode,
                                           lambda: setattr(begun, "rec", detached(rec)))
        result = call(view, ctx) if ctx else call(view)
        return await result if spec.is_async else result

    async def step(self, ins: Instruction, spec: StageSpec, kind: StepKind, conclude: Optional[Conclude] = None,
                   body: Optional[Callable[[Begun], Awaitable[Any]]] = None) -> tuple[Begun, Any]:
        """Begin a step, run its body (the stage call by default), conclude, and record it: committed, failed
        (the run aborts) or paused (the run pauses)."""
        begun = self.begin(ins, spec, kind)
        try:
            result = await (body(begun) if body is not None else self.call(begun))
            if begun.rec.pause is not None:  # it asked a human (and caught the signal)
                raise self.pause(begun)
            decision = conclude(begun, result) if conclude is not None else None
        except (Paused, Abort):
            raise
        except Exception as err:
            raise self.fail(begun, err)
        begun.rec.commit()
        self.record(begun, "ok", None, decision, None)
        return begun, result

    def fail(self, begun: Begun, error: BaseException) -> TracememError:
        """Record a failed step (its reads, rows and logs kept, its writes never committed); what to raise."""
        if begun.rec.pause is not None:  # not a failure: `ctx.interrupt` ended the stage
            return self.pause(begun)
        own = error.args[0] if isinstance(error, TracememError) and error.args else f"{type(error).__name__}: {error}"
        masker = self.masker(begun.rec)
        message = masker.text(str(own))
        self.record(begun, "failed", message, None, None)
        if isinstance(error, TracememError) and not isinstance(error, StageError):
            return Abort(message, error)
        return Abort(masker.text(str(StageError(begun.spec.id, self.run.run_id, error))), error)

    def pause(self, begun: Begun) -> Paused:
        """Record a paused step (its reads, rows and logs kept, its writes never committed): the run pauses,
        and resuming re-enters the stage as the same iteration."""
        self.counts[begun.spec.id] -= 1
        self.record(begun, "paused", None, None, None)
        return Paused(begun.rec.pause, self.program.ids.get(begun.spec.id))

    def masker(self, rec: Optional[StepRecorder]) -> Masker:
        """What masks the run's known secrets (tracemem/masking.py); empty when it has none."""
        return run_masker(self.program.schema.secret, self.state.data, self.state.secrets, rec and rec.overlay)

    def record(self, begun: Begun, status: str, error: Optional[str], decision: Optional[Decision],
               ended_at: Optional[int]) -> None:
        """The one place a step is recorded: into the run's record, then to the listeners."""
        run, rec, spec = self.run, begun.rec, begun.spec
        step = Step(rec.step, spec.id, spec.name, begun.kind, begun.iteration, status, error, begun.started,  # type: ignore[arg-type]
                    ended_at or time.time_ns(), begun.routed_by, begun.child_run_id, tuple(rec.logs))
        writes, rows, reads = rec.writes if status == "ok" else [], list(rec.rows), rec.reads
        if self.secret_fields or self.state.secrets:
            step, writes, rows, decision = mask_step(self.masker(rec), step, writes, rows, decision)
        run.steps.append(step)
        run.reads.extend(reads)
        run.writes.extend(writes)
        if decision is not None:
            run.decisions.append(decision)
        for table, row in rows:
            run.rows.setdefault(table, []).append(row)
        if self.step_listeners:
            self.emit(StepFinished(run.run_id, step, tuple(writes), tuple(reads), decision, tuple(rows),
                                   run.parent_run_id), self.step_listeners)
            if decision is not None:
                self.emit(DecisionEvent(run.run_id, step.step, step.stage, decision.chosen, decision.evidence),
                          self.step_listeners)


EDITS = Instruction("stage", "(edit)")  # where a fork's edit step sits: outside every branch and loop
