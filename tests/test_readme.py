"""Every Python code block in the README, and in docs/*.md, runs, in order, each in a fresh interpreter."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from openai_server import Completion, OpenAIServer
from otlp_receiver import OTLPReceiver

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(path: Path = ROOT / "README.md") -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def run_blocks(blocks: list[str], where: str, folder: Path, env: dict[str, str]) -> None:
    for i, block in enumerate(blocks):
        script = folder / f"block_{i}.py"
        script.write_text(block)
        done = subprocess.run([sys.executable, str(script)], cwd=folder, capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 0, f"{where} block {i} failed:\n{block}\n--- stderr ---\n{done.stderr}"
        assert done.stdout.strip() or "import" in block, f"{where} block {i} printed nothing"


def test_readme_has_code() -> None:
    assert len(python_blocks()) >= 5


def test_every_python_block_runs(tmp_path: Path) -> None:
    # the OpenTelemetry recipe exports to a real OTLP receiver (what Phoenix or any backend is sent); the
    # real-model recipe talks to a local OpenAI-compatible server standing in for OpenAI: it asks for the
    # tool, then answers
    with OTLPReceiver() as receiver, OpenAIServer() as llm:
        llm.reply(Completion(text=None, tool_calls=[("call_1", "lookup_order", '{"order_id": "A7"}')]))
        llm.reply(Completion(text="Order A7 shipped to your Lisbon office."))
        env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, "OPENAI_BASE_URL": llm.url,
               "OPENAI_API_KEY": "sk-test-readme", "OPENAI_MODEL": "gpt-4o-mini"}
        run_blocks(python_blocks(), "README", tmp_path, env)
    assert len(llm.requests) == 2 and llm.requests[0]["body"]["model"] == "gpt-4o-mini"
    assert llm.requests[0]["body"]["tools"][0]["function"]["name"] == "lookup_order"
    assert llm.requests[0]["headers"]["Authorization"] == "Bearer sk-test-readme"
    names = {s["name"] for s in receiver.spans}
    assert {"invoke_agent support", "retrieval", "execute_tool lookup_order"} <= names, names
    chats = [s for s in receiver.spans if s["name"].startswith("chat ")]
    assert len(chats) == 3 and all(s["attributes"]["openinference.span.kind"] == "LLM" for s in chats)
    last = max(chats, key=lambda s: len(s["attributes"]))  # the second turn's call: the whole conversation
    assert [last["attributes"][f"llm.input_messages.{i}.message.role"] for i in range(6)] == \
        ["system", "user", "assistant", "tool", "assistant", "user"]
    roots = [s for s in receiver.spans if not s["parent_id"]]
    assert len({s["attributes"]["session.id"] for s in roots}) == 1 and len(roots) == 2
    assert all(s["resource"].get("openinference.project.name") == "support-agent" for s in roots)


def test_readme_starts_with_make_demo_and_make_test() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"]


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_python_block_in_docs_runs(doc: Path, tmp_path: Path) -> None:
    run_blocks(python_blocks(doc), f"docs/{doc.name}", tmp_path, dict(os.environ))


def test_every_docs_page_is_linked_from_the_readme() -> None:
    text = (ROOT / "README.md").read_text()
    assert DOCS and all(f"(docs/{d.name})" in text for d in DOCS), [d.name for d in DOCS]
