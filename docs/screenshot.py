"""Regenerate the README's pictures of the viewer (`make screenshot`).

docs/ui-why.png: a tool agent's wrong answer (tests/why_scenario.py: a planted memory among four decoys,
tool results and a person's approval) on its backtrack page — the "why" list and the folded graph.
docs/ui-backtrack.png: the demo's wrong answer, its full graph focused on the memory that caused it.
Each runs into a fresh file, starts `tracemem ui` on it, and has the system's headless Chromium
(Debian's chromium and chromium-driver) photograph the page.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from uiharness import chromium, missing_browser, serve_ui  # noqa: E402

import why_scenario  # noqa: E402
from stages.demo import run_demo  # noqa: E402
from tracemem.store import Store  # noqa: E402


def why_shot(out: Path = ROOT / "docs" / "ui-why.png") -> None:
    """The tool agent's backtrack page: its causes first, then the folded graph."""
    folder = tempfile.mkdtemp(prefix="tracemem-screenshot-")
    db = os.path.join(folder, "agent.duckdb")
    with Store(db) as store:
        wrong = why_scenario.play(store)["wrong"].run_id
    with serve_ui("agent.duckdb", cwd=folder) as url, chromium(1440, 1240) as browser:
        browser.get(f"{url}runs/{wrong}/backtrack?path=answer")
        time.sleep(0.5)  # fonts settle
        browser.save_screenshot(str(out))
    print(f"wrote {out.relative_to(ROOT)} (run {wrong[:8]})")


def main(out: Path = ROOT / "docs" / "ui-backtrack.png") -> None:
    reason = missing_browser()
    if reason:
        raise SystemExit(f"cannot take the screenshot: {reason}")
    folder = tempfile.mkdtemp(prefix="tracemem-screenshot-")
    db = os.path.join(folder, "demo.duckdb")
    run_demo(db, fresh=True, out=io.StringIO())
    with Store(db, read_only=True) as store:
        wrong = store.sql("SELECT run_id FROM runs WHERE json_extract_string(output, '$.answer') LIKE '%approved%'"
                          ).fetchall()[0][0]
        memory = store.sql("SELECT memory_id FROM memories WHERE text LIKE '%365 days%'").fetchall()[0][0]
    with serve_ui("demo.duckdb", cwd=folder) as url, chromium(1440, 1000) as browser:
        browser.get(f"{url}runs/{wrong}/backtrack?path=answer&full=1&focus=m:{memory}")
        time.sleep(0.5)  # fonts settle
        browser.save_screenshot(str(out))
    print(f"wrote {out.relative_to(ROOT)} (run {wrong[:8]}, memory {memory})")


if __name__ == "__main__":
    why_shot()
    main()
