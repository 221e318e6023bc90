"""Executing a compiled pipeline: stages, branches, forks, loops and subflows.

One coroutine runs every flow (`tracemem.flow.Flow.run` drives it). A flow with no async stage is driven without an
event loop (the coroutine never suspends, so `run()` costs no asyncio set-up);
a flow with async stages runs under `asyncio.run` or `await flow.arun(...)`.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Optional

from .ids import new_id
from .context import EMPTY, ReadOnlyArgs, StageContext
from .errors import LoopLimitError, RunFailed, StageError, TracememError
from .pipeline import StageSpec
from .program import Ins
from .record import Decision, Step, Write
from .run import Run
from .fork import apply_ops, fork_conflict, run_branches
from .scope import RunState, StageScope, unwrap

if TYPE_CHECKING:
    from .flow import Flow

_PROCESS_SALT = os.urandom(16)
_DEFAULT_SINKS: list[Any] = []  # process-wide sinks (e.g. OpenTelemetry export)


class _Abort(Exception):
    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


class _Execution:
    """The state of one run while it executes."""

    def __init__(self, flow: Flow[Any], inputs: Any, env: Optional[Mapping[str, Any]], store: Any,
                 subject: Optional[str], durability: Optional[str], tracer_provider: Any,
                 parent: Optional[tuple[str, int]] = None, sinks: Optional[list[Any]] = None,
                 resume: Any = None) -> None:
        self.flow = flow
        self.inputs = inputs
        self.env: Mapping[str, Any] = MappingProxyType(dict(env)) if env else EMPTY
        self.store = store
        self.subject = subject
        self.parent = parent
        self.salt = store.salt if store is not None else _PROCESS_SALT
        if sinks is None:
            sinks = list(_DEFAULT_SINKS)
            if store is not None:
                sinks.append(store.sink(durability))
            if tracer_provider is not None:
                from .otel import OTelSink

                sinks.insert(0, OTelSink(tracer_provider))  # first: it sets run.trace_id before the store writes
        self.sinks = sinks
        self.durability = durability
        self.tracer_provider = tracer_provider
        self.next_step = 0
        self.counts: dict[str, int] = {}
        self.async_mode = False
        self.resume: Optional[Run] = resume  # the run this one continues (a conversation thread)

    # -- run --------------------------------------------------------------------
    async def execute(self, raise_on_error: bool, async_mode: bool) -> Run:
        self.async_mode = async_mode
        flow = self.flow
        previous = self.resume
        if previous is None:
            data = flow.schema.initial(self.inputs, flow.name)
            recorded = data
        else:
            base = previous.output if isinstance(previous.output, flow.scope) else flow.schema.rebuild(
                previous.state_at())
            data, recorded = flow.schema.resume({f: getattr(base, f) for f in flow.schema.fields}, self.inputs,
                                                flow.name)
        self.state = RunState(flow.schema, data, self.salt)
        self.args = ReadOnlyArgs(dict(data))  # copies containers on access: never reaches the scope
        run = self.run = Run(
            run_id=new_id(), pipeline=flow.name, pipeline_hash=flow.hash, schema=flow.schema,
            input_json=flow.schema.dump_scope(recorded, self.salt), started_at=time.time_ns(), subject=self.subject,
            parent_run_id=self.parent[0] if self.parent else None, parent_step=self.parent[1] if self.parent else None,
        )
        run.store = self.store
        run._flow = flow  # type: ignore[attr-defined]  # for sinks: OpenTelemetry reads the stages marked tool=True
        if previous is not None:
            run.continues, run._previous = previous.run_id, previous
        if flow.pipeline.query:
            run.query = str(unwrap(data.get(flow.pipeline.query)) or "") or None
        for sink in self.sinks:
            sink.begin_run(run)
        cause: Optional[BaseException] = None
        try:
            await self._execute_program()
            run.status = "ok"
        except _Abort as abort:
            run.status, run.error, cause = "failed", str(abort), abort.cause
        except BaseException as exc:  # KeyboardInterrupt, cancellation: keep what was recorded
            run.status, run.error = "interrupted", f"{type(exc).__name__}: {exc}"
            self._finish(run)
            raise
        self._finish(run)
        if run.status != "ok" and raise_on_error:
            raise RunFailed(run, cause)
        return run

    def _finish(self, run: Run) -> None:
        data = self.state.data
        run.ended_at = time.time_ns()
        run.output = self.flow.scope.model_construct(**data)
        failed = {s.step for s in run.steps if s.status != "ok"}
        run.output_json = self.flow.schema.dump_output(data, [w for w in run.writes if w.step not in failed], self.salt)
        if self.flow.pipeline.query and run.query is None:
            run.query = str(unwrap(data.get(self.flow.pipeline.query)) or "") or None
        for sink in self.sinks:
            sink.end_run(run)

    async def _execute_program(self) -> None:
        ins_list = self.flow.program.ins
        end = len(ins_list)
        self.last_decision: dict[Any, int] = {}
        self.loop_counts: dict[Any, int] = {}
        self.branch_keys: dict[int, str] = {}
        pc = 0
        while pc < end:
            ins = ins_list[pc]
            op = ins.op
            if op == "jump":
                pc = ins.target
            elif op == "stage":
                pc = await self._do_stage(ins, pc)
            elif op == "branch":
                pc = await self._do_branch(ins, pc)
            elif op == "loop":
                pc = await self._do_loop(ins, pc)
            elif op == "fork":
                pc = await self._do_fork(ins, pc)
            else:
                await self._do_subflow(ins)
                pc += 1

    def _routed_by(self, ins: Ins) -> Optional[int]:
        best = None
        for region in ins.regions:
            step = self.last_decision.get(region.key)
            if step is not None and (best is None or step > best):
                best = step
        return best

    # -- one stage ------------------------------------------------------------------
    def _begin(self, spec: StageSpec) -> tuple[StageScope, int]:
        self.next_step += 1
        iteration = self.counts.get(spec.id, 0)
        self.counts[spec.id] = iteration + 1
        return StageScope(self.state, self.next_step, spec.id), iteration

    async def _call(self, spec: StageSpec, rec: StageScope, iteration: int, fn: Any = None) -> tuple[Any, Any]:
        ctx = None
        if spec.takes_ctx:
            ctx = rec.ctx = StageContext(self.run, rec, spec.name, iteration, self.args, self.env, self.store)
        call = fn or spec.fn
        result = call(self.flow.view_class(rec), ctx) if ctx is not None else call(self.flow.view_class(rec))
        if spec.is_async:
            result = await result
        return result, ctx

    def _fail(self, spec: StageSpec, rec: StageScope, iteration: int, started: int, routed: Optional[int],
              error: BaseException, kind: Optional[str] = None, ctx: Any = None,
              child_run_id: Optional[str] = None) -> _Abort:
        """Record a failed step (its reads, rows and logs kept, its writes never committed)."""
        if ctx is None:
            ctx = getattr(rec, "ctx", None)  # the context of a stage that raised
        message = error.args[0] if isinstance(error, TracememError) and error.args else f"{type(error).__name__}: {error}"
        message = self.flow.schema.mask_secrets(str(message), self.state.data)
        step = Step(rec.step, spec.id, spec.name, kind or spec.kind, iteration, "failed", message, started,
                    time.time_ns(), routed, child_run_id, tuple(ctx._logs) if ctx else ())
        self._record(step, rec, None, writes=[])
        if isinstance(error, TracememError) and not isinstance(error, StageError):
            return _Abort(message, error)
        return _Abort(self.flow.schema.mask_secrets(str(StageError(spec.id, self.run.run_id, error)), self.state.data),
                      error)

    def _record(self, step: Step, rec: StageScope, decision: Optional[Decision],
                writes: Optional[list[Write]] = None) -> None:
        run = self.run
        writes = rec.writes if writes is None else writes
        run.steps.append(step)
        if rec.reads:
            run.reads.extend(rec.reads)
        if writes:
            run.writes.extend(writes)
        if decision is not None:
            run.decisions.append(decision)
        for table, row in rec.rows:
            run.rows.setdefault(table, []).append(row)
        for sink in self.sinks:
            sink.step_done(run, step, rec.reads, writes, decision, rec.rows)

    def _commit(self, rec: StageScope) -> None:
        if rec.own:
            data, last = self.state.data, self.state.last_write
            for name, seq in rec.own.items():
                data[name] = unwrap(rec.overlay[name])
                last[name] = (rec.step, seq)

    async def _run_one(self, ins: Ins, spec: StageSpec, kind: str, fn: Any = None
                       ) -> tuple[StageScope, Any, Any, int, int, Optional[int]]:
        routed = self._routed_by(ins)
        rec, iteration = self._begin(spec)
        started = time.time_ns()
        try:
            result, ctx = await self._call(spec, rec, iteration, fn)
        except Exception as err:
            raise self._fail(spec, rec, iteration, started, routed, err, kind)
        return rec, result, ctx, iteration, started, routed

    async def _do_stage(self, ins: Ins, pc: int) -> int:
        spec = ins.spec
        rec, _, ctx, iteration, started, routed = await self._run_one(ins, spec, "stage")
        decision, next_pc = None, pc + 1
        if ctx is not None and ctx._break is not None:
            decision, next_pc = self._break(ins, rec, ctx._break)
            if decision is None:
                err = TracememError(f"stage '{spec.id}' called break_loop() but is not inside a loop")
                raise self._fail(spec, rec, iteration, started, routed, err, ctx=ctx)
        self._commit(rec)
        self._record(Step(rec.step, spec.id, spec.name, spec.kind, iteration, "ok", None, started, time.time_ns(),
                          routed, None, tuple(ctx._logs) if ctx else ()), rec, decision)
        return next_pc

    def _break(self, ins: Ins, rec: StageScope, reason: str) -> tuple[Optional[Decision], int]:
        loops = [r for r in ins.regions if isinstance(r.key, tuple)]
        if not loops:
            return None, -1
        region = max(loops, key=lambda r: r.start)
        self.loop_counts.pop(region.key, None)
        self.last_decision.pop(region.key, None)
        return Decision(rec.step, "break", {"reason": reason, "loop": region.name}), region.exit

    async def _do_branch(self, ins: Ins, pc: int) -> int:
        spec = ins.spec
        rec, key, ctx, iteration, started, routed = await self._run_one(ins, spec, "decider")
        if key not in ins.targets and not isinstance(key, str) and str(key) in ins.targets:
            key = str(key)  # arm keys are strings: `{True: ..., False: ...}` matches a bool decider
        if key not in ins.targets:
            err = TracememError(f"decider '{spec.id}' returned {key!r}, which is not one of its branches: "
                                f"{', '.join(ins.targets)}")
            raise self._fail(spec, rec, iteration, started, routed, err, ctx=ctx)
        loop_key = ("loop", pc)
        if key in ins.loop_keys:
            count = self.loop_counts.get(loop_key, 0) + 1
            limit = self.flow.pipeline.max_iterations
            if count > limit:
                err = LoopLimitError(
                    f"loop '{spec.id}→{ins.node.arms[key]}' in pipeline '{self.flow.name}' exceeded "
                    f"max_iterations={limit} (decider '{spec.id}' kept choosing '{key}'); make it exit or raise "
                    f"Pipeline(..., max_iterations=...)")
                raise self._fail(spec, rec, iteration, started, routed, err, ctx=ctx)
            self.loop_counts[loop_key] = count
            self.last_decision[loop_key] = rec.step
        elif loop_key in self.loop_counts:
            self.loop_counts.pop(loop_key)
            self.last_decision.pop(loop_key, None)
        evidence = rec.evidence if rec.evidence is not None else {"returned": key}
        decision = Decision(rec.step, key, evidence)
        self._commit(rec)
        self._record(Step(rec.step, spec.id, spec.name, "decider", iteration, "ok", None, started, time.time_ns(),
                          routed, None, tuple(ctx._logs) if ctx else ()), rec, decision)
        self.last_decision[pc] = rec.step
        self.branch_keys[pc] = key
        return ins.targets[key]

    async def _do_loop(self, ins: Ins, pc: int) -> int:
        node = ins.node
        loop_key = ("loop", pc)
        spec = StageSpec(id=node.id, name=node.id, fn=node.when if callable(node.when) else _always,
                         kind="loop", is_async=asyncio.iscoroutinefunction(node.when))
        if isinstance(node.when, str):
            again = self.branch_keys.get(ins.branch_index) == node.when
            decided_by = self.last_decision.get(ins.branch_index)
            rec = None
        else:
            rec, result, _, iteration, started, routed = await self._run_one(ins, spec, "loop")
            again, decided_by = bool(result), rec.step
        if not again:
            self.loop_counts.pop(loop_key, None)
            self.last_decision.pop(loop_key, None)
            if rec is not None:
                self._commit(rec)  # a predicate's writes (rare) are recorded, so they are committed too
                self._record(Step(rec.step, spec.id, spec.name, "loop", iteration, "ok", None, started,
                                  time.time_ns(), routed), rec, Decision(rec.step, "exit", {"when": node.when.__name__}))
            return pc + 1
        count = self.loop_counts.get(loop_key, 0) + 1
        if count > node.max_iterations:
            if rec is None:
                routed = self._routed_by(ins)
                rec, iteration = self._begin(spec)
                started = time.time_ns()
            err = LoopLimitError(f"loop '{node.id}' back to '{node.target}' in pipeline '{self.flow.name}' exceeded "
                                 f"max_iterations={node.max_iterations}; make the loop exit or raise max_iterations")
            raise self._fail(spec, rec, iteration, started, routed, err)
        self.loop_counts[loop_key] = count
        if decided_by is not None:
            self.last_decision[loop_key] = decided_by
        if rec is not None:
            self._commit(rec)
            self._record(Step(rec.step, spec.id, spec.name, "loop", iteration, "ok", None, started, time.time_ns(),
                              routed), rec, Decision(rec.step, "continue", {"when": node.when.__name__}))
        return ins.target

    # -- fork -------------------------------------------------------------------------
    async def _do_fork(self, ins: Ins, pc: int) -> int:
        routed = self._routed_by(ins)
        specs: list[StageSpec] = ins.node.branches
        begun = [self._begin(spec) for spec in specs]
        outcomes = await run_branches(self, specs, begun)

        failure: Optional[BaseException] = next((o[3] for o in outcomes if o[3] is not None), None)
        failed_at = next((i for i, o in enumerate(outcomes) if o[3] is not None), -1)
        if failure is None:
            failure, pair = fork_conflict(specs, [b[0] for b in begun])
        decision, next_pc = None, pc + 1
        breaker = next((i for i, o in enumerate(outcomes) if o[2] is not None and o[2]._break is not None), -1)
        if failure is None and breaker >= 0:  # a branch called break_loop(): leave the loop after the fork
            decision, next_pc = self._break(ins, begun[breaker][0], outcomes[breaker][2]._break)
            if decision is None:
                failure = TracememError(f"stage '{specs[breaker].id}' called break_loop() but is not inside a loop")
        if failure is not None:
            abort = None
            for i, (spec, (rec, iteration)) in enumerate(zip(specs, begun)):
                own = outcomes[i][3]
                err = own if own is not None else (
                    failure if failed_at < 0 else TracememError(f"not committed: fork branch '{specs[failed_at].id}' failed"))
                a = self._fail(spec, rec, iteration, outcomes[i][0], routed, err, ctx=outcomes[i][2])
                abort = abort or (a if own is not None or failed_at < 0 else None)
            raise abort or _Abort(str(failure), failure)
        for i, (spec, (rec, iteration)) in enumerate(zip(specs, begun)):
            apply_ops(self.state, rec.ops)
            for name, seq in rec.own.items():
                self.state.last_write[name] = (rec.step, seq)
            ctx = outcomes[i][2]
            self._record(Step(rec.step, spec.id, spec.name, "fork-branch", iteration, "ok", None, outcomes[i][0],
                              outcomes[i][1], routed, None, tuple(ctx._logs) if ctx else ()), rec,
                         decision if i == breaker else None)
        return next_pc

    # -- subflow ----------------------------------------------------------------------
    async def _do_subflow(self, ins: Ins) -> None:
        node = ins.node
        spec = ins.spec
        routed = self._routed_by(ins)
        rec, iteration = self._begin(spec)
        started = time.time_ns()
        child: Optional[Run] = None
        try:
            view = self.flow.view_class(rec)
            if callable(node.inputs):
                child_inputs = unwrap(node.inputs(view))
            else:
                child_inputs = {c: unwrap(getattr(view, p)) for c, p in node.inputs.items()}
            exe = _Execution(node.flow, child_inputs, self.env, self.store, self.subject, self.durability,
                             self.tracer_provider, parent=(self.run.run_id, rec.step), sinks=self.sinks)
            if self.async_mode:
                child = await exe.execute(False, async_mode=True)
            else:
                coro = exe.execute(False, async_mode=False)
                try:
                    coro.send(None)
                except StopIteration as done:
                    child = done.value
            self.run.children.append(child)
            if child.status != "ok":
                raise TracememError(f"subflow '{node.flow.name}' (child run {child.run_id}) failed: {child.error}")
            for parent_field, child_field in node.outputs.items():
                setattr(view, parent_field, getattr(child.output, child_field))
        except Exception as err:
            raise self._fail(spec, rec, iteration, started, routed, err,
                             child_run_id=child.run_id if child else None)
        self._commit(rec)
        mapping = f"subflow outputs {json.dumps(dict(node.outputs))}"  # kept in the file for backtracking
        self._record(Step(rec.step, spec.id, spec.name, "subflow", iteration, "ok", None, started, time.time_ns(),
                          routed, child.run_id, (mapping,)), rec, None)


def _always(scope: Any) -> bool:
    return True
