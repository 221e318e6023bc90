"""What the whole suite shares: the figures some tests report to the reader, printed once at the end of a run.

Why here: pytest captures a test's own output, and under pytest-xdist (`make test` runs two workers) even
output printed with capture disabled stays in the worker process. A test records what it reports with
`record_property("shown", text)`; the property travels with the test's report to the main process, which prints
it below, however the suite ran (tests/test_instruction_filter.py prints its catch rates this way).
"""
from __future__ import annotations

import os
import tempfile
from typing import Any

# Secret fields are hashed with a key kept outside the store (tracemem/masking.py), made in the user's config
# folder on first use: the suite uses a folder of its own, never the user's (subprocesses inherit it).
os.environ["TRACEMEM_CONFIG_DIR"] = tempfile.mkdtemp(prefix="tracemem-tests-config-")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    shown = sorted((report.nodeid, value) for reports in terminalreporter.stats.values() for report in reports
                   if getattr(report, "when", None) == "call"
                   for name, value in getattr(report, "user_properties", ()) if name == "shown")
    if shown:
        terminalreporter.section("what the tests report")
        for _, text in shown:
            terminalreporter.write_line(text)
