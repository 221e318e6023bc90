"""Executing a compiled `Program`: one step path that every node kind uses.

Every step goes the same way: begin (number it, find the decision that routed
here) → call the stage with its view (and context) → on error, record the step
failed and abort; if it asked a human (`ctx.interrupt`), record it paused and end
the run `paused` → otherwise commit its writes and hand the finished step to the
sinks. The node kinds differ only in what they do around that path: a decider
picks the next instruction, a loop counts its rounds, a fork or a map runs several
steps at once (flow/parallel.py), a subflow runs a child program inside its step.
As each step begins, the sinks that asked for it in `begin_run` hear of it first: while
a run streams (`flow.stream`), its event feed (the run stops before its next step once
its reader leaves, flow/streaming.py); with a store's `fsync=True` under durability
"stage", the store, which makes the stage before it power-loss safe (store/store_sink.py).

A run can start part-way: `flow/resume.py` rebuilds an Execution's state from a recorded
run (scope, step numbers, iteration counts, loops, where to continue) and it carries on.

One coroutine runs every flow. A flow with no async stage is driven without an
event loop (the coroutine never suspends, so `run()` costs no asyncio set-up); a
flow with async stages runs under `asyncio.run` or `await flow.arun(...)`. The
runner never sees `Flow`, the store or OpenTelemetry: it gets a `Program`, the
sinks, and the store handle that stages see as `ctx.store`.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from ..errors import LoopLimitError, RunCancelled, RunFailed, StageError, TracememError
from ..ids import new_id
from ..masking import Masker, mask_step, run_masker
from ..record import Decision, ResumePoint, StepFields, StepKind
from ..run import Run
from ..scope.recorder import RunState, StepRecorder
from ..scope.tracked import unwrap
from ..scope.view import new_view
from .context import EMPTY, ReadOnlyArgs, StageContext
from .effects import LIVE
from .events import EventFeed
from .interrupt import Delivery, Pause
from .parallel import PARALLEL_HANDLERS, ParallelSteps
from .subflow import SUBFLOW_HANDLERS, SubflowSteps
from .program import Instruction, Program
from .steps import MAPPED, Abort, Begun, LoopState, Paused, deliver
from .sinks import Sink, StepStarting
from .spec import LoopNode, StageSpec
from .timeout import call_with_timeout, detached

_PROCESS_SALT = os.urandom(16)  # hashes secrets of runs recorded without a store


def _both(first: StepStarting, then: StepStarting) -> StepStarting:
    """One `StepStarting` calling `first`, then `then` (the sinks' order)."""
    def starting(run: Run, step: int, spec: StageSpec, kind: StepKind, iteration: int) -> None:
        first(run, step, spec, kind, iteration)
        then(run, step, spec, kind, iteration)
    return starting


class Execution(ParallelSteps, SubflowSteps):
    """The state of one run while it executes (forks and maps: `ParallelSteps`, flow/parallel.py)."""

    # set by `execute` as the run begins: what the sinks asked to call as each step begins, and their `step_done`s
    starting: Optional[StepStarting] = None
    told: Sequence[Callable[..., None]] = ()

    def __init__(self, program: Program, inputs: Any, *, env: Optional[Mapping[str, Any]] = None,
                 store: Any = None, subject: Optional[str] = None, sinks: Optional[list[Sink]] = None,
                 parent: Optional[tuple[str, int]] = None, resume: Union[Run, ResumePoint, None] = None) -> None:
        self.program = program
        self.inputs = inputs
        self.env: Mapping[str, Any] = MappingProxyType(dict(env)) if env else EMPTY
        self.store = store
        self.subject = subject
        self.parent = parent
        self.salt = store.salt if store is not None else _PROCESS_SALT
        self.sinks: list[Sink] = sinks or []
        self.secret_fields = bool(program.schema.secret)  # the scope has fields to mask in what is recorded
        self.resume = resume  # the run this one continues (a conversation thread)
        self.next_step = 0
        self.counts: dict[str, int] = {}
        self.async_mode = False
        self.loops = LoopState()
        # set by flow/resume.py when the run starts part-way (a resumed run, a fork):
        self.restored = False  # run, state and args are set already
        self.pc = 0  # the instruction to start at
        self.prelude: Optional[StageSpec] = None  # a fork's edits, run as its first step
        self.deliver: Optional[Delivery] = None  # answers for the first step of the stage re-entered
        self.gate = -1  # a `pause_before` point already answered
        self.replay: Any = None  # a ReplayBook: model calls answered from a record
        self.effects = LIVE  # side effects made live, or replayed from a record (flow/effects.py)
        self.resume_child: Optional[tuple[str, "Execution"]] = None  # a subflow id, and its paused child resuming
        self.events: Optional[EventFeed] = None  # set while the run streams events (flow.stream)
        self.cancel: Optional[threading.Event] = None  # set: stop before the next step, run `interrupted`

    # -- the run ------------------------------------------------------------------------
    async def execute(self, raise_on_error: bool, async_mode: bool) -> Run:
        self.async_mode = async_mode
        run = self.run if self.restored else self._start()
        starting, told = None, []
        for sink in self.sinks:
            hook = sink.begin_run(run)
            if hook is not None:
                starting = hook if starting is None else _both(starting, hook)
            done = getattr(sink, "step_done", None)
            if done is not None:  # (a sink without one is told of the run's start and end only)
                told.append(done)
        self.starting, self.told = starting, told
        cause: Optional[BaseException] = None
        try:
            if self.prelude is not None:
                begun, _ = await self._step(EDITS, self.prelude, "edit")
                self._finish(begun)
            await self._execute_program(self.pc)
            run.status = "ok"
        except Paused as paused:
            run.status, run.pending, run.resume_at = "paused", paused.pause.payload, paused.pause.record(paused.pc)
        except Abort as abort:
            run.status, run.error, cause = "failed", str(abort), abort.cause
        except BaseException as exc:  # KeyboardInterrupt, cancellation: keep what was recorded
            run.status, run.error = "interrupted", f"{type(exc).__name__}: {exc}"
            self._end(run)
            raise
        self._end(run)
        if run.status not in ("ok", "paused") and raise_on_error:
            raise RunFailed(run, cause)
        return run

    def _start(self) -> Run:
        """A fresh run: its starting scope (the input, or a thread's state plus the input) and record."""
        program, previous = self.program, self.resume
        if previous is None:
            data = recorded = program.schema.initial(self.inputs, program.name)
        else:
            base = previous.output if isinstance(previous.output, program.scope) else program.schema.rebuild(
                previous.state_at())
            data, recorded = program.schema.resume({f: getattr(base, f) for f in program.schema.fields},
                                                   self.inputs, program.name)
        self.state = RunState(program.schema, data, self.salt)
        self.args = ReadOnlyArgs(dict(data))  # copies containers on access: never reaches the scope
        notes: list[str] = []  # what had to change to store the input (e.g. escaped text)
        input_json = program.schema.dump_scope(recorded, self.salt, notes)
        if self.secret_fields:  # (a new run has met no model credentials yet)
            input_json = self._masker(None).text(input_json)
        run = self.run = Run(
            run_id=new_id(), pipeline=program.name, pipeline_hash=program.hash, schema=program.schema,
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

    def _end(self, run: Run) -> None:
        data, run.ended_at = self.state.data, time.time_ns()
        run.output = self.program.schema.construct(data)
        # failed steps' writes left out: only a restored run's record can hold any (`_record` keeps none)
        writes = run.committed_writes() if self.restored else run.raw_writes
        masked = self.secret_fields or self.state.secrets
        run.output_json = self.program.schema.dump_output(  # (a restored run's writes are as recorded)
            data, writes, self.salt, run.notes, dumped=not (masked or self.state.escaped or self.restored))
        if masked:
            run.output_json, run.error = map(self._masker(None).text, (run.output_json, run.error))
        self._note_query(data)
        for sink in self.sinks:
            sink.end_run(run)

    async def _execute_program(self, pc: int = 0) -> None:
        ins_list, cancel, end = self.program.ins, self.cancel, len(self.program.ins)
        while pc < end:
            if cancel is not None and cancel.is_set():
                raise RunCancelled(f"run {self.run.run_id} was stopped before its next step (the event stream "
                                   "was closed)")
            ins = ins_list[pc]
            if ins.plain:  # the common case: no lookup, no coroutine
                pc = self._plain_stage(ins, ins.spec, pc)  # type: ignore[arg-type]
                continue
            if ins.op == "stage":
                pc = await self._do_stage(ins, pc)
                continue
            handler = HANDLERS.get(ins.op)
            if handler is None:
                raise TracememError(f"internal: unknown instruction '{ins.op}' at {pc} in '{self.program.name}'")
            pc = await handler(self, ins, pc)

    # -- the one step path ------------------------------------------------------------------
    def _begin(self, ins: Instruction, spec: StageSpec, kind: StepKind) -> Begun:
        step = self.next_step = self.next_step + 1
        counts, sid = self.counts, spec.id
        iteration = counts.get(sid, 0)
        counts[sid] = iteration + 1
        if self.starting is not None:
            self.starting(self.run, step, spec, kind, iteration)
        begun = Begun(spec, self.state, step, kind, iteration, self.loops.routed_by(ins) if ins.regions else None)
        if self.deliver is not None and self.deliver.stage == spec.id and kind not in MAPPED:  # (a map: _do_map)
            deliver(begun, self.deliver, self.effects, self.run.run_id, True)
            self.deliver = None
        return begun

    async def _call(self, begun: Begun, fn: Optional[Callable[..., Any]] = None) -> Any:
        """Call the stage function with its view (and context, if it takes one), within its timeout."""
        spec, rec = begun.spec, begun.rec
        call = fn or spec.fn
        view = new_view(self.program.view_class, rec)
        ctx = spec.takes_ctx and StageContext(self.run, rec, spec.name, begun.iteration, self.args, self.env,
                                              self.store, begun.answers, begun.replay or self.replay,
                                              item=begun.item, events=self.events, effects=begun.effects or self.effects)
        if spec.timeout is not None:  # an abandoned sync stage keeps writing into `rec`, which is then dropped
            return await call_with_timeout((lambda: call(view, ctx)) if ctx else (lambda: call(view)), spec.id,
                                           spec.timeout, spec.is_async, self.async_mode,
                                           lambda: setattr(begun, "rec", detached(rec)))
        result = call(view, ctx) if ctx else call(view)
        if spec.is_async:
            result = await result
        return result

    async def _step(self, ins: Instruction, spec: StageSpec, kind: StepKind,
                    body: Optional[Callable[[Begun], Awaitable[Any]]] = None) -> tuple[Begun, Any]:
        """Begin a step and run its body (the stage call by default); a failure is recorded and aborts."""
        begun = self._begin(ins, spec, kind)
        try:
            result = await (body(begun) if body is not None else self._call(begun))
        except Exception as err:
            raise self._fail(begun, err)
        if begun.rec.pause is not None:  # it asked a human (and caught the signal)
            raise self._pause(begun)
        return begun, result

    def _finish(self, begun: Begun, decision: Optional[Decision] = None, ended: Optional[int] = None) -> None:
        """Commit a finished step's writes and record it."""
        begun.rec.commit()
        self._record(begun, "ok", None, decision, ended)

    def _fail(self, begun: Begun, error: BaseException) -> TracememError:
        """Record a failed step (its reads, rows and logs kept, its writes never committed)."""
        if begun.rec.pause is not None:  # not a failure: `ctx.interrupt` ended the stage
            return self._pause(begun)
        own = error.args[0] if isinstance(error, TracememError) and error.args else f"{type(error).__name__}: {error}"
        masker = self._masker(begun.rec)
        message = masker.text(str(own))
        self._record(begun, "failed", message, None, None)
        if isinstance(error, TracememError) and not isinstance(error, StageError):
            return Abort(message, error)
        return Abort(masker.text(str(StageError(begun.spec.id, self.run.run_id, error))), error)

    def _masker(self, rec: Optional[StepRecorder]) -> Masker:
        """What masks the run's known secrets (tracemem/masking.py); empty when it has none."""
        return run_masker(self.program.schema.secret, self.state.data, self.state.secrets, rec and rec.overlay)

    def _pause(self, begun: Begun) -> Paused:
        """Record a paused step (its reads, rows and logs kept, its writes never committed): the run pauses,
        and resuming re-enters the stage as the same iteration."""
        self.counts[begun.spec.id] -= 1
        self._record(begun, "paused", None, None, None)
        return Paused(begun.rec.pause, self.program.ids.get(begun.spec.id))

    def _record(self, begun: Begun, status: str, error: Optional[str], decision: Optional[Decision],
                ended: Optional[int]) -> None:
        run, rec, spec = self.run, begun.rec, begun.spec
        # the one place a step is recorded: `Step`'s fields as a plain tuple (run.Records: the hot path)
        step: StepFields = (rec.step, spec.id, spec.name, begun.kind, begun.iteration, status, error, begun.started,
                            ended or time.time_ns(), begun.routed_by, begun.child_run_id,
                            tuple(rec.logs) if rec.logs else ())
        writes, rows, reads = rec.writes if status == "ok" else [], rec.rows, rec.reads
        if self.secret_fields or self.state.secrets:
            step, writes, rows, decision = mask_step(self._masker(rec), step, writes, rows, decision)
        run.raw_steps.append(step)
        if reads:
            run.raw_reads.extend(reads)
        if writes:
            run.raw_writes.extend(writes)
        if decision is not None:
            run.decisions.append(decision)
        if rows:
            for table, row in rows:
                run.rows.setdefault(table, []).append(row)
        for step_done in self.told:
            step_done(run, step, reads, writes, decision, rows)

    # -- what each kind does around it ------------------------------------------------------
    async def _do_jump(self, ins: Instruction, pc: int) -> int:
        return ins.target

    async def _do_stage(self, ins: Instruction, pc: int) -> int:
        spec: StageSpec = ins.spec  # type: ignore[assignment]
        if spec.pause_before:
            if self.gate != pc:
                raise Paused(Pause({"before": ins.id}, str(ins.id), "before", expect=spec.expect), pc)
            self.gate = -1  # answered: pass once
        begun = self._begin(ins, spec, "stage")
        try:
            await self._call(begun)
        except Exception as err:
            raise self._fail(begun, err)
        return self._stage_done(ins, begun, pc)

    def _plain_stage(self, ins: Instruction, spec: StageSpec, pc: int) -> int:
        """`_do_stage` for a sync stage of one argument (`spec.plain`), `_call` inlined: the hot path."""
        begun = self._begin(ins, spec, "stage")
        try:
            spec.fn(new_view(self.program.view_class, begun.rec))  # type: ignore[misc]
        except Exception as err:
            raise self._fail(begun, err)
        return self._stage_done(ins, begun, pc)

    def _stage_done(self, ins: Instruction, begun: Begun, pc: int) -> int:
        rec = begun.rec
        if rec.pause is not None:  # it asked a human (and caught the signal)
            raise self._pause(begun)
        decision, next_pc = None, pc + 1
        if rec.break_reason is not None:
            decision, next_pc = self._break(ins, begun)
        rec.commit()  # `_finish`, inlined
        self._record(begun, "ok", None, decision, None)
        return next_pc

    def _break(self, ins: Instruction, begun: Begun) -> tuple[Decision, int]:
        """`ctx.break_loop()`: leave the innermost loop around `ins` (an error outside any loop)."""
        loops = [r for r in ins.regions if isinstance(r.key, tuple)]
        if not loops:
            err = TracememError(f"stage '{begun.spec.id}' called break_loop() but is not inside a loop")
            raise self._fail(begun, err)
        region = max(loops, key=lambda r: r.start)
        self.loops.leave(region.key)
        reason = begun.rec.break_reason
        return Decision(begun.rec.step, "break", {"reason": reason, "loop": region.name}), region.exit

    async def _do_branch(self, ins: Instruction, pc: int) -> int:
        spec: StageSpec = ins.spec  # type: ignore[assignment]
        begun, key = await self._step(ins, spec, "decider")
        if key not in ins.targets and not isinstance(key, str) and str(key) in ins.targets:
            key = str(key)  # arm keys are strings: `{True: ..., False: ...}` matches a bool decider
        if key not in ins.targets:
            raise self._fail(begun, TracememError(
                f"decider '{spec.id}' returned {key!r}, which is not one of its branches: {', '.join(ins.targets)}"))
        loop_key = ("loop", pc)
        if key in ins.loop_keys:
            limit = self.program.max_iterations
            if self.loops.rounds.get(loop_key, 0) + 1 > limit:
                raise self._fail(begun, LoopLimitError(
                    f"loop '{spec.id}→{ins.node.arms[key]}' in pipeline '{self.program.name}' exceeded "
                    f"max_iterations={limit} (decider '{spec.id}' kept choosing '{key}'); make it exit or raise "
                    f"Pipeline(..., max_iterations=...)"))
            self.loops.go_round(loop_key, begun.rec.step)
        elif loop_key in self.loops.rounds:
            self.loops.leave(loop_key)
        rec = begun.rec
        self._finish(begun, Decision(rec.step, key, rec.evidence if rec.evidence is not None else {"returned": key}))
        self.loops.last_decision[pc] = rec.step
        self.loops.branch_keys[pc] = key
        return ins.targets[key]

    async def _do_loop(self, ins: Instruction, pc: int) -> int:
        node: LoopNode = ins.node
        loop_key = ("loop", pc)
        spec = StageSpec(id=node.id, name=node.id, fn=node.when if callable(node.when) else None, kind="loop",
                         is_async=asyncio.iscoroutinefunction(node.when))
        begun: Optional[Begun] = None
        if isinstance(node.when, str):  # loop_to(when=<branch key>): the branch before it decided
            again = self.loops.branch_keys.get(ins.branch_index) == node.when
            decided_by = self.loops.last_decision.get(ins.branch_index)
        else:  # a predicate, recorded as a step of its own
            begun, result = await self._step(ins, spec, "loop")
            again, decided_by = bool(result), begun.rec.step
        when = getattr(node.when, "__name__", node.when)
        if not again:
            self.loops.leave(loop_key)
            if begun is not None:
                self._finish(begun, Decision(begun.rec.step, "exit", {"when": when}))
            return pc + 1
        if self.loops.rounds.get(loop_key, 0) + 1 > node.max_iterations:
            err = LoopLimitError(f"loop '{node.id}' back to '{node.target}' in pipeline '{self.program.name}' "
                                 f"exceeded max_iterations={node.max_iterations}; make the loop exit or raise "
                                 f"max_iterations")
            raise self._fail(begun or self._begin(ins, spec, "loop"), err)
        self.loops.go_round(loop_key, decided_by)
        if begun is not None:
            self._finish(begun, Decision(begun.rec.step, "continue", {"when": when}))
        return ins.target


EDITS = Instruction("stage", "(edit)")  # where a fork's edit step sits: outside every branch and loop

# What each instruction kind does (`Program` ops); an op missing here fails the run loudly.
HANDLERS: dict[str, Callable[[Execution, Instruction, int], Awaitable[int]]] = {
    "jump": Execution._do_jump, "stage": Execution._do_stage, "branch": Execution._do_branch,
    "loop": Execution._do_loop, **SUBFLOW_HANDLERS, **PARALLEL_HANDLERS}
