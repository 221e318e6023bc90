"""Regenerate docs/phoenix-trace.png: the README's Phoenix recipe, seen in Arize Phoenix.

Starts Phoenix on 127.0.0.1 from its own virtualenv (`make phoenix`; tests/phoenix_server.py), runs
the README's "See your runs in Phoenix" recipe against it, and has the system's headless Chromium
(Debian's chromium and chromium-driver) photograph the second turn's trace with its model call
selected: the whole conversation that call was sent.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from phoenix_server import missing_phoenix, phoenix  # noqa: E402
from uiharness import chromium, missing_browser  # noqa: E402

PROJECT = "support-agent"


def main(out: Path = ROOT / "docs" / "phoenix-trace.png") -> None:
    reason = missing_browser() or missing_phoenix()
    if reason:
        raise SystemExit(f"cannot take the screenshot: {reason}")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    [recipe] = [b for b in blocks if "OTLPSpanExporter" in b]
    folder = Path(tempfile.mkdtemp(prefix="tracemem-phoenix-shot-"))
    (folder / "recipe.py").write_text(recipe)
    with phoenix() as server:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": server.traces_url,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, str(folder / "recipe.py")], cwd=folder, env=env, check=True)
        for _ in range(60):
            seen = server.query(PROJECT)
            if len(seen["spans"]) >= 20:
                break
            time.sleep(1)
        llm = max((s for s in seen["spans"] if s["span_kind"] == "LLM"),
                  key=lambda s: sum(k.startswith("llm.input_messages.") for k in s["attributes"]))
        project_id = project_of(server.url)
        page = f"{server.url}/projects/{project_id}/traces/{llm['trace_id']}?selectedSpanNodeId={llm['id']}"
        with chromium(1500, 1100) as browser:
            browser.get(page)
            deadline = time.monotonic() + 90  # the trace view loads its spans, then the selected span's messages
            while "Where did order A7 go?" not in browser.page_source and time.monotonic() < deadline:
                time.sleep(1)
            time.sleep(2)  # fonts and layout settle
            browser.save_screenshot(str(out))
    print(f"wrote {out.relative_to(ROOT)} ({page})")


def project_of(url: str) -> str:
    """The id Phoenix gave the recipe's project (its REST API)."""
    with urllib.request.urlopen(f"{url}/v1/projects") as answer:
        projects = json.load(answer)["data"]
    return next(p["id"] for p in projects if p["name"] == PROJECT)


if __name__ == "__main__":
    main()
