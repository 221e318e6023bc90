"""bench/tools.py runs and prints its headline lines (no timing is asserted, ever)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tools_bench_prints_its_figures() -> None:
    proc = subprocess.run([sys.executable, "bench/tools.py", "--calls", "200", "--streams", "3", "--runs", "20"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stderr
    for line in ("direct function call (baseline)", "ToolSet.run(call) — raw JSON arguments",
                 "bare http.client first bytes (baseline)", "OpenAICompatibleModel on_token", "goal <= 1 ms",
                 "recording overhead per tool call", "goal <= 50 µs", "flow.stream first TokenDelta event"):
        assert line in proc.stdout
