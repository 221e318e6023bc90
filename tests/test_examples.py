"""Every example runs, as a user would run it: `python examples/<name>.py` exits 0 and prints its story."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# A line (or two) each example must print: what it exists to show.
EXPECTED = {
    "support_agent.py": ["Biscuit is allergic to it", "section [Memory] line 1", "↞ extracted in run"],
    "learns_across_runs.py": ["route: network", "loaded as a snapshot", "routed from experience"],
    "remembers_across_sessions.py": ["rejected 1", "superseded by", "from Lisbon"],
    "credit_decision.py": ["because 'debt-to-income above 43%'", "(default)"],
    "tool_agent.py": ["delivered to the Lisbon office", "track_parcel({})  bad_arguments", "tool call lookup_order(",
                      "section [Memory] line 1", "exceeded max_iterations=3"],
    "streaming_chat.py": ["[requested lookup_order] [finished lookup_order] Order A7 has shipped", "Order B2"],
    "subflow.py": ["rejected: scam", "parent"],
    "sql_recipes.py": ["Slowest stages", "lookup_order", "contradicted", "flagged"],
    "approval.py": ["is paused at stage 'approve'", "model calls in process 2: 0", "human input by maria",
                    "2 approve (paused), 3 approve (ok)"],
}


def test_the_examples_are_there():
    names = {p.name for p in EXAMPLES}
    assert set(EXPECTED) <= names, sorted(set(EXPECTED) - names)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path.name} needs a module docstring saying what it shows"
    assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), f"{path.name} needs main()"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEMEM_DB": str(tmp_path / "never-used.duckdb")}
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{path.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{path.name} printed nothing"
    for text in EXPECTED.get(path.name, []):
        assert text in done.stdout, f"{path.name} should print {text!r}"
    assert list(tmp_path.iterdir()) == [], f"{path.name} left files in the working directory"
