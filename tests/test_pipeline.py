"""Building pipelines: validation errors, the graph, Mermaid/spec exports, the content hash."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap

import networkx as nx
import pytest
from pydantic import BaseModel

from tracemem import Pipeline, PipelineError
from tracemem import Flow


class S(BaseModel):
    x: int = 0
    y: int = 0
    route: str = "a"


def think(s):
    """Think about it."""
    s.x = s.x + 1


def route(s):
    return s.route


def tool(s):
    s.y = s.y + 1


def final(s):
    s.y = -1


def other(s):
    s.x = 42


# -- building -------------------------------------------------------------------


def test_linear_build_and_graph():
    flow = Pipeline("lin", S).then(think).then(tool, description="the tool").then(final).build()
    assert isinstance(flow, Flow)
    g = flow.graph
    assert isinstance(g, nx.DiGraph)
    assert list(nx.topological_sort(g)) == ["__start__", "think", "tool", "final", "__end__"]
    assert g.nodes["think"]["description"] == "Think about it."  # first docstring line
    assert g.nodes["tool"]["description"] == "the tool"
    assert g.nodes["think"]["kind"] == "stage"


def test_custom_id_and_name():
    flow = Pipeline("p", S).then(think, id="t1", name="Thinker").then(think, id="t2").build()
    assert flow.graph.nodes["t1"]["name"] == "Thinker"
    assert set(flow.graph.successors("t1")) == {"t2"}


def test_branch_graph_has_labelled_edges():
    flow = Pipeline("p", S).then(think).branch(route, {"a": tool, "b": final}).then(other).build()
    g = flow.graph
    assert g.nodes["route"]["kind"] == "decider"
    labels = {g.edges["route", t]["label"]: t for t in g.successors("route")}
    assert labels == {"a": "tool", "b": "final"}
    assert set(g.successors("tool")) == {"other"} and set(g.successors("final")) == {"other"}


def test_branch_arm_can_be_pipeline_over_same_scope():
    arm = Pipeline("arm", S).then(tool).then(final)
    flow = Pipeline("p", S).branch(route, {"a": arm, "b": other}).build()
    assert set(flow.graph.successors("tool")) == {"final"}


def test_branch_arm_pipeline_with_other_scope_is_rejected():
    class T(BaseModel):
        z: int = 0

    with pytest.raises(PipelineError, match="uses scope T, not S"):
        Pipeline("p", S).branch(route, {"a": Pipeline("arm", T).then(tool)})


def test_fork_and_subflow_nodes_in_graph():
    child = Pipeline("child", S).then(tool).build()
    flow = Pipeline("p", S).fork(think, tool).subflow(child, inputs={"y": "y"}, outputs={"y": "y"}).build()
    g = flow.graph
    fork = "fork(think,tool)"
    assert g.nodes[fork]["kind"] == "fork"
    assert g.nodes["think"]["kind"] == "fork-branch"
    assert g.edges[fork, "think"]["label"] == "parallel"
    assert g.nodes["child"]["kind"] == "subflow"
    assert set(g.successors("think")) == {"child"}


def test_loop_to_graph():
    flow = (Pipeline("agent", S).then(think).branch(route, {"tool": tool, "final": final})
            .loop_to("think", when="tool", max_iterations=3).build())
    g = flow.graph
    loop = "loop→think"
    assert g.nodes[loop]["kind"] == "loop"
    assert g.edges[loop, "think"]["label"] == "loop: tool"
    assert g.edges[loop, "__end__"]["label"] == "exit"


def test_partial_and_callable_object_stages():
    def add(s, n):
        s.x = s.x + n

    class Adder:
        def __call__(self, s, ctx):
            s.x = s.x + 10

    flow = Pipeline("p", S).then(functools.partial(add, n=2)).then(Adder()).build()
    assert [s.stage for s in flow.run({}).steps] == ["add", "Adder"]
    assert flow.run({}).output.x == 12


# -- validation errors ---------------------------------------------------------------


def test_unknown_branch_target_names_stage():
    with pytest.raises(PipelineError, match=r"branch 'route' arm 'b' targets unknown stage 'nowhere'"):
        Pipeline("p", S).then(think).branch(route, {"a": tool, "b": "nowhere"}).build()


def test_unknown_loop_target():
    with pytest.raises(PipelineError, match=r"targets unknown stage 'ghost'"):
        Pipeline("p", S).then(think).branch(route, {"tool": tool, "final": final}).loop_to(
            "ghost", when="tool").build()


def test_unreachable_stage_is_named():
    p = Pipeline("p", S).then(think).branch(route, {"a": "final", "b": "final"}).then(other).then(final)
    with pytest.raises(PipelineError, match=r"stage 'other' is unreachable"):
        p.build()


def test_duplicate_id_is_named():
    with pytest.raises(PipelineError, match=r"duplicate stage id 'think'"):
        Pipeline("p", S).then(think).then(tool).then(think).build()
    with pytest.raises(PipelineError, match=r"duplicate stage id 'tool'"):
        Pipeline("p", S).then(tool).fork(think, tool).build()


def test_loop_without_exit_is_named():
    # every arm of the decider jumps back: no way out
    with pytest.raises(PipelineError, match=r"loop without exit at stage 'route'"):
        Pipeline("p", S).then(think).branch(route, {"again": "think"}).build()
    # loop_to on the only arm of its branch
    with pytest.raises(PipelineError, match=r"loop without exit at stage"):
        Pipeline("p", S).then(think).branch(route, {"tool": tool}).loop_to("think", when="tool").build()


def test_loop_to_key_must_follow_branch():
    with pytest.raises(PipelineError, match=r"must directly follow a .branch"):
        Pipeline("p", S).then(think).then(tool).loop_to("think", when="tool").build()
    with pytest.raises(PipelineError, match=r"arm 'nope'"):
        Pipeline("p", S).then(think).branch(route, {"tool": tool, "final": final}).loop_to(
            "think", when="nope").build()


def test_loop_must_jump_backwards_and_guard_positive():
    with pytest.raises(PipelineError, match="max_iterations >= 1"):
        Pipeline("p", S).then(think).loop_to("think", when=lambda s: False, max_iterations=0)


@pytest.mark.parametrize("fn", [lambda: None, lambda a, b, c: None])
def test_bad_signature(fn):
    with pytest.raises(PipelineError, match=r"must take \(scope\) or \(scope, ctx\)"):
        Pipeline("p", S).then(fn)


def test_not_callable_and_bad_scope_and_empty():
    with pytest.raises(PipelineError, match="must be a function"):
        Pipeline("p", S).then(42)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="BaseModel subclass"):
        Pipeline("p", dict)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="has no stages"):
        Pipeline("p", S).build()
    with pytest.raises(PipelineError, match="no arms"):
        Pipeline("p", S).branch(route, {})
    with pytest.raises(PipelineError, match="at least two"):
        Pipeline("p", S).fork(think)
    with pytest.raises(PipelineError, match="built flow"):
        Pipeline("p", S).subflow(Pipeline("c", S).then(think), inputs={}, outputs={})  # type: ignore[arg-type]


def test_jump_to_fork_branch_is_explained():
    with pytest.raises(PipelineError, match="fork branch"):
        Pipeline("p", S).fork(think, tool).branch(route, {"a": "think", "b": final}).build()


# -- exports and hash -------------------------------------------------------------------


def _agent(think_fn=think):
    return (Pipeline("agent", S).then(think_fn, id="think").branch(route, {"tool": tool, "final": final})
            .loop_to("think", when="tool").build())


def test_spec_is_json_and_complete():
    flow = _agent()
    spec = flow.to_spec()
    json.dumps(spec)  # JSON-able
    assert spec["name"] == "agent" and spec["scope"] == "S" and spec["fields"] == ["x", "y", "route"]
    assert spec["hash"] == flow.hash
    ids = {n["id"] for n in spec["nodes"]}
    assert {"think", "route", "tool", "final", "loop→think", "__start__", "__end__"} <= ids
    assert {"source": "route", "target": "tool", "label": "tool"} in spec["edges"]


def test_mermaid():
    text = _agent().to_mermaid()
    assert text.startswith("flowchart TD")
    assert '{"route"}' in text  # decider diamond
    assert "-->|tool|" in text and "-->|loop: tool|" in text


def test_hash_stable_across_builds():
    assert _agent().hash == _agent().hash
    assert len(_agent().hash) == 16


def test_hash_changes_when_code_changes():
    def think(s):  # noqa: F811 - same name, different body
        s.x = s.x + 2

    assert _agent(think).hash != _agent().hash


def test_hash_changes_with_structure_and_names():
    base = Pipeline("p", S).then(think).then(tool).build().hash
    assert Pipeline("p", S).then(tool).then(think).build().hash != base
    assert Pipeline("q", S).then(think).then(tool).build().hash != base
    assert Pipeline("p", S).then(think, name="Think").then(tool).build().hash != base


def test_hash_includes_subflow_and_predicate_code():
    child_a = Pipeline("c", S).then(tool).build()
    child_b = Pipeline("c", S).then(final, id="tool").build()
    mk = lambda c: Pipeline("p", S).subflow(c, inputs={"y": "y"}, outputs={"y": "y"}).build().hash  # noqa: E731
    assert mk(child_a) != mk(child_b)

    def w1(s):
        return s.x < 3

    def w2(s):
        return s.x < 4

    mk2 = lambda w: Pipeline("p", S).then(think).loop_to("think", when=w).build().hash  # noqa: E731
    assert mk2(w1) != mk2(w2)


def test_hash_stable_across_processes(tmp_path):
    """Set literals compile to frozensets whose repr order follows PYTHONHASHSEED."""
    script = tmp_path / "h.py"
    script.write_text(textwrap.dedent("""
        from pydantic import BaseModel
        from tracemem import Pipeline
        class S(BaseModel):
            x: str = ""
        def f(s):
            if s.x in {"alpha", "beta", "gamma", "delta", "epsilon"}:
                s.x = "y"
        print(Pipeline("p", S).then(f).build().hash)
    """))
    hashes = {
        subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": str(seed), "PYTHONPATH": "."}).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert len(hashes) == 1


def test_subflow_mapping_names_checked_at_build():
    class C(BaseModel):
        text: str = ""

    child = Pipeline("child", C).then(lambda c: None, id="noop").build()
    with pytest.raises(PipelineError, match=r"subflow 'child' outputs=\{'x': 'nope'\}: C has no field 'nope'"):
        Pipeline("p", S).subflow(child, inputs={"text": "route"}, outputs={"x": "nope"})
    with pytest.raises(PipelineError, match=r"inputs=\{'text': 'zz'\}: S has no field 'zz'"):
        Pipeline("p", S).subflow(child, inputs={"text": "zz"}, outputs={})
    with pytest.raises(PipelineError, match=r"outputs=\{'zz': 'text'\}: S has no field 'zz'"):
        Pipeline("p", S).subflow(child, inputs=lambda s: {}, outputs={"zz": "text"})
