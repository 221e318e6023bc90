"""extract_memories against a local OpenAI-compatible server that enforces structured-output strict mode.

The server (real HTTP on 127.0.0.1) refuses, with OpenAI's HTTP 400 and message shape, any `strict: true`
schema outside the documented subset: the root an object and not `anyOf`; every object with
`additionalProperties: false` and every property in `required`; only the supported keywords (no `default`,
`minLength`, `maxLength`, ...; fine-tuned models also refuse `minimum`/`maximum`/`pattern`/...); at most 10
levels of nesting and 5000 properties. It answers only with content that conforms to the schema, as the real
one guarantees. A model without structured outputs gets OpenAI's 400 for `response_format`.
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Optional

import pytest

from stages import AgentScope, extract_memories
from stages.extract import EXTRACTION_SCHEMA, ExtractedFact, ExtractedFacts
from tracemem import Pipeline
from tracemem.models import ModelError, OpenAICompatibleModel
from tracemem.store import Store

SUBJECT = "dana"
KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "description", "title", "enum",
            "const", "anyOf", "$ref", "$defs", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
            "exclusiveMaximum", "multipleOf", "minItems", "maxItems"}
NOT_FOR_FINE_TUNED = {"pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                      "multipleOf", "minItems", "maxItems"}
TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
NO_STRUCTURED_OUTPUTS = {"gpt-3.5-turbo"}


class InvalidSchema(Exception):
    pass


def check_strict(schema: Any, *, fine_tuned: bool = False) -> None:
    """Raise InvalidSchema, worded like OpenAI, if `schema` is outside the strict-mode subset."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or "anyOf" in schema:
        raise InvalidSchema("In context=(), schema must be a JSON Schema of 'type: \"object\"', got a different "
                            "type or 'anyOf' at the root.")
    allowed = KEYWORDS - NOT_FOR_FINE_TUNED if fine_tuned else KEYWORDS
    counts = {"properties": 0}
    for name, sub in (schema.get("$defs") or {}).items():
        _check(sub, ("$defs", name), schema, allowed, 0, counts)
    _check(schema, (), schema, allowed, 0, counts)


def _check(node: Any, path: tuple, root: dict, allowed: set, depth: int, counts: dict) -> None:
    where = f"In context={path!r},"
    if not isinstance(node, dict):
        raise InvalidSchema(f"{where} schema must be an object.")
    for key in node:
        if key not in allowed:
            raise InvalidSchema(f"{where} '{key}' is not permitted.")
    if "$defs" in node and path:
        raise InvalidSchema(f"{where} '$defs' is only permitted at the root.")
    if "$ref" in node:
        ref = node["$ref"]
        if not (isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in (root.get("$defs") or {})):
            raise InvalidSchema(f"{where} reference {ref!r} cannot be resolved.")
        return
    if "anyOf" in node:
        for i, variant in enumerate(node["anyOf"]):
            _check(variant, path + ("anyOf", i), root, allowed, depth, counts)
        return
    if "type" not in node:
        if "enum" in node or "const" in node:
            return
        raise InvalidSchema(f"{where} schema must have a 'type' key.")
    types = [node["type"]] if isinstance(node["type"], str) else node["type"]
    for kind in types:
        if kind not in TYPES:
            raise InvalidSchema(f"{where} {kind!r} is not a valid type.")
    if "object" in types:
        if depth >= 10:
            raise InvalidSchema(f"{where} objects may be nested at most 10 levels deep.")
        if node.get("additionalProperties") is not False:
            raise InvalidSchema(f"{where} 'additionalProperties' is required to be supplied and to be false.")
        properties, required = node.get("properties") or {}, node.get("required")
        missing = [k for k in properties if not isinstance(required, list) or k not in required]
        if missing or not isinstance(required, list):
            raise InvalidSchema(f"{where} 'required' is required to be supplied and to be an array including "
                                f"every key in properties. Missing {missing[0] if missing else 'required'!r}.")
        extra = [k for k in required if k not in properties]
        if extra:
            raise InvalidSchema(f"{where} Extra required key {extra[0]!r} supplied.")
        counts["properties"] += len(properties)
        if counts["properties"] > 5000:
            raise InvalidSchema(f"{where} a schema may have at most 5000 object properties in total.")
        for key, sub in properties.items():
            _check(sub, path + ("properties", key), root, allowed, depth + 1, counts)
    if "array" in types:
        if "items" not in node:
            raise InvalidSchema(f"{where} 'items' is required for arrays.")
        _check(node["items"], path + ("items",), root, allowed, depth, counts)


def conforms(value: Any, node: dict, root: dict) -> bool:
    """Does `value` match a strict schema (the subset above)? The server never sends what does not."""
    if "$ref" in node:
        return conforms(value, root["$defs"][node["$ref"][8:]], root)
    if "anyOf" in node:
        return any(conforms(value, variant, root) for variant in node["anyOf"])
    if "enum" in node and value not in node["enum"]:
        return False
    types = [node["type"]] if isinstance(node.get("type"), str) else node.get("type") or []
    checks = {"string": lambda v: isinstance(v, str), "null": lambda v: v is None,
              "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "array": lambda v: isinstance(v, list) and all(conforms(i, node["items"], root) for i in v),
              "object": lambda v: isinstance(v, dict) and set(v) == set(node.get("properties") or {})
              and all(conforms(v[k], s, root) for k, s in (node.get("properties") or {}).items())}
    return any(checks[kind](value) for kind in types)


class StrictServer:
    """What the test scripts (the reply content) and what the server saw (the request bodies)."""

    def __init__(self) -> None:
        self.url = ""
        self.fine_tuned = False
        self.enforce = True  # False: a server without structured outputs, which ignores response_format
        self.content: Any = {"facts": []}
        self.requests: list[dict[str, Any]] = []
        self.answers: list[tuple[int, dict[str, Any]]] = []

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(body)
        self.answers.append(self._answer(body))
        return self.answers[-1]

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        fmt = body.get("response_format") or {}
        if self.enforce and fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema") or {}
            if body.get("model") in NO_STRUCTURED_OUTPUTS:
                return 400, error("Invalid parameter: 'response_format' of type 'json_schema' is not supported "
                                  "with this model.", "response_format")
            name = spec.get("name")
            if not isinstance(name, str) or not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
                return 400, error("Invalid 'response_format.json_schema.name': string does not match pattern.",
                                  "response_format.json_schema.name")
            if spec.get("strict") is True:
                try:
                    check_strict(spec.get("schema"), fine_tuned=self.fine_tuned)
                except InvalidSchema as err:
                    return 400, error(f"Invalid schema for response_format '{name}': {err}", "response_format")
                if not conforms(self.content, spec["schema"], spec["schema"]):
                    return 500, error(f"test setup: the scripted content does not match the schema the client "
                                      f"sent: {self.content!r}", None)
        text = self.content if isinstance(self.content, str) else json.dumps(self.content)
        return 200, {"id": "chatcmpl-test", "object": "chat.completion", "model": body.get("model"),
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": text, "refusal": None}}],
                     "usage": {"prompt_tokens": 42, "completion_tokens": 17, "total_tokens": 59}}


def error(message: str, param: Optional[str]) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}


@pytest.fixture
def server() -> Iterator[StrictServer]:
    state = StrictServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/chat/completions":
                status, body = 404, error(f"Unknown path {self.path}", None)
            else:
                status, body = state.answer(json.loads(raw))
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=2)


class Turn(AgentScope):
    extraction: dict[str, Any] = {}


def run_extraction(server: StrictServer, store: Store, model: str = "gpt-4o-mini", durability: Optional[str] = None,
                   question: str = "I'm vegetarian and I moved to Lyon.", **options: Any) -> Any:
    chat = OpenAICompatibleModel(server.url, model, api_key="sk-test", max_retries=0)
    flow = Pipeline("chat", Turn).then(extract_memories(chat, into="extraction", **options)).build()
    return flow.run({"question": question, "answer": "Noted!", "turn_id": "t1"},
                    store=store, subject=SUBJECT, durability=durability)


FACTS = {"facts": [{"fact": "User is vegetarian", "score": 0.9, "tags": ["diet"], "supersedes": None},
                   {"fact": "User lives in Lyon", "score": 0.85, "tags": [], "supersedes": None}]}


# -- the server enforces the rules ---------------------------------------------------------------------

def deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        node = {"type": "object", "additionalProperties": False, "required": ["x"], "properties": {"x": node}}
    return node


BROKEN = {
    "pydantic's own schema": (ExtractedFacts.model_json_schema(), "'additionalProperties' is required"),
    "optional property": ({"type": "object", "additionalProperties": False, "required": ["a"],
                           "properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
                          "Missing 'b'"),
    "open nested object": ({"type": "object", "additionalProperties": False, "required": ["a"],
                            "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {},
                                                                            "required": []}}}},
                           "In context=('properties', 'a', 'items'), 'additionalProperties'"),
    "a default": ({"type": "object", "additionalProperties": False, "required": ["a"],
                   "properties": {"a": {"type": "array", "items": {"type": "string"}, "default": []}}},
                  "'default' is not permitted"),
    "minLength": ({"type": "object", "additionalProperties": False, "required": ["a"],
                   "properties": {"a": {"type": "string", "minLength": 1}}}, "'minLength' is not permitted"),
    "root anyOf": ({"type": "object", "anyOf": [{"type": "object"}]}, "'anyOf' at the root"),
    "array root": ({"type": "array", "items": {"type": "string"}}, "type: \"object\""),
    "too deep": (deep(11), "at most 10 levels"),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_the_server_refuses_what_openai_strict_mode_refuses(server, kind):
    schema, message = BROKEN[kind]
    chat = OpenAICompatibleModel(server.url, "gpt-4o-mini", max_retries=0)
    with pytest.raises(ModelError) as caught:
        chat.complete([{"role": "user", "content": "hi"}], schema=dict(schema, title="reply"))
    assert caught.value.status == 400 and caught.value.kind == "status" and "HTTP 400" in str(caught.value)
    [(status, body)] = server.answers
    assert status == 400 and body["error"]["param"] == "response_format"
    assert body["error"]["message"].startswith("Invalid schema for response_format 'reply': ")
    assert message in body["error"]["message"]


def test_the_server_refuses_the_pydantic_model_the_stage_used_to_send(server):
    chat = OpenAICompatibleModel(server.url, "gpt-4o-mini", max_retries=0)
    with pytest.raises(ModelError, match="HTTP 400"):
        chat.complete([{"role": "user", "content": "hi"}], schema=ExtractedFacts)
    [(_, body)] = server.answers
    assert body["error"]["message"] == ("Invalid schema for response_format 'ExtractedFacts': In context=('$defs', "
                                        "'ExtractedFact'), 'additionalProperties' is required to be supplied and to "
                                        "be false.")


def test_the_server_accepts_openais_documented_example(server):
    example = {"type": "object", "additionalProperties": False, "required": ["location", "unit"],
               "properties": {"location": {"type": "string", "description": "The location"},
                              "unit": {"type": ["string", "null"], "enum": ["F", "C", None]}}}
    server.content = {"location": "Lyon", "unit": None}
    reply = OpenAICompatibleModel(server.url, "gpt-4o-mini").complete([{"role": "user", "content": "hi"}],
                                                                       schema=dict(example, title="weather"))
    assert json.loads(reply.text) == {"location": "Lyon", "unit": None}


# -- the stage's schema passes --------------------------------------------------------------------------

@pytest.mark.parametrize("fine_tuned", [False, True])
def test_extraction_works_against_a_strict_server(server, fine_tuned):
    server.fine_tuned, server.content = fine_tuned, FACTS
    store = Store(":memory:")
    run = run_extraction(server, store)
    assert run.status == "ok" and run.output.extraction["error"] is None
    assert [m.text for m in store.memory.list(SUBJECT)] == ["User is vegetarian", "User lives in Lyon"]
    assert run.degraded is None and "degraded" not in run.output.extraction
    assert store.runs()[0]["degraded"] is None
    [request] = server.requests
    fmt = request["response_format"]
    assert fmt == {"type": "json_schema", "json_schema": {"name": "extracted_facts", "schema": EXTRACTION_SCHEMA,
                                                          "strict": True}}
    [(error, response)] = store.sql("SELECT error, response FROM model_calls WHERE run_id = ?",
                                    [run.run_id]).fetchall()
    assert error is None and json.loads(response) == FACTS


def test_the_strict_schema_describes_the_pydantic_model():
    item = EXTRACTION_SCHEMA["properties"]["facts"]["items"]
    assert list(item["properties"]) == list(ExtractedFact.model_fields) == item["required"]
    assert list(EXTRACTION_SCHEMA["properties"]) == list(ExtractedFacts.model_fields)
    check_strict(EXTRACTION_SCHEMA, fine_tuned=True)
    check_strict(deep(10))
    # what strict mode leaves out (length and range bounds) pydantic still enforces on the reply
    assert ExtractedFacts.model_validate(FACTS).facts[0].fact == "User is vegetarian"
    with pytest.raises(ValueError):
        ExtractedFacts.model_validate({"facts": [{"fact": "", "score": 2, "tags": [], "supersedes": None}]})


def test_a_model_update_with_a_null_supersedes_and_a_real_id(server):
    store = Store(":memory:")
    old = store.memory.remember(SUBJECT, "User lives in Paris", confidence=80)
    server.content = {"facts": [{"fact": "User lives in Lyon", "score": 0.9, "tags": ["home"],
                                 "supersedes": old.memory_id}]}
    run = run_extraction(server, store, question="I moved from Paris to Lyon last month.")
    assert f"- {old.memory_id}: User lives in Paris" in server.requests[0]["messages"][0]["content"]
    [entry] = run.output.extraction["stored"]
    assert entry["supersedes"] == old.memory_id and store.memory.get(old.memory_id).review_state == "contradicted"


# -- a refused request is visible beyond the step log ------------------------------------------------

@pytest.mark.parametrize("durability", ["run", "stage"])
def test_a_400_marks_the_step_degraded_and_reaches_on_error(server, tmp_path, durability):
    server.content = FACTS
    path = tmp_path / "agent.duckdb"
    store = Store(str(path))
    errors: list[BaseException] = []
    run = run_extraction(server, store, model="gpt-3.5-turbo", on_error=errors.append, durability=durability)
    # the run succeeds without its memories ...
    assert run.status == "ok" and store.memory.list(SUBJECT) == []
    # ... and says so: on_error, the step log, the run marked degraded (ctx.degrade), an error span, the report
    [err] = errors
    assert isinstance(err, ModelError) and err.status == 400 and "not supported with this model" in str(err)
    step = run.step("extract_memories")
    assert step.status == "ok" and any(line.startswith("extract_memories failed: ModelError: ") and "HTTP 400" in line
                                       for line in step.logs)
    marker = run.output.extraction["degraded"]
    assert marker == {"stage": "extract_memories", "reason": marker["reason"], "error_type": "ModelError",
                      "http_status": 400}
    assert marker["reason"].startswith("memory extraction failed: ModelError: ") and "HTTP 400" in marker["reason"]
    assert run.degraded == f"extract_memories: {marker['reason']}"
    [span] = [s for s in run.rows["_span"] if s["name"] == "extract_memories failed"]
    assert span["attributes"]["error.type"] == "ModelError" and span["attributes"]["tracemem.degraded"] is True
    # the refused call is on disk with its error, so SQL finds it after the process is gone
    store.close()
    reopened = Store(str(path))
    [(status,)] = reopened.sql("SELECT status FROM runs WHERE run_id = ?", [run.run_id]).fetchall()
    [(model, error)] = reopened.sql("SELECT model, error FROM model_calls WHERE run_id = ?",
                                    [run.run_id]).fetchall()
    assert status == "ok" and model == "gpt-3.5-turbo" and "HTTP 400" in error
    # the run listing says it is degraded, and why
    [listed] = reopened.runs()
    assert listed["status"] == "ok" and listed["degraded"] == run.degraded
    assert reopened.run(run.run_id).degraded == run.degraded
    reopened.close()


def test_a_bad_reply_is_degraded_without_an_http_status(server):
    server.enforce, server.content = False, "Sure! Here are the facts: none"  # a lenient server says anything
    store = Store(":memory:")
    chat = OpenAICompatibleModel(server.url, "local-llama", max_retries=0)
    flow = Pipeline("chat", Turn).then(extract_memories(chat, into="extraction")).build()
    run = flow.run({"question": "I'm vegetarian", "answer": "Noted!"}, store=store, subject=SUBJECT)
    marker = run.output.extraction["degraded"]
    assert run.status == "ok" and marker["error_type"] == "TracememError" and marker["http_status"] is None
    assert "invalid JSON" in marker["reason"] and "invalid JSON" in run.degraded


def test_a_failed_extraction_is_an_error_span_in_opentelemetry(server):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode


    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    chat = OpenAICompatibleModel(server.url, "gpt-3.5-turbo", max_retries=0)
    flow = Pipeline("chat", Turn).then(extract_memories(chat)).build()
    run = flow.run({"question": "I'm vegetarian", "answer": "Noted!"}, store=Store(":memory:"), subject=SUBJECT,
                   tracer_provider=provider)
    [span] = [s for s in exporter.get_finished_spans() if s.name == "extract_memories failed"]
    assert span.status.status_code == StatusCode.ERROR and span.attributes["error.type"] == "ModelError"
    assert span.attributes["http.response.status_code"] == 400 and span.attributes["tracemem.degraded"] is True
    assert span.attributes["tracemem.run_id"] == run.run_id and run.status == "ok"
