"""The runner: known secrets never stored or exported, error text without content in
OpenTelemetry, per-stage timeouts, and values too deep or circular named with their field and limit."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import pathlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, SecretStr

from tracemem import Pipeline, PipelineError, RunFailed, ScopeWriteError
from tracemem.errors import StageTimeout
from tracemem.models import OpenAICompatibleModel
from tracemem.store import Store

API_KEY = "sk-live-7f3a9c2e11d04b8a"
TOKEN = "tok-ABCD-9911-secret"
PASSWORD = "hunter2-very-private"


@pytest.fixture
def echo_server():
    """A model server that rejects every call and echoes the request's Authorization header back."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"error": f"invalid credentials: {self.headers.get('Authorization')}"}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


class Secrets(BaseModel):
    token: SecretStr = SecretStr("")
    note: str = ""
    answer: str = ""


def otel() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def exported_text(exporter: InMemorySpanExporter) -> str:
    parts = []
    for span in exporter.get_finished_spans():
        parts += [span.name, json.dumps(dict(span.attributes or {}), default=str), str(span.status.description)]
        for event in span.events:
            parts += [event.name, json.dumps(dict(event.attributes or {}), default=str)]
    return "\n".join(parts)


def stored_text(store: Store, folder: pathlib.Path) -> str:
    """Every row of every table, and the Parquet export's bytes."""
    store.export(str(folder))
    parts = [p.read_bytes().decode("latin-1") for p in folder.glob("*.parquet")]
    for (table,) in store.sql("SELECT table_name FROM information_schema.tables").fetchall():
        parts.append(repr(store.sql(f"SELECT * FROM {table}").fetchall()))
    return "\n".join(parts)


@pytest.mark.parametrize("durability", ["run", "stage"])
@pytest.mark.parametrize("capture_content", [False, True])
def test_known_secrets_are_masked_wherever_text_is_stored_or_exported(tmp_path, echo_server, durability,
                                                                     capture_content):
    model = OpenAICompatibleModel(echo_server, "m", api_key=API_KEY, max_retries=0)
    with_password = OpenAICompatibleModel(echo_server.replace("http://", f"http://user:{PASSWORD}@"), "m2",
                                          max_retries=0)

    def prepare(s, ctx):
        raw = s.token.get_secret_value()
        ctx.log(f"calling with token {raw}")
        ctx.emit("prompts", prompt_id="p1", text=f"system: token={raw}",
                 messages=[{"role": "system", "content": f"use {raw}"}])
        s.note = f"token was {raw}"  # a non-secret field quoting the secret

    def call(s, ctx):
        for m in (with_password, model):
            try:
                ctx.complete(m, [{"role": "user", "content": "hi"}], prompt_id="p1")
            except Exception:
                if m is model:
                    raise

    provider, exporter = otel()
    import tracemem.otel as tracemem_otel

    sink = tracemem_otel.OTelListener(provider, capture_content=capture_content)
    flow = Pipeline("leaky", Secrets).then(prepare).then(call).build()
    with Store(str(tmp_path / "s.duckdb"), durability=durability) as store:
        run = flow.run({"token": TOKEN}, store=store, raise_on_error=False, listeners=[sink])
        assert run.status == "failed" and "401" in run.error
        text = stored_text(store, tmp_path / "export")
        for secret in (API_KEY, TOKEN, PASSWORD):
            assert secret not in text
            assert secret not in exported_text(exporter)
            assert secret not in run.error and all(secret not in str(s) for s in run.steps)
        assert "401" in text and ("<redacted>" in text or "***" in text)  # the errors are there, their secrets not
        calls = store.sql("SELECT model, error FROM model_calls ORDER BY started_at").fetchall()
        assert [m for m, _ in calls] == ["m2", "m"] and all(e for _, e in calls)
        assert "Bearer " in calls[1][1] and API_KEY not in calls[1][1]  # masked (by the adapter or the store)


class Person(BaseModel):
    name: str = ""
    age: int = 0


def test_error_text_sent_to_opentelemetry_carries_no_content_without_capture_content():
    def typo(s):
        s.age = "Alice Smith, SSN 078-05-1120"  # personal data in a rejected write

    def boom(s):
        raise ValueError("customer Alice Smith owes 1,200")

    for fn in (typo, boom):
        provider, exporter = otel()
        run = Pipeline("p", Person).then(fn).build().run({}, tracer_provider=provider, raise_on_error=False)
        assert "Alice Smith" in run.error  # the store keeps the detail
        text = exported_text(exporter)
        assert "Alice" not in text and "078-05" not in text and "owes" not in text
        statuses = [s.status.description for s in exporter.get_finished_spans() if s.status.description]
        assert statuses and all(d.startswith(("stage '", "run failed")) for d in statuses), statuses


class Pin(BaseModel):
    pin: SecretStr = SecretStr("")


def _guess(key: bytes, stored: str) -> list[str]:
    """Try every 4-digit PIN against a stored hash with `key`."""
    return [c for c in (f"{i:04d}" for i in range(10_000))
            if "hmac-sha256:" + hmac.new(key, c.encode(), hashlib.sha256).hexdigest()[:32] == stored]


def test_a_low_entropy_secret_cannot_be_recovered_from_the_file_alone(tmp_path, monkeypatch):
    """The hash key lives outside the store (tracemem/masking.py): the key file beside the user's config, or
    TRACEMEM_SECRET_KEY. Whoever holds only the file tries every PIN with the salt it holds and finds nothing;
    with the key too, they would."""
    flow = Pipeline("pin", Pin).then(lambda s: None, id="noop").build()
    monkeypatch.setenv("TRACEMEM_CONFIG_DIR", str(tmp_path / "config"))
    for label, key in (("key file", None), ("TRACEMEM_SECRET_KEY", "k3y-kept-outside-the-file")):
        if key:
            monkeypatch.setenv("TRACEMEM_SECRET_KEY", key)
        else:
            monkeypatch.delenv("TRACEMEM_SECRET_KEY", raising=False)
        with Store(str(tmp_path / f"{label}.duckdb")) as store:
            first = json.loads(flow.run({"pin": "4821"}, store=store).input_json)["pin"]["$redacted"]
            again = json.loads(flow.run({"pin": "4821"}, store=store).input_json)["pin"]["$redacted"]
            assert first == again  # equal secrets still hash equal
            salt = bytes.fromhex(store.sql("SELECT value FROM tracemem_meta WHERE key = 'secret_salt'")
                                 .fetchall()[0][0])
        assert _guess(salt, first) == []  # the file alone: nothing
        outside = key.encode() if key else (tmp_path / "config" / "secret-key").read_bytes().strip()
        derived = hmac.new(outside, b"tracemem-secret-hash\0" + salt, hashlib.sha256).digest()
        assert _guess(derived, first) == ["4821"], label  # the file and the key: what the key protects


# -- a per-stage timeout --------------------------------------------------------------------------------


class Slow(BaseModel):
    before: int = 0
    after: int = 0


def test_a_sync_stage_past_its_timeout_fails_its_step_and_its_late_writes_are_discarded(tmp_path):
    release, finished = threading.Event(), threading.Event()

    def stuck(s, ctx):
        s.before = 1
        ctx.log("started")
        release.wait(30)  # without the timeout the run would wait here (and then succeed)
        s.after = 2
        ctx.log("late")
        ctx.emit("prompts", prompt_id="late", text="late")
        finished.set()

    flow = Pipeline("slow", Slow).then(stuck, timeout=0.2).then(lambda s: None, id="never").build()
    with Store(str(tmp_path / "t.duckdb")) as store:
        run = flow.run({}, store=store, raise_on_error=False)
        release.set()
        assert finished.wait(10)  # the abandoned thread ran on, into a recorder nobody reads
        assert run.status == "failed" and [s.stage for s in run.steps] == ["stuck"]
        step = run.steps[0]
        assert step.error.startswith("stage 'stuck' timed out after 0.2 s (.then(..., timeout=0.2)); its thread "
                                     "cannot be killed, so it was abandoned")
        assert step.logs == ("started",) and run.writes == [] and "prompts" not in run.rows
        loaded = store.run(run.run_id)
        assert loaded.steps[0].error == step.error and loaded.steps[0].logs == ("started",)
        assert store.sql("SELECT count(*) FROM writes").fetchall() == [(0,)]
        assert store.sql("SELECT count(*) FROM prompts").fetchall() == [(0,)]


def test_an_async_stage_past_its_timeout_is_cancelled():
    cancelled = []

    async def waits(s):
        s.before = 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        s.after = 2

    async def own_timeout(s):
        raise TimeoutError("the stage's own timeout")  # not mistaken for the stage timeout

    run = Pipeline("a", Slow).then(waits, timeout=0.1).build().run({}, raise_on_error=False)
    assert run.status == "failed" and cancelled == [True]
    assert "stage 'waits' timed out after 0.1 s" in run.steps[0].error and "cancelled" in run.steps[0].error
    own = Pipeline("b", Slow).then(own_timeout, timeout=5).build().run({}, raise_on_error=False)
    assert own.steps[0].error == "TimeoutError: the stage's own timeout"


def test_a_stage_within_its_timeout_runs_as_usual_and_raises_stage_timeout_when_not():
    flow = Pipeline("ok", Slow).then(lambda s: setattr(s, "after", 5), id="quick", timeout=5).build()
    run = flow.run({})
    assert run.ok and run.output.after == 5 and run.writes[0].path == "after"
    gate = threading.Event()
    stuck = Pipeline("stuck", Slow).then(lambda s: gate.wait(30), id="stuck", timeout=0.05).build()
    with pytest.raises(Exception) as info:
        stuck.run({})
    gate.set()
    assert isinstance(info.value.__cause__, StageTimeout) and isinstance(info.value.__cause__, TimeoutError)
    for bad in (0, -1, float("inf"), "1", True):
        with pytest.raises(PipelineError, match="timeout must be a number of seconds > 0"):
            Pipeline("bad", Slow).then(lambda s: None, id="x", timeout=bad)


# -- values the record cannot hold, named -------------------------------------------------------------------


class Anything(BaseModel):
    data: Any = None
    items: list = []


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth, limit", [(300, "JSON serialization's limit is 254"),
                                          (5000, "Python's recursion limit")])
def test_a_value_nested_too_deep_names_the_field_and_the_limit(depth, limit):
    def deep(s):
        s.data = nested(depth)

    def deep_append(s):
        s.items.append(nested(depth))

    for fn, field in ((deep, "data"), (deep_append, "items")):  # set, and an in-place append
        run = Pipeline("deep", Anything).then(fn).build().run({}, raise_on_error=False)
        error = run.steps[0].error
        assert error.startswith(f"stage '{fn.__name__}' wrote an invalid value to '{field}'"), error
        assert f"nested {depth + 1} levels deep" in error  # `depth` wrappings around an empty list
        assert limit in error and "at most 254 levels" in error


def test_a_value_that_contains_itself_names_the_field():
    def loop(s):
        d: dict = {"name": "x"}
        d["self"] = d
        s.data = {"outer": d}

    run = Pipeline("loop", Anything).then(loop).build().run({}, raise_on_error=False)
    assert run.steps[0].error.startswith("stage 'loop' wrote an invalid value to 'data'")
    assert "contains itself (a circular reference)" in run.steps[0].error
    with pytest.raises(RunFailed) as info:
        Pipeline("loop", Anything).then(loop).build().run({})
    assert isinstance(info.value.__cause__, ScopeWriteError) and info.value.__cause__.path == "data"


@pytest.mark.parametrize("durability", [None, "run", "stage"])
def test_a_row_for_a_table_the_store_does_not_have_fails_its_stage_where_it_is_emitted(tmp_path, durability):
    """Refused by `ctx.emit` itself (with or without a store): the stage fails naming the table, the run is
    recorded failed with what came before it, and nothing of the unknown table is written."""
    class S(BaseModel):
        n: int = 0

    def first(s: S) -> None:
        s.n = 1

    def typo(s: S, ctx) -> None:
        ctx.emit("model_call", model="m")  # (the table is model_calls)
        s.n = 2

    flow = Pipeline("typo", S).then(first).then(typo).build()
    if durability is None:
        with pytest.raises(RunFailed, match="stage 'typo' emitted a row for unknown table 'model_call'; known: "):
            flow.run({})
        return
    with Store(str(tmp_path / "t.duckdb"), durability=durability) as store:
        run = flow.run({}, store=store, raise_on_error=False)
        assert run.status == "failed" and "unknown table 'model_call'" in run.error
        loaded = store.run(run.run_id)
        assert loaded.status == "failed" and [s.status for s in loaded.steps] == ["ok", "failed"]
        assert loaded.state_at().n == 1
        assert store.sql("SELECT count(*) FROM model_calls").fetchall() == [(0,)]
