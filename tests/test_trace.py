"""Backtracking within a run: data, control and compose edges, missing values, truncation, rendering."""
from __future__ import annotations

import json

import networkx as nx
import pytest
from pydantic import BaseModel

from tracemem import Pipeline, decide
from tracemem.trace import Trace


class S(BaseModel):
    a: int = 1
    b: int = 2
    c: int = 0
    out: int = 0
    other: int = 0
    log: list[str] = []
    notes: dict[str, str] = {}


def kinds(trace: Trace) -> dict[str, str]:
    return {n: d["kind"] for n, d in trace.graph.nodes(data=True)}


def edges(trace: Trace, kind: str) -> set[tuple[str, str]]:
    """(from, to) described briefly: write paths / input paths / decider names."""
    def short(n):
        d = trace.graph.nodes[n]
        return {"write": lambda: f"{d['stage']}:{d['path']}", "input": lambda: f"input:{d['path']}",
                "decision": lambda: f"decide:{d['stage']}"}[d["kind"]]()
    return {(short(a), short(b)) for a, b, d in trace.graph.edges(data=True) if d["kind"] == kind}


def test_data_edges_only_from_reads_before_the_write():
    def st(s):
        s.out = s.a + 1  # reads a, then writes out
        s.other = s.b  # reads b only after out was written

    run = Pipeline("p", S).then(st).build().run({})
    t = run.backtrack("out")
    assert isinstance(t, Trace) and isinstance(t.graph, nx.DiGraph)
    assert t.missing is None and not t.truncated
    assert edges(t, "data") == {("st:out", "input:a")}
    assert "input:b" not in {d.get("path") and f"input:{d['path']}" for _, d in t.graph.nodes(data=True)}
    t2 = run.backtrack("other")
    assert edges(t2, "data") == {("st:other", "input:a"), ("st:other", "input:b")}


def test_data_chain_across_steps_and_unrelated_steps_left_out():
    def one(s):
        s.c = s.a * 10

    def noise(s):
        s.other = s.b

    def two(s):
        s.out = s.c + 1

    run = Pipeline("p", S).then(one).then(noise).then(two).build().run({})
    t = run.backtrack("out")
    assert [s.stage for s in t.steps] == ["one", "two"]
    assert edges(t, "data") == {("two:out", "one:c"), ("one:c", "input:a")}
    root = t.graph.nodes[t.root]
    assert root["kind"] == "write" and root["path"] == "out" and json.loads(root["value"]) == 11


def test_own_write_read_back_in_same_stage():
    def st(s):
        s.c = s.a
        s.out = s.c * 2

    t = Pipeline("p", S).then(st).build().run({}).backtrack("out")
    assert edges(t, "data") == {("st:out", "input:a"), ("st:out", "st:c"), ("st:c", "input:a")}


def route(s):
    return decide(s, [("c is big", lambda s: s.c > 5, "big")], default="small")


def one(s):
    s.c = s.a * 10


def big(s):
    s.out = s.b + 1


def small(s):
    s.out = 0


def after(s):
    s.other = s.out


def _branchy():
    return Pipeline("p", S).then(one).branch(route, {"big": big, "small": small}).then(after).build()


def test_control_edges_from_decider_with_evidence():
    run = _branchy().run({})
    t = run.backtrack("out")
    assert edges(t, "control") == {("big:out", "decide:route")}
    assert edges(t, "data") == {("big:out", "input:b"), ("decide:route", "one:c"), ("one:c", "input:a")}
    (dnode,) = [d for _, d in t.graph.nodes(data=True) if d["kind"] == "decision"]
    assert dnode["chosen"] == "big"
    assert dnode["evidence"]["rules"][0] == {"rule": "c is big", "branch": "big", "matched": True,
                                            "read": {"c": 10}}
    assert [s.stage for s in t.steps] == ["one", "route", "big"]
    assert "because 'c is big'" in t.explain()


def test_step_after_join_has_no_control_edge():
    t = _branchy().run({}).backtrack("other")
    assert edges(t, "control") == {("big:out", "decide:route")}  # only through `out`
    assert ("after:other", "decide:route") not in edges(t, "control")


def test_loop_control_chain():
    class L(BaseModel):
        n: int = 0
        limit: int = 3
        out: str = ""

    def think(s):
        s.n = s.n + 1

    def router(s):
        return "tool" if s.n < s.limit else "final"

    def tool(s):
        pass

    def final(s):
        s.out = f"n={s.n}"

    run = (Pipeline("agent", L).then(think).branch(router, {"tool": tool, "final": final})
           .loop_to("think", when="tool").build().run({}))
    t = run.backtrack("out")
    # every think and every router decision contributed (the data chain through n, the control chain)
    assert [s.stage for s in t.steps] == ["think", "router", "think", "router", "think", "router", "final"]
    assert all(s.stage != "tool" for s in t.steps)


def test_compose_edges_for_appends_and_item_sets():
    def first(s):
        s.log.append("x")

    def unrelated(s):
        s.other = s.b

    def second(s):
        s.log.append("y" * s.a)

    def third(s):
        s.notes["k"] = "v"

    run = Pipeline("p", S).then(first).then(unrelated).then(second).then(third).build().run({"log": ["in"]})
    t = run.backtrack("log")
    assert edges(t, "compose") == {("second:log", "first:log"), ("first:log", "input:log")}
    assert [s.stage for s in t.steps] == ["first", "second"]
    t = run.backtrack("notes")
    assert edges(t, "compose") == {("third:notes.k", "input:notes")}


def test_missing_is_never_written_not_empty():
    run = _branchy().run({})
    t = run.backtrack("a")
    assert t.missing == "never-written"
    assert t.steps == [] and t.graph.number_of_nodes() == 1
    assert kinds(t)[t.root] == "input"
    assert "never written" in t.explain()
    assert t.to_json()["missing"] == "never-written"


def test_failed_step_writes_are_not_sources():
    def good(s):
        s.out = 1

    def bad(s):
        s.out = 2
        raise RuntimeError("x")

    run = Pipeline("p", S).then(good).then(bad).build().run({}, raise_on_error=False)
    t = run.backtrack("out")
    assert [s.stage for s in t.steps] == ["good"]


def _chain(n):
    class C(BaseModel):
        v: int = 0

    p = Pipeline("chain", C)
    for i in range(n):
        p.then(lambda s: setattr(s, "v", s.v + 1), id=f"inc{i}")
    return p.build().run({})


def test_truncated_by_max_nodes_and_max_depth():
    run = _chain(30)
    full = run.backtrack("v")
    assert not full.truncated and len(full.steps) == 30
    t = run.backtrack("v", max_nodes=5)
    assert t.truncated and t.graph.number_of_nodes() == 5
    assert "truncated" in t.explain()
    t = run.backtrack("v", max_depth=3)
    assert t.truncated and [s.stage for s in t.steps] == ["inc26", "inc27", "inc28", "inc29"]
    assert t.to_json()["truncated"] is True


def test_explain_to_json_to_mermaid():
    run = _branchy().run({})
    t = run.backtrack("out")
    text = t.explain()
    lines = text.splitlines()
    assert lines[0].startswith("out = 3") and "step 3, big" in lines[0]
    assert any(line.startswith("← b") and "run input" in line for line in lines)
    assert any(line.startswith("⇐ decider route chose 'big'") for line in lines)
    assert str(t) == text

    data = t.to_json()
    json.dumps(data)  # JSON-able
    assert data["path"] == "out" and data["run_id"] == run.run_id and data["root"] == t.root
    assert {e["kind"] for e in data["edges"]} == {"data", "control"}
    assert len(data["nodes"]) == t.graph.number_of_nodes()

    mer = t.to_mermaid()
    assert mer.startswith("flowchart BT")
    assert "-.->|control|" in mer and "-->|data|" in mer
    assert mer.count("\n") == t.graph.number_of_nodes() + t.graph.number_of_edges()


def test_backtrack_nested_path():
    def st(s):
        s.notes["x"] = str(s.a)
        s.notes["y"] = str(s.b)

    run = Pipeline("p", S).then(st).build().run({})
    t = run.backtrack("notes.y")
    assert t.graph.nodes[t.root]["path"] == "notes.y"
    assert run.backtrack('notes["x"]').missing is None
    with pytest.raises(ValueError, match="not a scope path"):
        run.backtrack("9bad")


def test_fork_appends_compose_in_declared_order():
    def left(s):
        s.log.append(str(s.a))

    def right(s):
        s.log.append(str(s.b))

    def idle(s):
        s.other = 1

    run = Pipeline("p", S).fork(left, right, idle).build().run({})
    assert run.output.log == ["1", "2"]
    t = run.backtrack("log")
    assert edges(t, "compose") == {("right:log", "left:log"), ("left:log", "input:log")}
    # (left's data edge to the input list is the same graph edge as its compose edge)
    assert edges(t, "data") == {("right:log", "input:b"), ("right:log", "input:log"), ("left:log", "input:a")}
    assert [s.stage for s in t.steps] == ["left", "right"]


def test_subflow_write_traces_to_mapped_inputs():
    class C(BaseModel):
        x: int = 0
        y: int = 0

    def double(c):
        c.y = c.x * 2

    child = Pipeline("child", C).then(double).build()

    def prep(s):
        s.c = s.a + 1

    run = (Pipeline("p", S).then(prep).then(lambda s: setattr(s, "other", s.b), id="noise")
           .subflow(child, inputs={"x": "c"}, outputs={"out": "y"}, id="sub").build().run({}))
    t = run.backtrack("out")
    assert run.output.out == 4
    assert [s.stage for s in t.steps] == ["prep", "sub"]
    root = t.graph.nodes[t.root]
    assert root["child_run_id"] == run.children[0].run_id


def test_list_element_is_traced_to_the_write_that_produced_it_across_resumed_runs():
    """`backtrack("messages[3]")` names the turn that produced message 3, not the last append."""
    class Thread(BaseModel):
        user: str = ""
        messages: list[dict[str, str]] = []

    def turn(s: Thread) -> None:
        s.messages.append({"role": "user", "content": s.user})
        s.messages.append({"role": "assistant", "content": f"re: {s.user}"})

    def redact_first(s: Thread) -> None:
        s.messages[0] = {"role": "user", "content": "[removed]"}

    flow = Pipeline("thread", Thread).then(turn).build()
    runs = []
    previous = None
    for i in range(4):
        previous = flow.run({"user": f"q{i}"}, resume=previous)
        runs.append(previous)
    trace = previous.backtrack("messages[3]")
    root = trace.graph.nodes[trace.root]
    assert (root["run_id"], root["verb"], root["path"]) == (runs[1].run_id, "append", "messages")
    assert "re: q1" in root["value"]
    last = previous.backtrack("messages[-1]")
    assert last.graph.nodes[last.root]["run_id"] == runs[3].run_id
    edited = Pipeline("thread", Thread).then(redact_first).build().run({}, resume=previous)
    first = edited.backtrack("messages[0]")
    assert first.graph.nodes[first.root]["run_id"] == edited.run_id and first.graph.nodes[first.root]["verb"] == "set"
    fresh = flow.run({"user": "x", "messages": [{"role": "system", "content": "given"}]})
    assert fresh.backtrack("messages[0]").missing == "never-written"
