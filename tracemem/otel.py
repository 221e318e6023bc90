"""OpenTelemetry export with the GenAI semantic conventions (opt-in).

A run becomes an ``invoke_workflow {pipeline}`` span; each step is a child span
named after its stage (``execute_tool {name}`` for stages marked ``tool=True``; a tool
agent's tool step is named after the tool it ran, with ``gen_ai.tool.call.id``, and
its arguments and result as ``gen_ai.tool.call.arguments``/``.result`` only with
``capture_content``);
a decision is a ``decision`` event on its step's span; a subflow's run nests
under the step that ran it; ``model_calls`` rows become ``chat {model}`` spans
(kind CLIENT) and ``ctx.span(...)`` rows (``search_memory``, ``update_memory``)
become child spans of their step. Every span carries ``tracemem.run_id`` (and
``tracemem.step``) so a trace in any backend leads back to the DuckDB file; the
trace id is recorded on the run (``run.trace_id``, shown by ``tracemem show``).
A paused run's span ends with ``tracemem.status = paused``; resumed (in any process), its
new run span links to the run span from before the pause (``runs.trace_id``, ``runs.span_id``).

Content -- prompts, replies, decision evidence, run input and output, logs, and error
messages (which may quote a value, a reply or personal data) -- stays in the DuckDB file
unless ``capture_content=True``: without it, an error span's status says only what
failed and the error type (``stage 'x' failed: ValueError``).

Turn it on per run or for the whole process::

    flow.run(inputs, tracer_provider=provider)       # this run (and its subflows)
    tracemem.otel.enable(provider)                    # every run from now on
    tracemem.otel.enable(provider, capture_content=True)
    tracemem.otel.disable()

Spans are built when a step has finished, from the recorded timestamps, so span
timing is exactly the recorded step timing and a stage pays nothing while it runs.
Nothing here is imported unless OpenTelemetry export is asked for.
"""
from __future__ import annotations

import json
import re
import time
import weakref
from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .flow.sinks import default_sinks
from .genai import attribute_value, input_messages, output_messages, tool_call_attributes
from .record import Decision, ReadFields, Step, StepFields, WriteFields, built
from .run import Run

__all__ = ["OTelSink", "enable", "disable", "CONTENT_ATTRIBUTES"]

try:
    from importlib.metadata import version as _dist_version

    _VERSION: Optional[str] = _dist_version("tracemem-agents")
except Exception:  # running from a source tree without the distribution installed
    _VERSION = None

CONTENT_ATTRIBUTES = frozenset({
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.prompt",
    "gen_ai.completion", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.retrieval.query.text",
    "gen_ai.retrieval.documents", "tracemem.input", "tracemem.output", "tracemem.query", "tracemem.logs",
    "tracemem.decision.evidence",
})
"""Attributes that carry content: dropped from `ctx.span(...)` rows unless capture_content=True."""

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER,
          "producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER}
# the error type where tracemem writes one (a message's start, or after "failed in run <id>: "), never a
# word found elsewhere in a message, which may be content
_ERROR_TYPE = re.compile(r"(?:^|failed in run \w+: )([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Timeout))(?::|$)")
_TRACERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def enable(tracer_provider: Any = None, *, capture_content: bool = False) -> "OTelSink":
    """Export every run in this process (`None` = the global tracer provider); replaces an earlier enable().

    A run given `flow.run(..., tracer_provider=...)` is exported there instead."""
    disable()
    sink = OTelSink(tracer_provider, capture_content=capture_content)
    default_sinks.add(sink)
    return sink


def disable() -> None:
    """Stop the process-wide export started by `enable()` (runs already going finish their traces)."""
    default_sinks.remove_if(lambda sink: isinstance(sink, OTelSink))


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


def _error_type(message: Optional[str]) -> str:
    match = _ERROR_TYPE.search(message or "")
    return match.group(1) if match else "_OTHER"


def _links(run: Run) -> list[Link]:
    """Links from a resumed run's span to its spans before the pause (recorded ids: hex text)."""
    contexts = [SpanContext(int(t, 16), int(s, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
                for t, s in run.links if re.fullmatch(r"[0-9a-f]{32}", t) and re.fullmatch(r"[0-9a-f]{16}", s)]
    return [Link(c, {"tracemem.link": "resumed", "tracemem.run_id": run.run_id}) for c in contexts if c.is_valid]


class _RunSpans:
    """One run's export state. `pending` is not None while the run waits for its parent step's span."""

    __slots__ = ("run", "span", "ctx", "trace_id", "tools", "dropped", "pending", "ended", "waiting", "prompts")

    def __init__(self, run: Run, tools: dict[str, Optional[str]]) -> None:
        self.run = run
        self.span: Any = None
        self.ctx: Any = None
        self.trace_id: Optional[str] = None
        self.tools = tools
        self.dropped = False  # sampled out: keep the claim (so subflows are dropped too), export nothing
        self.pending: Optional[list[tuple[Step, Optional[Decision], list]]] = None
        self.ended = False
        self.waiting: Optional[dict[int, list["_RunSpans"]]] = None  # subflow runs by parent step
        self.prompts: Optional[dict[str, dict[str, Any]]] = None  # prompt_id -> prompts row (content only)


class OTelSink:
    """A runner sink that exports runs as OpenTelemetry spans (see the module docstring).

    `tracer_provider=None` uses the global provider. A run already claimed by an
    earlier OTel sink (its `trace_id` set) is left alone, so `flow.run(...,
    tracer_provider=...)` wins over a process-wide `enable()`."""

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False) -> None:
        self.tracer = _tracer(tracer_provider)
        self.capture_content = capture_content
        self._runs: dict[str, _RunSpans] = {}

    def __repr__(self) -> str:
        return f"<OTelSink capture_content={self.capture_content} runs_open={len(self._runs)}>"

    # -- the sink protocol ------------------------------------------------------------
    def begin_run(self, run: Run) -> None:
        """Start the run span (its trace id is recorded on the run)."""
        if run.trace_id is not None:  # another OTel sink exports this run
            return
        state = _RunSpans(run, run.tools)
        parent = self._runs.get(run.parent_run_id) if run.parent_run_id is not None else None
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
            span = self.tracer.start_span(f"invoke_workflow {run.pipeline}", kind=SpanKind.INTERNAL,
                                          attributes=self._run_attributes(run), links=_links(run),
                                          start_time=run.started_at if run.resumed_from is None else time.time_ns())
            context = span.get_span_context()
            state.trace_id = run.trace_id = format(context.trace_id, "032x") if context.is_valid else None
            run.span_id = format(context.span_id, "016x") if context.is_valid else None
            if span.is_recording():
                state.span, state.ctx = span, trace.set_span_in_context(span)
            else:
                state.dropped = True
        self._runs[run.run_id] = state

    def step_done(self, run: Run, fields: StepFields, reads: list[ReadFields], writes: list[WriteFields],
                  decision: Optional[Decision], rows: list[tuple[str, dict[str, Any]]]) -> None:
        """Build the step's span (and its model-call and telemetry child spans) from the recorded timing."""
        state = self._runs.get(run.run_id)
        if state is None or state.dropped:
            return
        step = built(Step, fields)
        if state.pending is not None:
            state.pending.append((step, decision, rows))
            return
        self._step(state, step, decision, rows)

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
    def _described(self, error: Optional[str], what: str) -> str:
        """An error span's status description: the message only with capture_content (it may quote
        content), else what failed and the error type."""
        if self.capture_content and error:
            return error
        kind = _error_type(error)
        return what + (f": {kind}" if kind != "_OTHER" else "")

    def _run_attributes(self, run: Run) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": run.pipeline,
            "tracemem.run_id": run.run_id,
            "tracemem.pipeline_hash": run.pipeline_hash,
        }
        if run.parent_run_id is not None:
            attributes["tracemem.parent_run_id"] = run.parent_run_id
            attributes["tracemem.parent_step"] = run.parent_step
        if run.continues is not None:
            attributes["tracemem.continues_run_id"] = run.continues
        if run.resumed_from is not None:
            attributes["tracemem.resumed"] = True
        if run.forked_from_run_id is not None:
            attributes["tracemem.forked_from_run_id"] = run.forked_from_run_id
            attributes["tracemem.forked_from_step"] = run.forked_from_step
        if self.capture_content:
            attributes["tracemem.input"] = run.input_json
        return attributes

    def _step(self, state: _RunSpans, step: Step, decision: Optional[Decision],
              rows: list[tuple[str, dict[str, Any]]]) -> None:
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
            attributes["error.type"] = _error_type(step.error)
        if self.capture_content and step.logs:
            attributes["tracemem.logs"] = list(step.logs)
        span = self.tracer.start_span(name, context=state.ctx, kind=SpanKind.INTERNAL, attributes=attributes,
                                      start_time=step.started_at)
        if step.status != "ok":
            span.set_status(Status(StatusCode.ERROR, self._described(step.error, f"stage '{step.stage}' failed")))
        elif tool_call is not None and tool_call.get("error"):  # the run went on; this call failed
            span.set_status(Status(StatusCode.ERROR, self._described(str(tool_call["error"]),
                                                                     f"tool '{tool_call.get('name')}' failed")))
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

    def _rows(self, state: _RunSpans, step: Step, rows: list[tuple[str, dict[str, Any]]], context: Any) -> None:
        if self.capture_content:
            for table, row in rows:
                if table == "prompts" and row.get("prompt_id") is not None:
                    if state.prompts is None:
                        state.prompts = {}
                    state.prompts[row["prompt_id"]] = row
        for table, row in rows:
            if table == "model_calls":
                self._chat(state, step, row, context)
            elif table == "_span":
                self._custom(state, step, row, context)

    def _chat(self, state: _RunSpans, step: Step, row: dict[str, Any], context: Any) -> None:
        model = row.get("model")
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
        for key, column in (("gen_ai.provider.name", "provider"), ("gen_ai.request.model", "model"),
                            ("gen_ai.usage.input_tokens", "input_tokens"),
                            ("gen_ai.usage.output_tokens", "output_tokens"), ("tracemem.prompt_id", "prompt_id"),
                            ("tracemem.call_id", "call_id")):
            value = row.get(column)
            if value is not None:
                attributes[key] = value
        if model is not None and not row.get("error"):
            attributes["gen_ai.response.model"] = model
        attributes["tracemem.run_id"] = state.run.run_id
        attributes["tracemem.step"] = step.step
        if row.get("error"):
            attributes["error.type"] = _error_type(str(row["error"]))
        if self.capture_content:
            prompt = state.prompts.get(row.get("prompt_id")) if state.prompts else None  # type: ignore[arg-type]
            messages = input_messages(prompt) if prompt else None
            if messages is not None:
                attributes["gen_ai.input.messages"] = messages
            output = output_messages(row)
            if output is not None:
                attributes["gen_ai.output.messages"] = output
        started = row.get("started_at")
        start = started if isinstance(started, int) else step.started_at
        latency = row.get("latency_ms")
        end = start + int(latency * 1e6) if isinstance(latency, (int, float)) else step.ended_at
        span = self.tracer.start_span(f"chat {model}" if model else "chat", context=context, kind=SpanKind.CLIENT,
                                      attributes=attributes, start_time=start)
        if row.get("error"):
            span.set_status(Status(StatusCode.ERROR, self._described(str(row["error"]), "model call failed")))
        span.end(end_time=max(end, start))

    def _custom(self, state: _RunSpans, step: Step, row: dict[str, Any], context: Any) -> None:
        """A `ctx.span(name, kind=..., attributes=..., start_ns=..., end_ns=...)` row."""
        attributes: dict[str, Any] = {}
        for key, value in (row.get("attributes") or {}).items():
            if key in CONTENT_ATTRIBUTES and not self.capture_content:
                continue
            value = attribute_value(value)
            if value is not None:
                attributes[str(key)] = value
        attributes.setdefault("tracemem.run_id", state.run.run_id)
        attributes.setdefault("tracemem.step", step.step)
        start = row.get("start_ns") or step.started_at
        end = row.get("end_ns") or step.ended_at
        kind = row.get("kind")
        span = self.tracer.start_span(str(row.get("name") or "span"), context=context,
                                      kind=kind if isinstance(kind, SpanKind) else _KINDS.get(str(kind).lower(),
                                                                                             SpanKind.INTERNAL),
                                      attributes=attributes, start_time=start)
        if "error.type" in attributes:
            span.set_status(Status(StatusCode.ERROR, str(attributes["error.type"])))
        span.end(end_time=max(end, start))

    def _materialize(self, state: _RunSpans, parent: Any) -> None:
        """Build a subflow run's span under its parent step's span, then its waiting steps."""
        run = state.run
        span = self.tracer.start_span(f"invoke_workflow {run.pipeline}", context=parent, kind=SpanKind.INTERNAL,
                                      attributes=self._run_attributes(run), links=_links(run),
                                      start_time=run.started_at if run.resumed_from is None else
                                      min((s.started_at for s, _, _ in state.pending or ()), default=time.time_ns()))
        state.span, state.ctx = span, trace.set_span_in_context(span)
        run.span_id = format(span.get_span_context().span_id, "016x")
        pending, state.pending = state.pending or [], None
        for step, decision, rows in pending:
            self._step(state, step, decision, rows)
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
            span.set_attribute("error.type", _error_type(run.error))
            span.set_status(Status(StatusCode.ERROR, self._described(run.error, f"run {run.status}")))
        if self.capture_content:
            if run.output_json is not None:
                span.set_attribute("tracemem.output", run.output_json)
            if run.query is not None:
                span.set_attribute("tracemem.query", run.query)
        span.end(end_time=run.ended_at)
        self._runs.pop(run.run_id, None)
