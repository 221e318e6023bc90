"""The README alone suffices to build the demo's agent: every name, method, attribute and
keyword the demo takes from tracemem and stages appears in the README's code, and so do the things a
newcomer went looking for (the env keys, trace.sources, trace.runs, source_ref, the projections)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic import BaseModel

import stages
import tracemem
from stages import AgentScope
from stages.snapshot import PROJECTIONS
from tracemem import Pipeline
from tracemem.store import Store

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "stages" / "demo.py"
# Names the demo imports only to print its story, not to build or run the agent.
PRESENTATION = {"table"}


def readme_code() -> str:
    """The README's code: fenced blocks and `inline` spans."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    rest = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    return "\n".join(blocks + re.findall(r"`([^`]+)`", rest))


def imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("tracemem")):
            names |= {a.asname or a.name for a in node.names}
    return names - PRESENTATION


class _S(BaseModel):
    question: str = ""
    answer: str = ""


def _api_attributes() -> set[str]:
    """Public attributes of the objects a user of the demo's agent handles: store, memory, flow, run, trace."""
    store = Store(":memory:")
    flow = Pipeline("p", _S).then(lambda s: setattr(s, "answer", s.question)).build()
    run = flow.run({"question": "q"}, store=store)
    objects = [store, store.memory, flow, run, run.backtrack("answer"), Pipeline("p", _S)]
    attrs = {a for o in objects for a in dir(o) if not a.startswith("_")}
    store.close()
    return attrs | set(AgentScope.model_fields)


def test_every_name_the_demo_takes_from_tracemem_and_stages_is_in_the_readme():
    tree = ast.parse(DEMO.read_text())
    code = readme_code()
    names = imported_names(tree)
    assert {"Pipeline", "decide", "ScriptedModel", "Store", "AgentScope", "recall", "load_snapshot",
            "assemble_prompt", "call_model", "extract_memories"} <= names
    missing = [n for n in sorted(names) if not re.search(rf"\b{n}\b", code)]
    assert not missing, f"the demo uses {missing}, which the README's code never shows"

    api = _api_attributes()
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & api
    assert {"sql", "backtrack", "influence", "sources", "explain", "flag", "memory", "output"} <= attrs
    missing = [a for a in sorted(attrs) if not re.search(rf"\.{a}\b", code)]
    assert not missing, f"the demo uses .{missing}, which the README's code never shows"

    keywords = set()
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        func = call.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if called in names or called in api:
            keywords |= {k.arg for k in call.keywords if k.arg}
    assert {"query", "projection", "threshold", "instructions", "subject", "env", "store", "focus"} <= keywords
    missing = [k for k in sorted(keywords) if not re.search(rf"\b{k}=", code)]
    assert not missing, f"the demo passes {missing}=, which the README's code never shows"


def test_the_readme_names_what_a_newcomer_looked_for():
    text = (ROOT / "README.md").read_text()
    code = readme_code()
    for needle in ('env["model"]', 'env["extractor"]', "trace.sources(", "trace.runs()", "source_ref",
                   'query="question"', "ctx.degrade(", "duration_ms"):
        assert needle in code, needle
    for projection in PROJECTIONS:
        assert f'"{projection}"' in code, projection
    # the stages the demo's agent is built from are each described, by name, in the stages section
    section = text.split("### Agent stages (`stages`)", 1)[1].split("\n## ", 1)[0]
    for name in stages.__all__:
        if name not in ("install_extraction", "reads_as_instruction"):
            assert f"`{name}" in section, name
    assert tracemem.__all__  # the engine's public names are the README's vocabulary, not private modules
