"""Export a tracemem run to OpenTelemetry (GenAI semantic conventions), printed to the console.

A small agent looks up the weather with a tool stage, asks a (scripted) model to
answer, and a decider checks the answer. The run becomes an
`invoke_workflow weather-agent` span with one child span per step, an
`execute_tool lookup_weather` span for the tool, a `chat scripted-4o` span for
the model call and a `decision` event; the prompt and reply stay out of the
spans (they are in the DuckDB file when you record with `store=`):

    python examples/otel_export.py

To send the spans to the OpenTelemetry collector you already run (Jaeger, Tempo,
Honeycomb, Phoenix, Langfuse…), `pip install opentelemetry-exporter-otlp` and use
an OTLP exporter instead of the console one:

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint="http://localhost:4318/v1/traces")))
    flow.run(inputs, tracer_provider=provider)   # this run; or pipeline.build(listeners=[OTelListener(provider)])

Pass `OTelListener(provider, capture_content=True)` to also put prompts and replies on the
spans (`gen_ai.input.messages` / `gen_ai.output.messages`).
"""
from __future__ import annotations

import time
import uuid

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.models import ScriptedModel


class Chat(BaseModel):
    question: str = ""
    weather: str = ""
    answer: str = ""


def lookup_weather(s: Chat) -> None:
    """Weather for a city (a stand-in for a real API)."""
    s.weather = "light rain, 14°C"


def answer(s: Chat, ctx) -> None:
    model = ctx.env["model"]
    messages = [{"role": "system", "content": f"Weather now: {s.weather}"}, {"role": "user", "content": s.question}]
    started = time.time_ns()
    reply = model.complete(messages)
    ctx.emit("model_calls", call_id=uuid.uuid4().hex[:12], model=reply.model, provider=model.provider,
             prompt_id=None, response=reply.text, input_tokens=reply.usage.input_tokens,
             output_tokens=reply.usage.output_tokens, latency_ms=(time.time_ns() - started) / 1e6,
             started_at=started, error=None)
    s.answer = reply.text


def check(s: Chat) -> str:
    return "send" if "umbrella" in s.answer else "apologise"


def send(s: Chat) -> None:
    pass


def apologise(s: Chat) -> None:
    s.answer = "Sorry, I could not tell."


def one_line(span: ReadableSpan) -> str:
    """A short line per span (the default console format is a page of JSON each)."""
    depth = 0 if span.parent is None else 2 if span.name.startswith("chat ") else 1
    shown = {k: v for k, v in (span.attributes or {}).items() if k.startswith("gen_ai.") or k == "tracemem.step"}
    events = "".join(f" [{e.name}: {dict(e.attributes or {})}]" for e in span.events)
    took = (span.end_time - span.start_time) / 1e6
    return f"{'  ' * depth}{span.name}  ({took:.2f} ms) {shown}{events}\n"


def main() -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=one_line)))
    flow = (Pipeline("weather-agent", Chat)
            .then(lookup_weather, tool=True)
            .then(answer)
            .branch(check, {"send": send, "apologise": apologise})
            .build())
    model = ScriptedModel(default="Take an umbrella: light rain, 14°C.", name="scripted-4o", provider="scripted")
    run = flow.run({"question": "Do I need an umbrella in Lyon?"}, env={"model": model}, tracer_provider=provider)
    print(f"run {run.run_id} -> trace {run.trace_id}")


if __name__ == "__main__":
    main()
