"""Every Python code block in the README runs, in order, in a fresh interpreter."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from otlp_receiver import OTLPReceiver

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_code() -> None:
    assert len(python_blocks()) >= 5


def test_every_python_block_runs(tmp_path: Path) -> None:
    # the OpenTelemetry recipe exports to a real OTLP receiver (what Phoenix or any backend is sent)
    with OTLPReceiver() as receiver:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url}
        for i, block in enumerate(python_blocks()):
            script = tmp_path / f"block_{i}.py"
            script.write_text(block)
            done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=120, env=env)
            assert done.returncode == 0, f"README block {i} failed:\n{block}\n--- stderr ---\n{done.stderr}"
            assert done.stdout.strip() or "import" in block, f"README block {i} printed nothing"
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
