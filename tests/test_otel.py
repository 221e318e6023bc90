"""OpenTelemetry export (tracemem.otel) with the SDK's in-memory exporter."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

import tracemem.otel as otel
from tracemem import Pipeline, Run, decide
from tracemem.store import Store

SECRET_PROMPT = "PROMPT-TEXT-what is my cat called"
SECRET_REPLY = "REPLY-TEXT-your cat is called Miso"
SECRET_INPUT = "INPUT-TEXT-hello"


class S(BaseModel):
    q: str = ""
    n: int = 0
    a: str = ""
    b: str = ""
    out: str = ""
    score: int = 0


@pytest.fixture
def otel_setup():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter


def spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(exporter.get_finished_spans())


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    found: dict[str, ReadableSpan] = {}
    for span in spans(exporter):
        assert span.name not in found, f"two spans named {span.name!r}"
        found[span.name] = span
    return found


def parent_of(span: ReadableSpan, exporter: InMemorySpanExporter) -> ReadableSpan | None:
    if span.parent is None:
        return None
    for other in spans(exporter):
        if other.context.span_id == span.parent.span_id:
            return other
    raise AssertionError(f"parent of {span.name} was not exported")


def all_text(exporter: InMemorySpanExporter) -> str:
    """Every attribute and event of every exported span, as one string."""
    parts = []
    for span in spans(exporter):
        parts.append(span.name)
        parts.append(json.dumps(dict(span.attributes or {}), default=str))
        parts.append(str(span.status.description))
        for event in span.events:
            parts.append(event.name)
            parts.append(json.dumps(dict(event.attributes or {}), default=str))
    return "\n".join(parts)


def first(s):
    s.n = s.n + 1


def second(s):
    s.out = f"{s.q}:{s.n}"


def model_stage(s, ctx):
    started = time.time_ns()
    ctx.emit("prompts", prompt_id="p-1", text=SECRET_PROMPT,
             messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": SECRET_PROMPT}])
    ctx.emit("model_calls", call_id="c-1", model="gpt-test", provider="openai", prompt_id="p-1",
             response=SECRET_REPLY, input_tokens=12, output_tokens=7, latency_ms=2.5, started_at=started, error=None)
    ctx.span("retrieval", attributes={"gen_ai.operation.name": "retrieval", "tracemem.memory.records": 3,
                                      "tracemem.memory.mode": "hybrid", "gen_ai.retrieval.query.text": SECRET_PROMPT},
             start_ns=started, end_ns=started + 1000)
    s.out = SECRET_REPLY


# -- names, parents, attributes ------------------------------------------------------


def test_run_and_step_spans(otel_setup):
    provider, exporter = otel_setup
    flow = Pipeline("linear", S).then(first).then(second).build()
    run = flow.run({"q": SECRET_INPUT}, tracer_provider=provider)
    found = by_name(exporter)
    assert set(found) == {"invoke_workflow linear", "first", "second"}
    root = found["invoke_workflow linear"]
    assert root.parent is None and root.kind == SpanKind.INTERNAL
    assert dict(root.attributes) == {
        "gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "linear",
        "gen_ai.conversation.id": run.run_id, "tracemem.run_id": run.run_id, "tracemem.pipeline_hash": flow.hash,
        "tracemem.status": "ok"}
    assert root.status.status_code == StatusCode.UNSET
    for number, name in ((1, "first"), (2, "second")):
        span = found[name]
        assert parent_of(span, exporter) is root
        assert span.context.trace_id == root.context.trace_id
        assert span.attributes["tracemem.step"] == number
        assert span.attributes["tracemem.stage_id"] == name
        assert span.attributes["tracemem.stage_kind"] == "stage"
        assert span.attributes["tracemem.iteration"] == 0
        assert span.attributes["tracemem.run_id"] == run.run_id
        assert "gen_ai.operation.name" not in span.attributes


def test_trace_id_is_recorded_on_the_run(otel_setup):
    provider, exporter = otel_setup
    run = Pipeline("p", S).then(first).build().run({}, tracer_provider=provider)
    root = by_name(exporter)["invoke_workflow p"]
    assert run.trace_id == format(root.context.trace_id, "032x") and len(run.trace_id) == 32


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_trace_id_is_stored(otel_setup, durability):
    provider, exporter = otel_setup
    store = Store(durability=durability)
    try:
        if durability == "stage":
            # the run row is written when the run starts: the trace id is on it from then
            seen = []

            def peek(s):
                store.flush()
                seen.append(store.con.execute("SELECT trace_id FROM runs").fetchone()[0])

            flow = Pipeline("p", S).then(peek).build()
        else:
            flow = Pipeline("p", S).then(first).build()
        run = flow.run({}, store=store, tracer_provider=provider)
        store.flush()
        assert run.trace_id and store.run(run.run_id).trace_id == run.trace_id
        if durability == "stage":
            assert seen == [run.trace_id]
    finally:
        store.close()


def test_timing_equals_recorded_timing(otel_setup):
    provider, exporter = otel_setup

    def slow(s):
        time.sleep(0.002)

    run = Pipeline("p", S).then(first).then(slow).build().run({}, tracer_provider=provider)
    found = by_name(exporter)
    root = found["invoke_workflow p"]
    assert (root.start_time, root.end_time) == (run.started_at, run.ended_at)
    for step in run.steps:
        span = found[step.name]
        assert (span.start_time, span.end_time) == (step.started_at, step.ended_at)


def test_decision_is_an_event_without_evidence(otel_setup):
    provider, exporter = otel_setup

    def route(s):
        return decide(s, [("score high", lambda s: s.score > 500, "yes")], default="no")

    flow = Pipeline("p", S).branch(route, {"yes": first, "no": second}).build()
    run = flow.run({"score": 900}, tracer_provider=provider)
    found = by_name(exporter)
    assert "first" in found and "second" not in found
    span = found["route"]
    assert span.attributes["tracemem.stage_kind"] == "decider"
    [event] = span.events
    assert event.name == "decision" and dict(event.attributes) == {"tracemem.decision.chosen": "yes"}
    assert event.timestamp == run.steps[0].ended_at
    assert found["first"].attributes["tracemem.routed_by"] == 1
    assert "score high" not in all_text(exporter)


def test_failed_stage_sets_error_status(otel_setup):
    provider, exporter = otel_setup

    def boom(s):
        raise ValueError("kaput")

    run = Pipeline("p", S).then(first).then(boom).build().run({}, tracer_provider=provider, raise_on_error=False)
    assert run.status == "failed"
    found = by_name(exporter)
    span = found["boom"]
    # the message may quote content: without capture_content only what failed and the type are exported
    assert span.status.status_code == StatusCode.ERROR and span.status.description == "stage 'boom' failed: ValueError"
    assert span.attributes["error.type"] == "ValueError"
    assert found["first"].status.status_code == StatusCode.UNSET
    root = found["invoke_workflow p"]
    assert root.status.status_code == StatusCode.ERROR and root.status.description == "run failed: ValueError"
    assert root.attributes["tracemem.status"] == "failed" and root.attributes["error.type"] == "ValueError"
    assert "kaput" not in all_text(exporter)


def test_tool_stage_is_execute_tool(otel_setup):
    provider, exporter = otel_setup

    def lookup_weather(s):
        s.a = "sunny"

    flow = Pipeline("p", S).then(lookup_weather, tool=True, description="Looks up the weather").then(second).build()
    flow.run({}, tracer_provider=provider)
    found = by_name(exporter)
    span = found["execute_tool lookup_weather"]
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert span.attributes["gen_ai.tool.name"] == "lookup_weather"
    assert span.attributes["gen_ai.tool.description"] == "Looks up the weather"
    assert span.attributes["tracemem.stage_id"] == "lookup_weather"
    assert "second" in found


# -- rows: model calls and ctx.span ----------------------------------------------------


def test_model_call_and_custom_spans_without_content(otel_setup):
    provider, exporter = otel_setup
    run = Pipeline("p", S).then(model_stage, id="answer", name="answer").build().run({"q": SECRET_INPUT}, tracer_provider=provider)
    found = by_name(exporter)
    assert set(found) == {"invoke_workflow p", "answer", "chat gpt-test", "retrieval"}
    chat = found["chat gpt-test"]
    assert parent_of(chat, exporter) is found["answer"] and chat.kind == SpanKind.CLIENT
    assert dict(chat.attributes) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-test",
        "gen_ai.response.model": "gpt-test", "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 7,
        "gen_ai.response.finish_reasons": ("stop",), "gen_ai.conversation.id": run.run_id,
        "tracemem.prompt_id": "p-1", "tracemem.call_id": "c-1", "tracemem.run_id": run.run_id, "tracemem.step": 1}
    row = run.rows["model_calls"][0]
    assert chat.start_time == row["started_at"] and chat.end_time == row["started_at"] + 2_500_000
    memory = found["retrieval"]
    assert parent_of(memory, exporter) is found["answer"] and memory.kind == SpanKind.INTERNAL
    assert memory.attributes["gen_ai.operation.name"] == "retrieval"
    assert memory.attributes["tracemem.memory.records"] == 3 and memory.attributes["tracemem.memory.mode"] == "hybrid"
    assert memory.attributes["tracemem.run_id"] == run.run_id and memory.attributes["tracemem.step"] == 1
    assert memory.end_time - memory.start_time == 1000
    text = all_text(exporter)
    for secret in (SECRET_PROMPT, SECRET_REPLY, SECRET_INPUT, "be brief"):
        assert secret not in text


def test_content_with_capture_content(otel_setup):
    provider, exporter = otel_setup
    listener = otel.OTelListener(provider, capture_content=True)

    def route(s):
        return decide(s, [("always", lambda s: True, "go")])

    def logs(s, ctx):
        ctx.log("a log line")

    flow = Pipeline("p", S).then(model_stage, id="answer", name="answer").branch(route, {"go": logs}).build(
        listeners=[listener])
    run = flow.run({"q": SECRET_INPUT})
    found = by_name(exporter)
    chat = found["chat gpt-test"]
    # a row a stage emitted itself, without the exact request: the prompt it names, system messages apart
    assert json.loads(chat.attributes["gen_ai.system_instructions"]) == [{"type": "text", "content": "be brief"}]
    inputs = json.loads(chat.attributes["gen_ai.input.messages"])
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": SECRET_PROMPT}]}]
    outputs = json.loads(chat.attributes["gen_ai.output.messages"])
    assert outputs == [{"role": "assistant", "parts": [{"type": "text", "content": SECRET_REPLY}],
                        "finish_reason": "stop"}]
    assert found["retrieval"].attributes["gen_ai.retrieval.query.text"] == SECRET_PROMPT
    root = found["invoke_workflow p"]
    assert SECRET_INPUT in root.attributes["tracemem.input"] and SECRET_REPLY in root.attributes["tracemem.output"]
    [event] = found["route"].events
    assert json.loads(event.attributes["tracemem.decision.evidence"])["rules"][0]["rule"] == "always"
    assert list(found["logs"].attributes["tracemem.logs"]) == ["a log line"]
    assert run.trace_id == format(root.context.trace_id, "032x")


# -- subflows, forks, async --------------------------------------------------------------


class Child(BaseModel):
    x: int = 0
    y: int = 0


def double(c):
    c.y = c.x * 2


def test_subflow_nests_under_its_step(otel_setup):
    provider, exporter = otel_setup
    inner = Pipeline("inner", Child).then(double).build()
    middle = Pipeline("middle", Child).then(lambda c: setattr(c, "x", c.x + 1), id="bump", name="bump") \
        .subflow(inner, inputs={"x": "x"}, outputs={"y": "y"}, id="call_inner").build()
    outer = Pipeline("outer", S).then(first) \
        .subflow(middle, inputs=lambda s: {"x": s.n}, outputs={"score": "y"}, id="call_middle").then(second).build()
    run = outer.run({"n": 1}, tracer_provider=provider)
    assert run.output.score == 6
    found = by_name(exporter)
    assert set(found) == {"invoke_workflow outer", "first", "call_middle", "invoke_workflow middle", "bump",
                          "call_inner", "invoke_workflow inner", "double", "second"}
    chain = [("double", "invoke_workflow inner"), ("invoke_workflow inner", "call_inner"),
             ("call_inner", "invoke_workflow middle"), ("bump", "invoke_workflow middle"),
             ("invoke_workflow middle", "call_middle"), ("call_middle", "invoke_workflow outer"),
             ("first", "invoke_workflow outer"), ("second", "invoke_workflow outer")]
    for child, parent in chain:
        assert parent_of(found[child], exporter) is found[parent], child
    assert {s.context.trace_id for s in spans(exporter)} == {found["invoke_workflow outer"].context.trace_id}
    [middle_run] = run.children
    [inner_run] = middle_run.children
    assert middle_run.trace_id == inner_run.trace_id == run.trace_id
    sub = found["invoke_workflow middle"]
    assert sub.attributes["tracemem.parent_run_id"] == run.run_id and sub.attributes["tracemem.parent_step"] == 2
    assert (sub.start_time, sub.end_time) == (middle_run.started_at, middle_run.ended_at)
    assert found["call_middle"].attributes["tracemem.child_run_id"] == middle_run.run_id
    assert found["double"].attributes["tracemem.run_id"] == inner_run.run_id


def test_failed_subflow(otel_setup):
    provider, exporter = otel_setup

    def broken(c):
        raise RuntimeError("inner broke")

    inner = Pipeline("inner", Child).then(broken).build()
    outer = Pipeline("outer", S).subflow(inner, inputs={"x": "n"}, outputs={"n": "y"}, id="call").build()
    run = outer.run({}, tracer_provider=provider, raise_on_error=False)
    assert run.status == "failed"
    found = by_name(exporter)
    assert parent_of(found["invoke_workflow inner"], exporter) is found["call"]
    for name in ("broken", "invoke_workflow inner", "call", "invoke_workflow outer"):
        assert found[name].status.status_code == StatusCode.ERROR, name
        assert found[name].attributes["error.type"] == "RuntimeError", name


BOTH = threading.Barrier(2)  # the two branches wait for each other: they overlap however loaded the machine


def left(s):
    BOTH.wait(timeout=60)  # (a stalled branch brings a helper thread for the other: tracemem/flow/stalls.py)
    s.a = threading.current_thread().name


def right(s):
    BOTH.wait(timeout=60)
    s.b = threading.current_thread().name


def check_fork(run: Run, exporter: InMemorySpanExporter) -> None:
    found = by_name(exporter)
    root = found[f"invoke_workflow {run.pipeline}"]
    for name in ("left", "right"):
        span = found[name]
        assert parent_of(span, exporter) is root
        assert span.attributes["tracemem.stage_kind"] == "fork-branch"
        step = run.step(name)
        assert (span.start_time, span.end_time) == (step.started_at, step.ended_at)
    # the branches ran at the same time, and the spans say so
    assert found["left"].start_time < found["right"].end_time and found["right"].start_time < found["left"].end_time
    assert parent_of(found["join"], exporter) is root


def test_fork_in_threads(otel_setup):
    provider, exporter = otel_setup
    flow = Pipeline("forked", S).fork(left, right).then(second, id="join", name="join").build()
    run = flow.run({}, tracer_provider=provider)
    assert run.output.a != run.output.b  # two threads
    check_fork(run, exporter)


async def aleft(s):
    await asyncio.sleep(0.01)
    s.a = "left"


async def aright(s):
    await asyncio.sleep(0.01)
    s.b = "right"


def test_async_stages_and_async_fork(otel_setup):
    provider, exporter = otel_setup

    async def prepare(s):
        await asyncio.sleep(0)
        s.n = 5

    flow = Pipeline("aforked", S).then(prepare).fork(aleft, aright).then(second, id="join", name="join").build()
    run = asyncio.run(flow.arun({}, tracer_provider=provider))
    found = by_name(exporter)
    root = found["invoke_workflow aforked"]
    for name in ("prepare", "aleft", "aright", "join"):
        assert parent_of(found[name], exporter) is root, name
        step = run.step(name)
        assert (found[name].start_time, found[name].end_time) == (step.started_at, step.ended_at)
    assert found["aleft"].start_time < found["aright"].end_time and found["aright"].start_time < found["aleft"].end_time


def test_concurrent_async_runs_stay_apart(otel_setup):
    provider, exporter = otel_setup
    flow = Pipeline("aforked", S).fork(aleft, aright).build()

    async def both() -> list[Run]:
        return list(await asyncio.gather(flow.arun({}, tracer_provider=provider), flow.arun({}, tracer_provider=provider)))

    runs = asyncio.run(both())
    assert len({r.trace_id for r in runs}) == 2
    roots = {s.attributes["tracemem.run_id"]: s for s in spans(exporter) if s.name == "invoke_workflow aforked"}
    for span in spans(exporter):
        if span.name != "invoke_workflow aforked":
            assert parent_of(span, exporter) is roots[span.attributes["tracemem.run_id"]]


def test_concurrent_threaded_runs_of_a_flow_with_an_exporting_listener(otel_setup):
    provider, exporter = otel_setup
    flow = Pipeline("forked", S).fork(left, right).then(second, id="join", name="join").build(
        listeners=[otel.OTelListener(provider)])
    runs: list[Run] = []
    threads = [threading.Thread(target=lambda: runs.append(flow.run({}))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans(exporter)) == 4 * 4 and len({r.trace_id for r in runs}) == 4
    roots = {s.attributes["tracemem.run_id"]: s for s in spans(exporter) if s.parent is None}
    assert set(roots) == {r.run_id for r in runs}
    for span in spans(exporter):
        if span.parent is not None:
            assert parent_of(span, exporter) is roots[span.attributes["tracemem.run_id"]]


def test_run_nests_under_the_callers_current_span(otel_setup):
    provider, exporter = otel_setup
    with provider.get_tracer("app").start_as_current_span("request") as request:
        run = Pipeline("p", S).then(first).build().run({}, tracer_provider=provider)
    found = by_name(exporter)
    assert parent_of(found["invoke_workflow p"], exporter) is found["request"]
    assert run.trace_id == format(request.get_span_context().trace_id, "032x")


def test_loop_iterations(otel_setup):
    provider, exporter = otel_setup

    def count(s):
        s.n = s.n + 1

    flow = Pipeline("p", S).then(count).loop_to("count", when=lambda s: s.n < 3).build()
    flow.run({}, tracer_provider=provider)
    iterations = sorted(s.attributes["tracemem.iteration"] for s in spans(exporter) if s.name == "count")
    assert iterations == [0, 1, 2]
    loops = [s for s in spans(exporter) if s.attributes.get("tracemem.stage_kind") == "loop"]
    assert [e.attributes["tracemem.decision.chosen"] for s in loops for e in s.events] == ["continue", "continue",
                                                                                           "exit"]


# -- off, enable/disable, sampling ---------------------------------------------------------


def test_nothing_exported_when_off(otel_setup):
    provider, exporter = otel_setup
    flow = Pipeline("p", S).then(model_stage).build()
    run = flow.run({})
    assert spans(exporter) == [] and run.trace_id is None
    flow.run({}, listeners=[otel.OTelListener(provider)])
    assert len(spans(exporter)) == 4
    exporter.clear()
    run = flow.run({})  # nothing process-wide: a listener exports the runs it is given, no others
    assert spans(exporter) == [] and run.trace_id is None


def test_engine_does_not_import_opentelemetry_when_off():
    code = ("import sys\nfrom pydantic import BaseModel\nfrom tracemem import Pipeline\n"
            "class S(BaseModel):\n    n: int = 0\n"
            "def f(s):\n    s.n = 1\n"
            "Pipeline('p', S).then(f).build().run({})\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry') or m == 'tracemem.otel'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_runs_own_provider_wins_over_the_flows_listener(otel_setup):
    provider, exporter = otel_setup
    other = InMemorySpanExporter()
    flow_provider = TracerProvider()
    flow_provider.add_span_processor(SimpleSpanProcessor(other))
    inner = Pipeline("inner", Child).then(double).build()
    flow = Pipeline("outer", S).subflow(inner, inputs={"x": "n"}, outputs={"score": "y"}, id="call").build(
        listeners=[otel.OTelListener(flow_provider)])
    run = flow.run({}, tracer_provider=provider)
    assert len(spans(exporter)) == 4 and spans(other) == []
    assert run.trace_id == run.children[0].trace_id
    flow.run({})
    assert len(spans(other)) == 4


def test_sampled_out_runs_cost_nothing_and_export_nothing():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inner = Pipeline("inner", Child).then(double).build()
    flow = Pipeline("outer", S).then(first).subflow(inner, inputs={"x": "n"}, outputs={"score": "y"}, id="c").build()
    run = flow.run({}, tracer_provider=provider)
    assert spans(exporter) == [] and run.trace_id is not None and run.children[0].trace_id == run.trace_id
    sink = otel.OTelListener(provider)
    flow.run({}, listeners=[sink])
    assert spans(exporter) == [] and sink._runs == {}


def test_sink_forgets_finished_runs(otel_setup):
    provider, exporter = otel_setup
    sink = otel.OTelListener(provider)
    inner = Pipeline("inner", Child).then(double).build()
    flow = Pipeline("outer", S).subflow(inner, inputs={"x": "n"}, outputs={"score": "y"}, id="c").build()
    flow.run({}, listeners=[sink])
    flow.run({}, raise_on_error=False, listeners=[sink])
    assert sink._runs == {}


def test_custom_span_row_values_and_kinds(otel_setup):
    provider, exporter = otel_setup

    def stage(s, ctx):
        ctx.span("update_memory", kind="client", attributes={
            "gen_ai.operation.name": "update_memory", "tracemem.memory.ids": ["m1", "m2"],
            "tracemem.memory.detail": {"k": 1}, "tracemem.none": None, "error.type": "Timeout"})

    run = Pipeline("p", S).then(stage).build().run({}, tracer_provider=provider)
    span = by_name(exporter)["update_memory"]
    assert span.kind == SpanKind.CLIENT
    assert list(span.attributes["tracemem.memory.ids"]) == ["m1", "m2"]
    assert json.loads(span.attributes["tracemem.memory.detail"]) == {"k": 1}
    assert "tracemem.none" not in span.attributes
    assert span.status.status_code == StatusCode.ERROR
    step = run.steps[0]
    assert (span.start_time, span.end_time) == (step.started_at, step.ended_at)


def test_failed_model_call(otel_setup):
    provider, exporter = otel_setup

    def stage(s, ctx):
        ctx.emit("model_calls", call_id="c", model="m", provider="vllm", prompt_id=None, response=None,
                 input_tokens=None, output_tokens=None, latency_ms=None, started_at=None,
                 error="ModelTimeoutError: no reply in 30s")

    run = Pipeline("p", S).then(stage).build().run({}, tracer_provider=provider)
    span = by_name(exporter)["chat m"]
    assert span.status.status_code == StatusCode.ERROR and span.attributes["error.type"] == "ModelTimeoutError"
    assert "gen_ai.response.model" not in span.attributes and "gen_ai.usage.input_tokens" not in span.attributes
    step = run.steps[0]
    assert (span.start_time, span.end_time) == (step.started_at, step.ended_at)


class Stop(BaseException):
    """Like KeyboardInterrupt: not an Exception, so the run ends 'interrupted'."""


def test_interrupted_subflow_still_exports(otel_setup):
    provider, exporter = otel_setup
    sink = otel.OTelListener(provider)

    def halt(c):
        raise Stop("stop")

    inner = Pipeline("inner", Child).then(double).then(halt).build()
    outer = Pipeline("outer", S).then(first).subflow(inner, inputs={"x": "n"}, outputs={"n": "y"}, id="call").build()
    with pytest.raises(Stop):
        outer.run({}, listeners=[sink])
    found = by_name(exporter)
    # the parent step never finished, so the child run hangs under the run span itself
    assert set(found) == {"invoke_workflow outer", "first", "invoke_workflow inner", "double"}
    assert parent_of(found["invoke_workflow inner"], exporter) is found["invoke_workflow outer"]
    assert parent_of(found["double"], exporter) is found["invoke_workflow inner"]
    for name in ("invoke_workflow inner", "invoke_workflow outer"):
        assert found[name].status.status_code == StatusCode.ERROR
        assert found[name].attributes["tracemem.status"] == "interrupted"
    assert sink._runs == {}
