"""Declaring stage graphs (`Pipeline`, the builder) and running them (`Flow`, its product).

    flow = (Pipeline("agent", Agent)
            .then(think)
            .branch(route, {"tool": call_tool, "final": answer})
            .loop_to("think", when="tool", max_iterations=8)
            .build())
    run = flow.run({"task": "..."}, store=store)

Branch arms are a stage function, a `Pipeline` over the same scope (inlined), or
the id of another stage (a jump; a jump backwards is a loop, guarded by the
pipeline's `max_iterations`). `loop_to(target, when=...)` jumps back to `target`
while `when` holds: a branch key of the branch just before it, or a predicate
`fn(scope) -> bool` recorded as a decision. `ctx.break_loop(reason)` in any stage
inside a loop leaves it after that stage.

A run can stop to ask a human (`ctx.interrupt`, `.then(fn, pause_before=True)`):
`flow.resume(run, answer)` continues it, and `flow.fork(run, after_step, edits=...)`
starts a new run from any recorded step (both in `flow/resume.py`).

The builder sits beside its product, so nothing imports back: `Flow.run` assembles
the listeners (the flow's, the call's, the store's, an OpenTelemetry export's) and
hands the runner the compiled `Program`; the runner never sees the Flow.
"""
from __future__ import annotations

import asyncio
from typing import (Any, AsyncIterator, Callable, Generic, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar,
                    Union, get_origin)

from pydantic import BaseModel

from ..errors import PipelineError, TracememError
from ..record import ResumePoint
from ..run import Run
from .program import Program
from .events import FlowEvent, Listener
from .answers import expect_ref
from .effect_stage import effect_stage
from .interrupt import NO_ANSWER
from .resume import fork_execution, resume_execution
from .kinds import Runner
from .runner import Execution
from .spec import BranchNode, ForkNode, LoopNode, MapNode, Node, StageNode, StageSpec, SubflowNode, stage_spec
from .streaming import astream_run, stream_run

S = TypeVar("S", bound=BaseModel)


class Pipeline(Generic[S]):
    """Fluent builder of a stage graph over the scope model `scope`."""

    def __init__(self, name: str, scope: type[S], *, description: Optional[str] = None,
                 max_iterations: int = 25, query: Optional[str] = None) -> None:
        if not (isinstance(scope, type) and issubclass(scope, BaseModel)):
            raise PipelineError(f"pipeline '{name}': the scope must be a pydantic BaseModel subclass, got {scope!r}")
        self.name = name
        self.scope = scope
        self.description = description
        self.max_iterations = max_iterations
        # scope path holding the run's question (`runs.query`, embedded for run snapshots); None: the scope's
        # `question` field if it has one; "": none
        self.query = query
        self.nodes: list[Node] = []

    def then(self, fn: Callable[..., Any], *, id: Optional[str] = None, name: Optional[str] = None,
             description: Optional[str] = None, tool: bool = False, pause_before: bool = False,
             expect: Any = None, effect: bool = False, timeout: Optional[float] = None) -> "Pipeline[S]":
        """Run `fn(scope)` (or `fn(scope, ctx)`, sync or async) next; `pause_before=True` pauses the run
        before it begins (`flow.resume` continues it, `ctx.answer` holds the answer, validated as `expect`
        when given: a bad answer is refused and the run stays paused). `effect=True` declares that it has side
        effects (it pays, mails, books): a replaying fork or a counterfactual replays its recorded writes instead
        of calling it again (flow/effect_stage.py). With `timeout` (seconds),
        a stage still running after it fails its step with `StageTimeout` (see tracemem/flow/timeout.py: an
        async stage is cancelled; a sync one runs in a worker thread that is abandoned, its later writes
        discarded)."""
        spec = stage_spec(fn, id=id, name=name, description=description, tool=tool, timeout=timeout)
        if expect is not None and not pause_before:
            raise PipelineError(f"stage '{spec.id}': expect= declares the answer of a pause_before=True point; "
                                f"a stage that asks with ctx.interrupt(...) passes expect= to it")
        spec.pause_before, spec.expect = pause_before, expect_ref(expect)
        if effect:
            spec.fn, spec.takes_ctx, spec.effect = effect_stage(fn, spec.takes_ctx, spec.is_async), True, True
        self.nodes.append(StageNode(spec))
        return self

    def branch(self, decider: Callable[..., Any], arms: Mapping[str, Any], *, id: Optional[str] = None,
               name: Optional[str] = None, description: Optional[str] = None) -> "Pipeline[S]":
        """Run `decider(scope)`, which returns one of `arms`' keys (or a `decide(...)` result)."""
        if not arms:
            raise PipelineError(f"pipeline '{self.name}': branch '{id or getattr(decider, '__name__', decider)}' has no arms")
        spec = stage_spec(decider, id=id, name=name, description=description, kind="decider")
        self.nodes.append(BranchNode(spec, {str(k): self._arm(spec.id, k, v) for k, v in arms.items()}))
        return self

    def _arm(self, decider: str, key: str, arm: Any) -> Union[list[Node], str]:
        if isinstance(arm, str):
            return arm
        if isinstance(arm, (Pipeline, Flow)):
            source = arm if isinstance(arm, Pipeline) else arm.pipeline
            if source.scope is not self.scope:
                raise PipelineError(
                    f"branch '{decider}' arm '{key}': pipeline '{source.name}' uses scope "
                    f"{source.scope.__name__}, not {self.scope.__name__}; use .subflow(...) with inputs/outputs mapping"
                )
            return list(source.nodes)
        return [StageNode(stage_spec(arm))]

    def fork(self, *fns: Callable[..., Any], id: Optional[str] = None, name: Optional[str] = None) -> "Pipeline[S]":
        """Run the stages concurrently (threads for sync, asyncio.gather for async)."""
        if len(fns) < 2:
            raise PipelineError(f"pipeline '{self.name}': a fork needs at least two stages")
        specs = [stage_spec(f, kind="fork-branch") for f in fns]
        fork_id = id or "fork(" + ",".join(s.id for s in specs) + ")"
        self.nodes.append(ForkNode(fork_id, name or fork_id, specs))
        return self

    def subflow(self, flow: "Flow[Any]", *, inputs: Union[Mapping[str, str], Callable[[Any], dict]],
                outputs: Mapping[str, str], id: Optional[str] = None, name: Optional[str] = None,
                description: Optional[str] = None) -> "Pipeline[S]":
        """Run another flow as a child run: `inputs` maps child field ← parent field (or is
        `fn(scope) -> dict`), `outputs` maps parent field ← child field."""
        if not isinstance(flow, Flow):
            raise PipelineError(f"pipeline '{self.name}': subflow needs a built flow (call .build()), got {flow!r}")
        sid = id or flow.name
        checks = [(outputs, self.scope, flow.scope, "outputs")]
        if not callable(inputs):
            checks.append((inputs, flow.scope, self.scope, "inputs"))
        for mapping, left, right, which in checks:  # {left field: right field}
            for a, b in mapping.items():
                bad = a if a not in left.model_fields else b if b not in right.model_fields else None
                if bad is not None:
                    model = left if bad == a and a not in left.model_fields else right
                    raise PipelineError(
                        f"subflow '{sid}' {which}={{{a!r}: {b!r}}}: {model.__name__} has no field '{bad}' "
                        f"(fields: {', '.join(model.model_fields)})")
        spec = StageSpec(id=sid, name=name or sid, fn=None, description=description or flow.pipeline.description,
                         kind="subflow", is_async=flow.program.has_async)
        self.nodes.append(SubflowNode(spec, flow, inputs, dict(outputs)))
        return self

    def map(self, fn: Callable[..., Any], *, over: str, id: Optional[str] = None, name: Optional[str] = None,
            description: Optional[str] = None, tool: bool = False) -> "Pipeline[S]":
        """Run `fn(scope, ctx)` once per element of the list field `over`, all at once (threads for sync,
        asyncio.gather for async): each is a step of its own (kind "map-item", or "tool" with `tool=True`)
        that finds its element in `ctx.item`, recorded as a read of `over`. Appends to one list merge in
        element order; two elements setting one path is an error naming both."""
        spec = stage_spec(fn, id=id, name=name, description=description, kind="tool" if tool else "map-item",
                          tool=tool)
        field = self.scope.model_fields.get(over)
        where = f"pipeline '{self.name}': map '{spec.id}' over='{over}'"
        if field is None:
            raise PipelineError(f"{where}: the scope {self.scope.__name__} has no field '{over}' "
                                f"(fields: {', '.join(self.scope.model_fields)})")
        if not (field.annotation in (list, tuple) or get_origin(field.annotation) in (list, tuple)):
            raise PipelineError(f"{where}: field '{over}' is {field.annotation!r}, not a list; over= names a "
                                "list field whose elements the stage gets as ctx.item")
        if not spec.takes_ctx:
            raise PipelineError(f"pipeline '{self.name}': map stage '{spec.id}' must take (scope, ctx): "
                                "its element is ctx.item")
        self.nodes.append(MapNode(spec, over))
        return self

    def loop_to(self, target: str, *, when: Union[str, Callable[[Any], bool]], max_iterations: int = 10,
                id: Optional[str] = None) -> "Pipeline[S]":
        """Jump back to stage `target` while `when` holds (a branch key or `fn(scope) -> bool`)."""
        if max_iterations < 1:
            raise PipelineError(f"pipeline '{self.name}': loop_to('{target}') needs max_iterations >= 1")
        self.nodes.append(LoopNode(id or f"loop→{target}", target, when, max_iterations))
        return self

    def build(self, *, listeners: Sequence[Listener] = ()) -> "Flow[S]":
        """Validate and compile; errors name the offending stage. `listeners` hear every run of the flow (each
        a callable taking the run's events, tracemem/flow/events.py): e.g. `tracemem.otel.OTelListener(tp)`."""
        return Flow(self, listeners)


class Flow(Generic[S]):
    """A validated, runnable pipeline (`Pipeline.build()`)."""

    def __init__(self, pipeline: Pipeline[S], listeners: Sequence[Listener] = ()) -> None:
        self.pipeline = pipeline
        self.listeners = list(listeners)  # every run of this flow reports to them (besides a call's own)
        self.name = pipeline.name
        self.scope = pipeline.scope
        self.program = Program(pipeline)
        self.graph = self.program.graph
        self.hash = self.program.hash
        self.schema = self.program.schema
        self.has_async = self.program.has_async

    def __repr__(self) -> str:
        return f"<Flow {self.name} {self.hash} stages={len(self.program.specs)}>"

    def to_mermaid(self) -> str:
        """The stage graph as a Mermaid flowchart."""
        return self.program.mermaid()

    def to_spec(self) -> dict[str, Any]:
        """The stage graph as a JSON-able dict (nodes, edges, scope fields, hash)."""
        return {**self.program.spec(), "hash": self.hash}

    def run(self, inputs: Any = None, *, env: Optional[Mapping[str, Any]] = None, store: Any = None,
            subject: Optional[str] = None, durability: Optional[str] = None, raise_on_error: bool = True,
            tracer_provider: Any = None, resume: Any = None, listeners: Sequence[Listener] = ()) -> Run:
        """Run to completion and return the recorded `Run` (raises `RunFailed` on failure
        unless `raise_on_error=False`; the failed run is recorded either way). A run that asks a
        human returns with status `paused` and `run.pending` (see `resume`).

        `resume=<Run or run id>` starts from that run's final state (a conversation
        thread): only `inputs` are recorded as this run's input, and reads of the
        carried-over state trace back into the earlier run."""
        return self._drive(self._execution(inputs, env, store, subject, durability, tracer_provider, resume, listeners),
                           raise_on_error, "arun")

    async def arun(self, inputs: Any = None, *, env: Optional[Mapping[str, Any]] = None, store: Any = None,
                   subject: Optional[str] = None, durability: Optional[str] = None, raise_on_error: bool = True,
                   tracer_provider: Any = None, resume: Any = None, listeners: Sequence[Listener] = ()) -> Run:
        """`run` for callers already inside an event loop."""
        exe = self._execution(inputs, env, store, subject, durability, tracer_provider, resume, listeners)
        return await exe.execute(raise_on_error, async_mode=True)

    def stream(self, inputs: Any = None, *, env: Optional[Mapping[str, Any]] = None, store: Any = None,
               subject: Optional[str] = None, durability: Optional[str] = None, tracer_provider: Any = None,
               resume: Any = None, listeners: Sequence[Listener] = ()) -> Iterator[FlowEvent]:
        """Run and yield typed events as they happen (`tracemem.flow.events`): run started, step started,
        model token deltas, tool calls, step finished (with its writes), decisions, run finished or failed
        (a failed run ends the stream with `RunFailedEvent`, a paused one with `RunPaused` carrying what it asks;
        nothing is raised for either). Leaving the loop
        early stops the run before its next step and records it `interrupted`, everything so far kept."""
        return stream_run(self._execution(inputs, env, store, subject, durability, tracer_provider, resume, listeners),
                          self.program.has_async)

    def astream(self, inputs: Any = None, *, env: Optional[Mapping[str, Any]] = None, store: Any = None,
                subject: Optional[str] = None, durability: Optional[str] = None, tracer_provider: Any = None,
                resume: Any = None, listeners: Sequence[Listener] = ()) -> AsyncIterator[FlowEvent]:
        """`stream` for async code (`async for event in flow.astream(...)`): the run goes on a worker thread,
        so a sync stage never holds your event loop; close it early with `contextlib.aclosing`."""
        return astream_run(self._execution(inputs, env, store, subject, durability, tracer_provider, resume, listeners),
                           self.program.has_async)

    # -- pause, resume, fork (flow/resume.py) ----------------------------------------------
    def resume(self, run: Any, answer: Any = NO_ANSWER, *, store: Any = None, by: Optional[str] = None,
               env: Optional[Mapping[str, Any]] = None, durability: Optional[str] = None,
               tracer_provider: Any = None, replay: bool = False, raise_on_error: bool = True,
               live_effects: bool = False, listeners: Sequence[Listener] = ()) -> Run:
        """Continue a `paused` run (or one a crash left `interrupted`) where it stopped, in any process:
        the same run id, step numbers carrying on, finished stages never run again. The stage that asked
        is re-entered and `ctx.interrupt` returns `answer` (recorded as a human input, given `by` whom;
        with no answer it asks again). `run` is a Run or a run id (or a unique prefix of one) in `store`;
        `replay=True` also answers any call whose exact request the run recorded before from the record.
        Side effects the re-entered stage made before it paused are replayed, not made again, unless
        `live_effects=True` (flow/effects.py)."""
        exe = resume_execution(self.program, run, answer, store=store, by=by, env=env, replay=replay,
                               listeners=self._listeners(store, durability, tracer_provider, listeners),
                               live_effects=live_effects)
        return self._drive(exe, raise_on_error, "aresume")

    async def aresume(self, run: Any, answer: Any = NO_ANSWER, *, store: Any = None, by: Optional[str] = None,
                      env: Optional[Mapping[str, Any]] = None, durability: Optional[str] = None,
                      tracer_provider: Any = None, replay: bool = False, raise_on_error: bool = True,
                      live_effects: bool = False, listeners: Sequence[Listener] = ()) -> Run:
        """`resume` for callers already inside an event loop."""
        exe = resume_execution(self.program, run, answer, store=store, by=by, env=env, replay=replay,
                               listeners=self._listeners(store, durability, tracer_provider, listeners),
                               live_effects=live_effects)
        return await exe.execute(raise_on_error, async_mode=True)

    def fork(self, run: Any, after_step: Union[int, str], *, edits: Optional[Mapping[str, Any]] = None,
             store: Any = None, env: Optional[Mapping[str, Any]] = None, subject: Optional[str] = None,
             durability: Optional[str] = None, tracer_provider: Any = None, replay: bool = False,
             raise_on_error: bool = True, without: Iterable[str] = (),
             counterfactual: Optional[dict[str, Any]] = None, live_effects: bool = False,
             listeners: Sequence[Listener] = ()) -> Run:
        """Start a new run from `run`'s recorded state after `after_step` (a step number, or a stage id: its
        last execution; 0: the run's start) with `edits` ({path: value}, validated like writes) applied as its first step. Lineage is
        recorded (`forked_from_run_id`, `forked_from_step`); `replay=True` answers every model call whose
        exact request the original recorded from the record, so only changed prompts reach the model, and
        every side effect it recorded (tools, effect stages, `ctx.effect`) from the record, so none is made
        twice: an effect the record does not hold pauses the fork instead, unless `live_effects=True`, which
        makes every effect live again (flow/effects.py). `without` lists sources the new run leaves out (see
        `trace.counterfactual`)."""
        exe = fork_execution(self.program, run, after_step, edits=edits, store=store, env=env, replay=replay,
                             subject=subject, listeners=self._listeners(store, durability, tracer_provider, listeners),
                             without=without, counterfactual=counterfactual, live_effects=live_effects)
        return self._drive(exe, raise_on_error, "afork")

    async def afork(self, run: Any, after_step: Union[int, str], *, edits: Optional[Mapping[str, Any]] = None,
                    store: Any = None, env: Optional[Mapping[str, Any]] = None, subject: Optional[str] = None,
                    durability: Optional[str] = None, tracer_provider: Any = None, replay: bool = False,
                    raise_on_error: bool = True, without: Iterable[str] = (),
                    counterfactual: Optional[dict[str, Any]] = None, live_effects: bool = False,
             listeners: Sequence[Listener] = ()) -> Run:
        """`fork` for callers already inside an event loop."""
        exe = fork_execution(self.program, run, after_step, edits=edits, store=store, env=env, replay=replay,
                             subject=subject, listeners=self._listeners(store, durability, tracer_provider, listeners),
                             without=without, counterfactual=counterfactual, live_effects=live_effects)
        return await exe.execute(raise_on_error, async_mode=True)

    def _drive(self, exe: Execution, raise_on_error: bool, async_name: str) -> Run:
        """Execute without an event loop when no stage is async, else under `asyncio.run`."""
        if not self.program.has_async:
            return exe.run_sync(raise_on_error)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(exe.execute(raise_on_error, async_mode=True))
        raise TracememError(f"flow '{self.name}' has async stages and an event loop is running: "
                            f"use `await flow.{async_name}(...)`")

    def _execution(self, inputs: Any, env: Optional[Mapping[str, Any]], store: Any, subject: Optional[str],
                   durability: Optional[str], tracer_provider: Any, resume: Any,
                   listeners: Sequence[Listener]) -> Execution:
        return Runner(self.program, inputs, env=env, store=store, subject=subject,
                         listeners=self._listeners(store, durability, tracer_provider, listeners),
                         resume=self._previous(resume, store))

    def _listeners(self, store: Any, durability: Optional[str], tracer_provider: Any,
                   listeners: Sequence[Listener]) -> list[Listener]:
        """Who hears this run: an OpenTelemetry export to the call's provider (first: it exports the run rather
        than one the flow's listeners hold), the flow's own listeners, the call's, the store."""
        out = [*self.listeners, *listeners]
        if store is not None:
            out.append(store.listener(durability))
        if tracer_provider is not None:
            from ..otel import OTelListener

            out.insert(0, OTelListener(tracer_provider))
        return out

    def _previous(self, resume: Any, store: Any) -> Union[Run, ResumePoint, None]:
        """The run `resume=` names (a Run, or a run id looked up in `store`), checked to fit this flow."""
        if resume is None:
            return None
        previous = resume
        if isinstance(previous, str):
            if store is None:
                raise TracememError(f"resume='{previous}' needs store=...: a run id is looked up in the store")
            previous = store.resume_point(previous)  # its final state, without loading its whole record
        if not isinstance(previous, (Run, ResumePoint)):
            raise TracememError(f"resume= takes a Run or a run id, got {previous!r}")
        if previous.schema is not None and previous.schema.model is not self.scope:
            raise TracememError(f"cannot resume run {previous.run_id} of '{previous.pipeline}' with flow "
                                f"'{self.name}': their scopes differ")
        return previous
