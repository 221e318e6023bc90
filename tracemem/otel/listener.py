"""The OpenTelemetry listener: a run's spans, built from its events as its steps finish (see
tracemem/otel/__init__.py). The spans of the runs it exports are its own state: a run's trace and
span ids reach the record only as annotations (`run.trace_id`, `run.span_id`), which the store writes.

A run is an `invoke_agent {pipeline}` span when its pipeline has tool stages (a tool agent), else an
`invoke_workflow {pipeline}` span; both carry the conversation as `gen_ai.conversation.id` (the
thread's first run id). Each step is a child span, a subflow's run nests under the step that ran it
(its steps wait until that step's span exists), and a step's rows become spans under it
(tracemem/otel/children.py). A paused run's span ends with `tracemem.status = paused`; resumed (in
any process), its new run span links to the run span from before the pause.
"""
from __future__ import annotations

import json
import re
import time
import weakref
from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ..errors import UsageError
from ..flow.events import RunFailedEvent, RunFinished, RunPaused, RunStarted, StepFinished
from ..genai import tool_call_attributes
from ..record import Decision, Read, Step, Write
from ..run import Run
from .children import Export, chat_span, custom_span
from .status import described, error_type

__all__ = ["OTelListener"]

try:
    from importlib.metadata import version as _dist_version

    _VERSION: Optional[str] = _dist_version("tracemem-agents")
except Exception:  # running from a source tree without the distribution installed
    _VERSION = None

_TRACERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _tracer(provider: Any) -> Any:
    if provider is None:
        provider = trace.get_tracer_provider()
    try:
        tracer = _TRACERS.get(provider)
    except TypeError:  # a provider that cannot be weakly referenced
        return provider.get_tracer("tracemem", _VERSION)
    if tracer is None:
        tracer = _TRACERS[provider] = provider.get_tracer("tracemem", _VERSION)
    return tracer


def _openinference() -> Any:
    """The OpenInference attribute builders; a clear error when their package is missing."""
    try:
        from . import openinference
    except ImportError as err:
        raise UsageError("OpenInference attributes need the openinference-semantic-conventions package: "
                         "pip install 'tracemem-agents[otlp]'") from err
    return openinference


def _links(run: Run, resumed: Optional[tuple[Any, ...]]) -> list[Link]:
    """Links from a resumed run's span to its spans before the pause (recorded ids: hex text)."""
    before = [resumed[5]] if resumed is not None and len(resumed) > 5 and resumed[5] else []
    contexts = [SpanContext(int(t, 16), int(s, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
                for t, s in before if re.fullmatch(r"[0-9a-f]{32}", t or "") and re.fullmatch(r"[0-9a-f]{16}", s or "")]
    return [Link(c, {"tracemem.link": "resumed", "tracemem.run_id": run.run_id}) for c in contexts if c.is_valid]


class _RunSpans:
    """One run's export state. `pending` is not None while the run waits for its parent step's span."""

    __slots__ = ("run", "span", "ctx", "trace_id", "tools", "dropped", "pending", "ended", "waiting", "prompts",
                 "session", "values", "resumed")

    def __init__(self, run: Run, tools: dict[str, Optional[str]], session: Optional[str],
                 resumed: Optional[tuple[Any, ...]]) -> None:
        self.run = run
        self.resumed = resumed  # a resumed run: how much of its record came before (and its spans then)
        self.span: Any = None
        self.ctx: Any = None
        self.trace_id: Optional[str] = None
        self.tools = tools
        self.dropped = False  # sampled out: keep the claim (so subflows are dropped too), export nothing
        self.pending: Optional[list[tuple[Step, Optional[Decision], list, list, list]]] = None
        self.ended = False
        self.waiting: Optional[dict[int, list["_RunSpans"]]] = None  # subflow runs by parent step
        self.prompts: Optional[dict[str, dict[str, Any]]] = None  # prompt_id -> prompts row (content only)
        self.session = session  # the conversation (gen_ai.conversation.id): the thread's first run
        self.values: Optional[dict[tuple[int, int], Optional[str]]] = None  # writes by (step, seq): OpenInference


class OTelListener:
    """Exports runs as OpenTelemetry spans (see the module docstring): a listener of their events, passed as
    `flow.run(..., listeners=[OTelListener(tp)])`, `build(listeners=[...])`, or made by
    `flow.run(..., tracer_provider=tp)`. `tracer_provider=None` uses the global provider. A run another
    OpenTelemetry listener exports already (its `trace_id` set) is left alone."""

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False,
                 openinference: bool = False) -> None:
        self.tracer = _tracer(tracer_provider)
        self.capture_content = capture_content
        self.openinference = _openinference() if openinference else None
        self.export = Export(capture_content, self.openinference)
        self._runs: dict[str, _RunSpans] = {}

    def __repr__(self) -> str:
        return (f"<OTelListener capture_content={self.capture_content} openinference={self.openinference is not None}"
                f" runs_open={len(self._runs)}>")

    def __call__(self, event: Any) -> None:
        if isinstance(event, StepFinished):
            self.step_done(event.run_id, event.record, list(event.reads), list(event.writes), event.decision,
                           list(event.rows))
        elif isinstance(event, RunStarted):
            self.begin_run(event.run, event.resumed)
        elif isinstance(event, (RunFinished, RunPaused, RunFailedEvent)):
            self.end_run(event.run)

    def begin_run(self, run: Run, resumed: Optional[tuple[Any, ...]] = None) -> None:
        """Start the run span (its trace id is recorded on the run)."""
        if run.trace_id is not None:  # another OpenTelemetry listener exports this run
            return
        parent = self._runs.get(run.parent_run_id) if run.parent_run_id is not None else None
        state = _RunSpans(run, run.tools, parent.session if parent is not None else run.thread_id or run.run_id,
                          resumed)
        if parent is not None:
            # A subflow: its parent step's span is built when that step finishes, after this run;
            # until then this run's steps wait (see _materialize).
            state.trace_id = run.trace_id = parent.trace_id
            if parent.dropped:
                state.dropped = True
            else:
                state.pending = []
                if parent.waiting is None:
                    parent.waiting = {}
                parent.waiting.setdefault(run.parent_step, []).append(state)  # type: ignore[arg-type]
        else:
            span = self.tracer.start_span(_run_name(run), kind=SpanKind.INTERNAL,
                                          attributes=self._run_attributes(state), links=_links(run, resumed),
                                          start_time=run.started_at if resumed is None else time.time_ns())
            context = span.get_span_context()
            state.trace_id = run.trace_id = format(context.trace_id, "032x") if context.is_valid else None
            run.span_id = format(context.span_id, "016x") if context.is_valid else None
            if span.is_recording():
                state.span, state.ctx = span, trace.set_span_in_context(span)
            else:
                state.dropped = True
        self._runs[run.run_id] = state

    def step_done(self, run_id: str, step: Optional[Step], reads: list[Read], writes: list[Write],
                  decision: Optional[Decision], rows: list[tuple[str, dict[str, Any]]]) -> None:
        """Build the step's span (and its model-call and telemetry child spans) from the recorded timing."""
        state = self._runs.get(run_id)
        if state is None or state.dropped or step is None:
            return
        if state.pending is not None:
            state.pending.append((step, decision, rows, reads, writes))
            return
        self._step(state, step, decision, rows, reads, writes)

    def end_run(self, run: Run) -> None:
        """End the run span with the run status."""
        state = self._runs.get(run.run_id)
        if state is None:
            return
        if state.dropped:
            del self._runs[run.run_id]
        elif state.pending is not None:
            state.ended = True  # ended when its parent step's span is built
        else:
            self._end(state)

    # -- building spans ---------------------------------------------------------------
    def _run_attributes(self, state: _RunSpans) -> dict[str, Any]:
        run = state.run
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent" if run.tools else "invoke_workflow",
            "gen_ai.agent.name" if run.tools else "gen_ai.workflow.name": run.pipeline,
            "gen_ai.conversation.id": state.session,
            "tracemem.run_id": run.run_id,
            "tracemem.pipeline_hash": run.pipeline_hash,
        }
        if run.parent_run_id is not None:
            attributes["tracemem.parent_run_id"] = run.parent_run_id
            attributes["tracemem.parent_step"] = run.parent_step
        if run.continues is not None:
            attributes["tracemem.continues_run_id"] = run.continues
        if state.resumed is not None:
            attributes["tracemem.resumed"] = True
        if run.forked_from_run_id is not None:
            attributes["tracemem.forked_from_run_id"] = run.forked_from_run_id
            attributes["tracemem.forked_from_step"] = run.forked_from_step
        if self.capture_content:
            attributes["tracemem.input"] = run.input_json
        if self.openinference is not None:
            attributes.update(self.openinference.run_attributes(bool(run.tools), run.pipeline, state.session,
                                                                run.input_json if self.capture_content else None))
        return attributes

    def _step(self, state: _RunSpans, step: Step, decision: Optional[Decision],
              rows: list[tuple[str, dict[str, Any]]], reads: list[Read], writes: list[Write]) -> None:
        run_id = state.run.run_id
        attributes: dict[str, Any] = {
            "tracemem.run_id": run_id, "tracemem.step": step.step, "tracemem.stage_id": step.stage,
            "tracemem.stage_kind": step.kind, "tracemem.iteration": step.iteration,
        }
        if step.routed_by is not None:
            attributes["tracemem.routed_by"] = step.routed_by
        if step.child_run_id is not None:
            attributes["tracemem.child_run_id"] = step.child_run_id
        tool_call = next((row for table, row in rows if table == "tool_calls"), None)
        if tool_call is not None:  # a tool agent's tool step: named after the tool it ran
            attributes.update(tool_call_attributes(tool_call, self.capture_content))
            name = f"execute_tool {tool_call['name']}"
        elif step.stage in state.tools:
            name = f"execute_tool {step.name}"
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = step.name
            attributes["gen_ai.tool.type"] = "function"
            description = state.tools[step.stage]
            if description:
                attributes["gen_ai.tool.description"] = description
        else:
            name = step.name
        if step.status != "ok":
            attributes["error.type"] = error_type(step.error)
        if self.capture_content and step.logs:
            attributes["tracemem.logs"] = list(step.logs)
        if self.openinference is not None:
            inputs, outputs = self._step_values(state, reads, writes)
            attributes.update(self.openinference.step_attributes(
                tool_call, step.name if step.stage in state.tools else None, state.tools.get(step.stage), inputs,
                outputs))
        span = self.tracer.start_span(name, context=state.ctx, kind=SpanKind.INTERNAL, attributes=attributes,
                                      start_time=step.started_at)
        if step.status != "ok":
            span.set_status(Status(StatusCode.ERROR, described(step.error, f"stage '{step.stage}' failed",
                                                               self.capture_content)))
        elif tool_call is not None and tool_call.get("error"):  # the run went on; this call failed
            span.set_status(Status(StatusCode.ERROR, described(str(tool_call["error"]),
                                                               f"tool '{tool_call.get('name')}' failed",
                                                               self.capture_content)))
        if decision is not None:
            event: dict[str, Any] = {"tracemem.decision.chosen": decision.chosen}
            if self.capture_content:
                event["tracemem.decision.evidence"] = json.dumps(decision.evidence, default=str)
            span.add_event("decision", event, timestamp=step.ended_at)
        children = state.waiting.pop(step.step, None) if state.waiting else None
        if rows or children:
            context = trace.set_span_in_context(span)
            if rows:
                self._rows(state, step, rows, context)
            for child in children or ():
                self._materialize(child, context)
        span.end(end_time=step.ended_at)

    def _step_values(self, state: _RunSpans, reads: list[Read],
                     writes: list[Write]) -> tuple[Optional[str], Optional[str]]:
        """What a step read ({path: value}) and wrote ([{path, verb, value}]) as JSON, for OpenInference's
        input and output (content: None without capture)."""
        if not self.capture_content:
            return None, None
        if state.values is None:
            state.values = {}
        seen = {}
        for _, _, path, source_step, source_seq in reads:
            if source_step is not None and (source_step, source_seq) in state.values:
                seen[path] = _parsed(state.values[(source_step, source_seq)])
        wrote = []
        for step, seq, path, verb, value in writes:
            state.values[(step, seq)] = value
            wrote.append({"path": path, "verb": verb, "value": _parsed(value)})
        return (json.dumps(seen, default=str, ensure_ascii=False) if seen else None,
                json.dumps(wrote, default=str, ensure_ascii=False) if wrote else None)

    def _rows(self, state: _RunSpans, step: Step, rows: list[tuple[str, dict[str, Any]]], context: Any) -> None:
        exchanges = {row["call_id"]: row for table, row in rows if table == "_exchange"}
        for table, row in rows:
            if table == "prompts" and row.get("prompt_id") is not None:
                if state.prompts is None:
                    state.prompts = {}
                state.prompts[row["prompt_id"]] = row
        for table, row in rows:
            if table == "model_calls":
                prompt = state.prompts.get(row.get("prompt_id")) if state.prompts else None  # type: ignore[arg-type]
                chat_span(self.tracer, context, self.export, state.run.run_id, step, row,
                          exchanges.get(row.get("call_id")), prompt, state.session)
            elif table == "_span":
                custom_span(self.tracer, context, self.export, state.run.run_id, step, row)

    def _materialize(self, state: _RunSpans, parent: Any) -> None:
        """Build a subflow run's span under its parent step's span, then its waiting steps."""
        run = state.run
        span = self.tracer.start_span(_run_name(run), context=parent, kind=SpanKind.INTERNAL,
                                      attributes=self._run_attributes(state), links=_links(run, state.resumed),
                                      start_time=run.started_at if state.resumed is None else
                                      min((p[0].started_at for p in state.pending or ()), default=time.time_ns()))
        state.span, state.ctx = span, trace.set_span_in_context(span)
        run.span_id = format(span.get_span_context().span_id, "016x")
        pending, state.pending = state.pending or [], None
        for step, decision, rows, reads, writes in pending:
            self._step(state, step, decision, rows, reads, writes)
        if state.ended:
            self._end(state)

    def _end(self, state: _RunSpans) -> None:
        run, span = state.run, state.span
        if state.waiting:  # subflow runs whose parent step never finished (an interrupted run)
            for children in state.waiting.values():
                for child in children:
                    self._materialize(child, state.ctx)
            state.waiting = None
        span.set_attribute("tracemem.status", run.status)
        if run.status not in ("ok", "paused"):
            span.set_attribute("error.type", error_type(run.error))
            span.set_status(Status(StatusCode.ERROR, described(run.error, f"run {run.status}", self.capture_content)))
        if self.capture_content:
            if run.output_json is not None:
                span.set_attribute("tracemem.output", run.output_json)
                if self.openinference is not None:
                    span.set_attribute("output.value", run.output_json)
                    span.set_attribute("output.mime_type", "application/json")
            if run.query is not None:
                span.set_attribute("tracemem.query", run.query)
        span.end(end_time=run.ended_at)
        self._runs.pop(run.run_id, None)


def _run_name(run: Run) -> str:
    """`invoke_agent {pipeline}` for a pipeline with tool stages (an agent), else `invoke_workflow {pipeline}`."""
    return f"{'invoke_agent' if run.tools else 'invoke_workflow'} {run.pipeline}"


def _parsed(value: Optional[str]) -> Any:
    """A recorded write's JSON text as the value it holds (the text itself when it is not JSON)."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value
