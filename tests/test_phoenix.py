"""The README's "See your runs in Phoenix" recipe against a real Arize Phoenix (slow: it starts the server).

The recipe runs as pasted (a tool agent with memory recall, two turns of one thread), exporting over
OTLP/HTTP to a Phoenix started on 127.0.0.1 from its own virtualenv (tests/phoenix_server.py); what
Phoenix then shows is read through its own client: LLM spans with every input message, one session
holding both turns, a RETRIEVER span with its document, and no span of kind UNKNOWN.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phoenix_server import missing_phoenix, phoenix

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "support-agent"


def recipe() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    [block] = [b for b in blocks if "OTLPSpanExporter" in b]
    return block


@pytest.mark.slow
def test_a_tool_agents_trace_shows_whole_in_phoenix(tmp_path):
    reason = missing_phoenix()
    if reason:
        if os.environ.get("TRACEMEM_REQUIRE_PHOENIX"):
            pytest.fail(reason)
        pytest.skip(reason)
    script = tmp_path / "recipe.py"
    script.write_text(recipe())
    with phoenix() as server:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": server.traces_url})
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 60
        while True:  # Phoenix ingests in the background
            seen = server.query(PROJECT)
            if len(seen["spans"]) >= 20 and seen["sessions"] or time.monotonic() > deadline:
                break
            time.sleep(1)
    spans = seen["spans"]
    kinds = {s["span_kind"] for s in spans}
    assert "UNKNOWN" not in kinds and {"AGENT", "CHAIN", "TOOL", "LLM", "RETRIEVER"} <= kinds, kinds
    llm = [s for s in spans if s["span_kind"] == "LLM"]
    assert len(llm) == 3
    # the second turn's call was sent the whole conversation, and Phoenix shows every message of it
    last = max(llm, key=lambda s: sum(k.startswith("llm.input_messages.") for k in s["attributes"]))
    attrs = last["attributes"]
    roles = [attrs.get(f"llm.input_messages.{i}.message.role") for i in range(7)]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", None]
    assert attrs["llm.input_messages.1.message.content"] == "Where did order A7 go?"
    assert attrs["llm.input_messages.2.message.tool_calls.0.tool_call.function.name"] == "lookup_order"
    assert "Lisbon office" in attrs["llm.input_messages.3.message.content"]
    assert attrs["llm.input_messages.5.message.content"] == "Thanks!"
    assert attrs["gen_ai.input.messages"] and attrs["gen_ai.system_instructions"]
    # one session groups the thread's two turns (two traces)
    [session] = seen["sessions"]
    roots = [s for s in spans if not s["parent_id"]]
    assert len(roots) == 2 and sorted(session["traces"]) == sorted(s["trace_id"] for s in roots)
    assert {s["attributes"]["session.id"] for s in roots} == {session["session_id"]}
    # recall is a RETRIEVER span with the memory it found
    found = [s for s in spans if s["span_kind"] == "RETRIEVER"
             and "retrieval.documents.0.document.id" in s["attributes"]]
    assert len(found) == 1
    document = found[0]["attributes"]
    assert document["retrieval.documents.0.document.id"].startswith("m_")
    assert document["retrieval.documents.0.document.content"] == "Ana's orders ship to her Lisbon office"
    assert 0 < document["retrieval.documents.0.document.score"] <= 1
