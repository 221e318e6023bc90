"""OpenTelemetry export with the GenAI semantic conventions (opt-in), and OpenInference beside them.

A run becomes an ``invoke_agent {pipeline}`` span when its pipeline has tool stages, else an
``invoke_workflow {pipeline}`` span, with ``gen_ai.conversation.id`` naming its thread; each
step is a child span named after its stage (``execute_tool {name}`` for tool steps, with
``gen_ai.tool.call.id``, and arguments and result only with ``capture_content``); a decision is
a ``decision`` event on its step's span; a subflow's run nests under the step that ran it. A
model call is a ``chat {model}`` span (kind CLIENT) with the exact request it sent:
``gen_ai.system_instructions``, ``gen_ai.input.messages`` (real roles; text, tool_call and
tool_call_response parts), ``gen_ai.output.messages`` and ``gen_ai.tool.definitions`` -- the
same messages the store keeps (tracemem/exchange.py). Memory recall is a ``retrieval`` span with
its documents' ids and scores; ``ctx.span(...)`` rows become spans of their own. Every span
carries ``tracemem.run_id`` (and ``tracemem.step``) so a trace in any backend leads back to the
store; the trace id is recorded on the run (``run.trace_id``).

Content -- messages, replies, document text, decision evidence, run input and output, logs, and
error messages (which may quote a value, a reply or personal data) -- stays in the store unless
``capture_content=True``: without it, an error span's status says only what failed and the
error type (``stage 'x' failed: ValueError``). ``openinference=True`` adds OpenInference
attributes (span kinds, input and output values, LLM messages, retrieved documents), which
Arize Phoenix and Arize read.

Turn it on per run, or for every run of a flow (nothing process-wide)::

    flow.run(inputs, tracer_provider=provider)                      # this run (and its subflows)
    exporter = OTelListener(provider, capture_content=True, openinference=True)
    flow.run(inputs, listeners=[exporter])                          # the same, with options
    flow = pipeline.build(listeners=[exporter])                     # every run of the flow

Spans are built when a step has finished, from the recorded timestamps, so span timing is
exactly the recorded step timing and a stage pays nothing while it runs. Nothing here is
imported unless OpenTelemetry export is asked for.
"""
from __future__ import annotations

from .children import CONTENT_ATTRIBUTES
from .listener import OTelListener

__all__ = ["CONTENT_ATTRIBUTES", "OTelListener"]
