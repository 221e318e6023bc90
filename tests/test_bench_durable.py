"""bench/durable_candidates.py runs and prints every table it promises. No timing is asserted."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_durable_candidates_prints_its_tables(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "bench/durable_candidates.py", "--quick", "--dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for heading in ("## floors", "## per stage, process-crash safe", "## per stage, power-loss safe",
                    "## per 10-stage run (flush_interval=0), amortised per stage"):
        assert heading in out
    for label in ("os.write 200 B, O_APPEND", "the fsync floor", "sqlite3 WAL INSERT+commit, synchronous=NORMAL",
                  "DuckDB INSERT+commit (file)", "(a) segment log: LogCodec + append", "preallocated",
                  "encode a step entry: hand-rolled struct", "fsync floor (append + fdatasync):"):
        assert label in out
    assert list(tmp_path.iterdir()) == []  # the bench cleans up after itself
