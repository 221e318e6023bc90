"""`Flow`: a validated, runnable pipeline, and the `Sink` protocol runs are recorded through."""
from __future__ import annotations

import asyncio
from typing import Any, Generic, Mapping, Optional, Protocol, TypeVar

from pydantic import BaseModel

from .errors import TracememError
from .pipeline import Pipeline
from .program import Program
from .record import Decision, Read, Step, Write
from .run import Run
from .runner import _Execution
from .schema import ScopeSchema, register_pipeline, schema_for
from .scope import view_class

S = TypeVar("S", bound=BaseModel)


class Sink(Protocol):
    """Receives a run as it happens (the store, OpenTelemetry export)."""

    def begin_run(self, run: Run) -> None: ...
    def step_done(self, run: Run, step: Step, reads: list[Read], writes: list[Write],
                  decision: Optional[Decision], rows: list[tuple[str, dict[str, Any]]]) -> None: ...
    def end_run(self, run: Run) -> None: ...


class Flow(Generic[S]):
    """A validated, runnable pipeline (`Pipeline.build()`)."""

    def __init__(self, pipeline: Pipeline[S]) -> None:
        self.pipeline = pipeline
        self.name = pipeline.name
        self.scope = pipeline.scope
        self.program = Program(pipeline)
        self.graph = self.program.graph
        self.hash = self.program.fingerprint()
        self.schema: ScopeSchema = schema_for(pipeline.scope)
        self.view_class = view_class(self.schema)
        register_pipeline(self.hash, self.schema)
        self.has_async = any(s.is_async for s in self.program.specs) or any(
            i.op == "loop" and callable(i.node.when) and asyncio.iscoroutinefunction(i.node.when)
            for i in self.program.ins
        )

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
            tracer_provider: Any = None, resume: Any = None) -> Run:
        """Run to completion and return the recorded `Run` (raises `RunFailed` on failure
        unless `raise_on_error=False`; the failed run is recorded either way).

        `resume=<Run or run id>` starts from that run's final state (a conversation
        thread): only `inputs` are recorded as this run's input, and reads of the
        carried-over state trace back into the earlier run."""
        exe = _Execution(self, inputs, env, store, subject, durability, tracer_provider,
                         resume=self._previous(resume, store))
        if self.has_async:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(exe.execute(raise_on_error, async_mode=True))
            raise TracememError(f"flow '{self.name}' has async stages and an event loop is running: "
                                f"use `await flow.arun(...)`")
        coro = exe.execute(raise_on_error, async_mode=False)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        coro.close()
        raise TracememError(f"flow '{self.name}' suspended without async stages; use `await flow.arun(...)`")

    async def arun(self, inputs: Any = None, *, env: Optional[Mapping[str, Any]] = None, store: Any = None,
                   subject: Optional[str] = None, durability: Optional[str] = None, raise_on_error: bool = True,
                   tracer_provider: Any = None, resume: Any = None) -> Run:
        """`run` for callers already inside an event loop."""
        exe = _Execution(self, inputs, env, store, subject, durability, tracer_provider,
                         resume=self._previous(resume, store))
        return await exe.execute(raise_on_error, async_mode=True)

    def _previous(self, resume: Any, store: Any) -> Optional[Run]:
        """The run `resume=` names (a Run, or a run id looked up in `store`), checked to fit this flow."""
        if resume is None:
            return None
        previous = resume
        if isinstance(previous, str):
            if store is None:
                raise TracememError(f"resume='{previous}' needs store=...: a run id is looked up in the store")
            previous = store.run(previous)
        if not isinstance(previous, Run):
            raise TracememError(f"resume= takes a Run or a run id, got {previous!r}")
        if previous.schema is not None and previous.schema.model is not self.scope:
            raise TracememError(f"cannot resume run {previous.run_id} of '{previous.pipeline}' with flow "
                                f"'{self.name}': their scopes differ")
        return previous
