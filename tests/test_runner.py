"""Executing pipelines: linear, decider, fork, loop, subflow; sync and async; context; failures; replay."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

from tracemem import (ForkConflictError, LoopLimitError, Pipeline, Run, RunFailed, StageContext, TracememError,
                      decide)


class S(BaseModel):
    q: str = ""
    n: int = 0
    score: int = 0
    income: int = 0
    out: str = ""
    a: str = ""
    b: str = ""
    log: list[str] = []
    tools: list[str] = []
    threads: dict[str, str] = {}


def step_names(run: Run) -> list[str]:
    return [s.stage for s in run.steps]


# -- linear ------------------------------------------------------------------------


def test_linear_run_records_everything():
    def first(s):
        s.n = s.n + 1

    def second(s):
        s.out = f"{s.q}:{s.n}"

    flow = Pipeline("lin", S).then(first).then(second).build()
    run = flow.run({"q": "hi", "n": 1})
    assert run.ok and run.status == "ok" and run.error is None
    assert isinstance(run.output, S) and run.output.out == "hi:2"
    assert step_names(run) == ["first", "second"]
    assert [s.step for s in run.steps] == [1, 2]
    assert all(s.status == "ok" and s.kind == "stage" and s.iteration == 0 for s in run.steps)
    assert all(s.started_at <= s.ended_at for s in run.steps)
    assert run.pipeline == "lin" and run.pipeline_hash == flow.hash
    assert run.input["q"] == "hi" and json.loads(run.output_json)["out"] == "hi:2"
    assert len(run.run_id) == 16 and run.run_id != flow.run({}).run_id


def test_input_may_be_model_instance_and_bad_input_is_explained():
    flow = Pipeline("p", S).then(lambda s: None, id="noop").build()
    assert flow.run(S(q="x")).output.q == "x"
    with pytest.raises(TracememError, match=r"run input for pipeline 'p' does not fit S"):
        flow.run({"n": "many"})


# -- decider --------------------------------------------------------------------------


def route(s):
    return decide(s, [
        ("score below 500", lambda s: s.score < 500, "reject"),
        ("income over 100k", lambda s: s.income > 100_000, "approve"),
    ], default="review")


def reject(s):
    s.out = "rejected"


def approve(s):
    s.out = "approved"


def review(s):
    s.out = "review"


def _credit():
    return Pipeline("credit", S).branch(route, {"reject": reject, "approve": approve, "review": review}).build()


def test_decider_with_decide_evidence():
    run = _credit().run({"score": 700, "income": 200_000})
    assert run.output.out == "approved" and step_names(run) == ["route", "approve"]
    (d,) = run.decisions
    assert d.step == 1 and d.chosen == "approve"
    rules = d.evidence["rules"]
    assert [r["rule"] for r in rules] == ["score below 500", "income over 100k"]
    assert [r["matched"] for r in rules] == [False, True]
    assert rules[0]["read"] == {"score": 700} and rules[1]["read"] == {"income": 200_000}
    assert d.evidence["used_default"] is False
    assert run.steps[1].routed_by == 1 and run.steps[0].kind == "decider"


def test_decide_default_and_all_rules_evaluated():
    run = _credit().run({"score": 400, "income": 200_000})
    assert run.output.out == "rejected"
    assert [r["matched"] for r in run.decisions[0].evidence["rules"]] == [True, True]  # every rule evaluated
    run = _credit().run({"score": 600, "income": 10})
    assert run.output.out == "review" and run.decisions[0].evidence["used_default"] is True


def test_decide_without_default_fails_clearly():
    def strict(s):
        return decide(s, [("never", lambda s: False, "a")])

    run = Pipeline("p", S).branch(strict, {"a": reject}).build().run({}, raise_on_error=False)
    assert run.status == "failed" and "no rule matched and no default" in run.error


def test_plain_decider_and_bad_key():
    flow = Pipeline("p", S).branch(lambda s: "x" if s.n else "y", {"x": approve, "y": reject}, id="pick").then(
        review).build()
    run = flow.run({"n": 1})
    assert run.decisions[0].chosen == "x" and run.decisions[0].evidence == {"returned": "x"}
    assert step_names(run) == ["pick", "approve", "review"]
    assert run.steps[2].routed_by is None  # after the join: not routed by the decider

    bad = Pipeline("p", S).branch(lambda s: "zzz", {"x": approve}, id="pick").build()
    run = bad.run({}, raise_on_error=False)
    assert "decider 'pick' returned 'zzz'" in run.error and run.steps[0].status == "failed"


def test_branch_jump_to_stage_id_forward():
    flow = (Pipeline("p", S).branch(lambda s: "skip" if s.n else "go", {"skip": "last", "go": approve}, id="d")
            .then(reject).then(review, id="last").build())
    assert step_names(flow.run({"n": 1})) == ["d", "last"]
    assert step_names(flow.run({"n": 0})) == ["d", "approve", "reject", "last"]


# -- fork ------------------------------------------------------------------------------


def test_fork_sync_runs_in_threads_and_merges():
    barrier = threading.Barrier(2, timeout=5)  # deadlocks (then fails) unless both run at once

    def left(s):
        barrier.wait()
        s.a = "L" + s.q
        s.threads["left"] = threading.current_thread().name

    def right(s):
        barrier.wait()
        s.b = "R" + s.q

    run = Pipeline("p", S).fork(left, right).then(lambda s: setattr(s, "out", s.a + s.b), id="join").build().run(
        {"q": "!"})
    assert run.output.out == "L!R!"
    assert [(s.stage, s.kind) for s in run.steps] == [("left", "fork-branch"), ("right", "fork-branch"),
                                                      ("join", "stage")]
    assert run.state_at().model_dump() == run.output.model_dump()


def test_fork_async_uses_gather():
    asyncio.run(_test_fork_async_uses_gather())


async def _test_fork_async_uses_gather():
    order = []
    both = asyncio.Event()
    started = []

    async def left(s):
        started.append("left")
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)
        order.append("left")
        s.a = "L"

    async def right(s):
        started.append("right")
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)
        order.append("right")
        s.b = "R"

    flow = Pipeline("p", S).fork(left, right).build()
    assert flow.has_async
    run = await flow.arun({})
    assert (run.output.a, run.output.b) == ("L", "R") and sorted(order) == ["left", "right"]


def test_async_fork_from_sync_run_and_mixed_branches():
    async def left(s):
        await asyncio.sleep(0)
        s.a = "L"

    def right(s):  # a sync branch under asyncio runs in a thread
        s.b = threading.current_thread().name

    run = Pipeline("p", S).fork(left, right).build().run({})
    assert run.output.a == "L" and run.output.b != threading.main_thread().name


def test_fork_conflict_names_both_stages():
    def one(s):
        s.out = "1"

    def two(s):
        s.out = "2"

    with pytest.raises(RunFailed) as info:
        Pipeline("p", S).then(lambda s: setattr(s, "n", 1), id="before").fork(one, two).build().run({})
    err = info.value.__cause__
    assert isinstance(err, ForkConflictError)
    assert (err.first, err.second, err.path) == ("one", "two", "out")
    assert "'one'" in str(err) and "'two'" in str(err)
    run = info.value.run
    assert run.status == "failed" and run.output.out == "" and run.output.n == 1
    assert [s.status for s in run.steps] == ["ok", "failed", "failed"]


def test_fork_conflict_on_nested_and_set_vs_append():
    def setter(s):
        s.log = ["x"]

    def appender(s):
        s.log.append("y")

    run = Pipeline("p", S).fork(appender, setter).build().run({}, raise_on_error=False)
    assert run.status == "failed" and "'appender' and 'setter'" in run.error and "'log'" in run.error


def test_fork_appends_merge_in_declared_order():
    def slow(s):
        time.sleep(0.05)
        s.log.append("slow-1")
        s.log.append("slow-2")

    def fast(s):
        s.log.append("fast")

    def third(s):
        s.log.extend(["third"])

    run = Pipeline("p", S).fork(fast, slow, third).build().run({"log": ["start"]})
    assert run.output.log == ["start", "fast", "slow-1", "slow-2", "third"]
    assert run.state_at().log == run.output.log
    run = Pipeline("p", S).fork(slow, fast).build().run({"log": []})
    assert run.output.log == ["slow-1", "slow-2", "fast"]


def test_fork_branch_failure_fails_run_and_keeps_earlier_work():
    def ok(s):
        s.a = "fine"

    def boom(s):
        raise ValueError("nope")

    run = Pipeline("p", S).then(lambda s: setattr(s, "n", 5), id="pre").fork(ok, boom).build().run(
        {}, raise_on_error=False)
    assert run.status == "failed" and "stage 'boom' failed" in run.error and "ValueError: nope" in run.error
    assert run.output.n == 5 and run.output.a == ""  # no branch committed
    statuses = {s.stage: (s.status, s.error) for s in run.steps}
    assert statuses["pre"] == ("ok", None)
    assert statuses["boom"][0] == "failed" and statuses["ok"][0] == "failed"
    assert "not committed" in statuses["ok"][1]


# -- loops --------------------------------------------------------------------------------


def think(s):
    s.n = s.n + 1
    s.log.append(f"think{s.n}")


def router(s):
    return "tool" if s.n < s.score else "final"


def call_tool(s):
    s.tools.append(f"tool{s.n}")


def final(s):
    s.out = f"done after {s.n}"


def _tool_loop(max_iterations=8):
    return (Pipeline("agent", S).then(think).branch(router, {"tool": call_tool, "final": final})
            .loop_to("think", when="tool", max_iterations=max_iterations).build())


def test_tool_loop_with_branch_key():
    run = _tool_loop().run({"score": 3})
    assert run.output.out == "done after 3"
    assert run.output.tools == ["tool1", "tool2"]
    assert step_names(run) == ["think", "router", "call_tool", "think", "router", "call_tool", "think", "router",
                               "final"]
    assert [s.iteration for s in run.steps if s.stage == "think"] == [0, 1, 2]
    # the second `think` was routed back by the decider that chose "tool"
    think2 = [s for s in run.steps if s.stage == "think"][1]
    assert think2.routed_by == 2 and run.steps[0].routed_by is None
    assert [d.chosen for d in run.decisions] == ["tool", "tool", "final"]
    assert run.state_at().model_dump() == run.output.model_dump()


def test_tool_loop_with_predicate():
    def more(s):
        return s.n < 3

    flow = Pipeline("p", S).then(think).then(call_tool).loop_to("think", when=more).build()
    run = flow.run({})
    assert run.output.n == 3 and run.output.tools == ["tool1", "tool2", "tool3"]
    loops = [s for s in run.steps if s.kind == "loop"]
    assert [s.stage for s in loops] == ["loop→think"] * 3
    assert [d.chosen for d in run.decisions] == ["continue", "continue", "exit"]
    assert [r.path for r in run.reads if r.step == loops[0].step] == ["n"]  # the predicate's reads recorded
    assert run.steps[3].routed_by == loops[0].step  # second think routed by the loop decision


def test_async_predicate_loop():
    asyncio.run(_test_async_predicate_loop())


async def _test_async_predicate_loop():
    async def more(s):
        await asyncio.sleep(0)
        return s.n < 2

    run = await Pipeline("p", S).then(think).loop_to("think", when=more).build().arun({})
    assert run.output.n == 2


def test_branch_jump_back_loop_and_pipeline_guard():
    flow = (Pipeline("p", S, max_iterations=4).then(think)
            .branch(lambda s: "again" if s.n < s.score else "done", {"again": "think", "done": final}, id="d")
            .build())
    assert flow.run({"score": 3}).output.out == "done after 3"
    run = flow.run({"score": 100}, raise_on_error=False)
    assert run.status == "failed" and "max_iterations=4" in run.error and "'d'" in run.error


def test_break_loop():
    def tool_breaks(s, ctx: StageContext):
        s.tools.append("t")
        if s.n == 2:
            ctx.break_loop("enough tools")

    flow = (Pipeline("p", S).then(think).branch(lambda s: "tool", {"tool": tool_breaks, "final": final}, id="r")
            .loop_to("think", when="tool").then(review_after).build())
    run = flow.run({})
    assert run.output.n == 2 and run.output.out == "after"
    brk = [d for d in run.decisions if d.chosen == "break"]
    assert len(brk) == 1 and brk[0].evidence["reason"] == "enough tools"
    assert step_names(run)[-1] == "review_after"


def review_after(s):
    s.out = "after"


def test_break_loop_outside_loop_fails():
    def breaker(s, ctx):
        ctx.break_loop()

    run = Pipeline("p", S).then(breaker).build().run({}, raise_on_error=False)
    assert run.status == "failed" and "not inside a loop" in run.error


def test_max_iterations_guard_fails_clearly_and_keeps_steps():
    run = _tool_loop(max_iterations=3).run({"score": 100}, raise_on_error=False)
    assert run.status == "failed"
    assert "max_iterations=3" in run.error and "loop→think" in run.error
    ok_steps = [s for s in run.steps if s.status == "ok"]
    assert [s.stage for s in ok_steps].count("think") == 4  # the first pass + 3 loops
    last = run.steps[-1]
    assert last.status == "failed" and last.kind == "loop"
    assert run.output.n == 4 and run.output.tools == ["tool1", "tool2", "tool3", "tool4"]
    assert run.state_at().model_dump() == run.output.model_dump()
    with pytest.raises(RunFailed) as info:
        _tool_loop(max_iterations=2).run({"score": 100})
    assert isinstance(info.value.__cause__, LoopLimitError) and info.value.run.status == "failed"


def test_loop_counter_resets_between_entries():
    # an outer predicate loop re-enters an inner tool loop; the inner guard counts per entry
    def outer_more(s):
        return len(s.log) < 6

    def reset(s):
        s.n = 0

    flow = (Pipeline("p", S).then(reset).then(think).branch(router, {"tool": call_tool, "final": final})
            .loop_to("think", when="tool", max_iterations=2).loop_to("reset", when=outer_more, id="outer")
            .build())
    run = flow.run({"score": 2})
    assert run.ok and run.output.log.count("think1") == 3


# -- subflow -----------------------------------------------------------------------------


class Child(BaseModel):
    text: str = ""
    result: str = ""


def shout(c):
    c.result = c.text.upper()


def test_subflow_child_run_linked_with_mapping():
    child = Pipeline("child", Child).then(shout).build()
    flow = (Pipeline("parent", S).then(lambda s: setattr(s, "q", s.q + "!"), id="prep")
            .subflow(child, inputs={"text": "q"}, outputs={"out": "result"}).build())
    run = flow.run({"q": "hey"})
    assert run.output.out == "HEY!"
    sub = run.steps[1]
    assert sub.kind == "subflow" and sub.stage == "child"
    (kid,) = run.children
    assert sub.child_run_id == kid.run_id
    assert kid.parent_run_id == run.run_id and kid.parent_step == sub.step
    assert kid.pipeline == "child" and kid.input["text"] == "hey!" and kid.output.result == "HEY!"
    assert [r.path for r in run.reads if r.step == sub.step] == ["q"]
    assert [(w.path, w.verb) for w in run.writes if w.step == sub.step] == [("out", "set")]


def test_subflow_inputs_fn_and_failure():
    def fails(c):
        raise KeyError("missing")

    child = Pipeline("child", Child).then(fails).build()
    flow = (Pipeline("parent", S).then(lambda s: setattr(s, "n", 1), id="pre")
            .subflow(child, inputs=lambda s: {"text": s.q}, outputs={"out": "result"}, id="sub").build())
    run = flow.run({"q": "x"}, raise_on_error=False)
    assert run.status == "failed" and "subflow 'child'" in run.error
    (kid,) = run.children
    assert kid.status == "failed" and run.steps[-1].child_run_id == kid.run_id
    assert run.output.n == 1


def test_async_subflow():
    asyncio.run(_test_async_subflow())


async def _test_async_subflow():
    async def ashout(c):
        await asyncio.sleep(0)
        c.result = c.text.upper()

    child = Pipeline("child", Child).then(ashout).build()
    flow = Pipeline("parent", S).subflow(child, inputs={"text": "q"}, outputs={"out": "result"}).build()
    assert flow.has_async
    assert (await flow.arun({"q": "a"})).output.out == "A"
    with pytest.raises(TracememError, match="arun"):
        flow.run({"q": "a"})  # an event loop is running here


# -- sync / async stages --------------------------------------------------------------------


def test_async_stages_with_run_and_arun():
    async def fetch(s):
        await asyncio.sleep(0)
        s.a = "fetched"

    def use(s):
        s.out = s.a + "!"

    flow = Pipeline("p", S).then(fetch).then(use).build()
    assert flow.run({}).output.out == "fetched!"
    assert asyncio.run(flow.arun({})).output.out == "fetched!"
    sync_flow = Pipeline("p", S).then(use).build()
    assert not sync_flow.has_async and asyncio.run(sync_flow.arun({"a": "x"})).output.out == "x!"


# -- stage context ---------------------------------------------------------------------------


def test_stage_context():
    seen: dict[str, Any] = {}

    def st(s, ctx: StageContext):
        seen.update(run_id=ctx.run_id, step=ctx.step, stage=ctx.stage, iteration=ctx.iteration,
                    client=ctx.env["client"], q=ctx.args["q"])
        with pytest.raises(TypeError):
            ctx.args["q"] = "changed"  # type: ignore[index]
        with pytest.raises(TypeError):
            ctx.env["client"] = None  # type: ignore[index]
        ctx.args["log"].append("sneaky")  # a private copy: never reaches the scope
        ctx.log("hello")
        ctx.log("world")
        s.q = "new"

    def second(s, ctx):
        seen["args_q_later"] = ctx.args["q"]  # args stay the run input after writes
        s.out = str(len(s.log))

    client = object()
    run = Pipeline("p", S).then(st).then(second).build().run({"q": "orig", "log": ["a"]}, env={"client": client})
    assert seen["run_id"] == run.run_id and seen["step"] == 1 and seen["stage"] == "st"
    assert seen["client"] is client and seen["q"] == "orig" and seen["args_q_later"] == "orig"
    assert run.steps[0].logs == ("hello", "world")
    assert run.output.log == ["a"] and run.output.out == "1"
    assert "client" not in run.input_json  # env is never recorded


# -- failures ----------------------------------------------------------------------------------


def test_failed_stage_keeps_earlier_work():
    def one(s):
        s.n = 1

    def two(s):
        s.out = "partial"
        raise RuntimeError("kaput")

    def three(s):
        s.n = 3

    flow = Pipeline("p", S).then(one).then(two).then(three).build()
    with pytest.raises(RunFailed) as info:
        flow.run({})
    run = info.value.run
    assert isinstance(info.value.__cause__, RuntimeError)
    assert run.status == "failed" and "stage 'two' failed in run" in run.error and "kaput" in run.error
    assert [(s.stage, s.status) for s in run.steps] == [("one", "ok"), ("two", "failed")]
    assert run.steps[1].error.startswith("stage 'two' failed") or "kaput" in run.steps[1].error
    assert run.output.n == 1 and run.output.out == ""
    assert run.ended_at is not None and run.output_json is not None
    same = flow.run({}, raise_on_error=False)
    assert same.status == "failed" and [s.status for s in same.steps] == ["ok", "failed"]


def test_failed_async_stage():
    asyncio.run(_test_failed_async_stage())


async def _test_failed_async_stage():
    async def bad(s):
        raise ValueError("async kaput")

    run = await Pipeline("p", S).then(bad).build().arun({}, raise_on_error=False)
    assert run.status == "failed" and "async kaput" in run.error


# -- replay ---------------------------------------------------------------------------------


def test_state_at_and_value_at():
    def a(s):
        s.n = 1
        s.log.append("a")

    def b(s):
        s.n = 2
        s.log.append("b")
        s.threads["k"] = "v"

    def c(s):
        del s.log[0]
        s.out = "done"

    run = Pipeline("p", S).then(a).then(b).then(c).build().run({"q": "in"})
    assert run.state_at(1).n == 1 and run.state_at(1).log == ["a"]
    assert run.state_at("b").log == ["a", "b"] and run.state_at("b").threads == {"k": "v"}
    assert run.state_at() == run.output and run.state_at(3) == run.output
    assert run.value_at("log", 2) == ["a", "b"]
    assert run.value_at("log[1]", "b") == "b"
    assert run.value_at("threads.k") == "v"
    assert run.value_at("q", 1) == "in"
    assert run.step("b").step == 2 and run.step(3).stage == "c"
    with pytest.raises(TracememError, match="no step 9"):
        run.state_at(9)
    with pytest.raises(TracememError, match="no value at 'threads.zz'"):
        run.value_at("threads.zz")


def test_loop_predicate_writes_are_committed():
    def more(s):
        s.log.append("checked")
        return s.n < 2

    run = Pipeline("p", S).then(think).loop_to("think", when=more).build().run({})
    assert run.output.log == ["think1", "checked", "think2", "checked"]
    assert run.state_at().model_dump() == run.output.model_dump()


def test_failed_stage_keeps_its_logs():
    def bad(s, ctx):
        ctx.log("about to fail")
        raise RuntimeError("x")

    def fine(s, ctx):
        ctx.log("fine")

    run = Pipeline("p", S).then(bad).build().run({}, raise_on_error=False)
    assert run.steps[-1].logs == ("about to fail",)
    run = Pipeline("p", S).fork(fine, bad).build().run({}, raise_on_error=False)
    assert [(s.stage, s.logs) for s in run.steps] == [("fine", ("fine",)), ("bad", ("about to fail",))]


def test_bool_decider_with_bool_arm_keys():
    flow = Pipeline("p", S).branch(lambda s: s.n > 0, {True: approve, False: reject}, id="positive").build()
    assert flow.run({"n": 1}).output.out == "approved"
    run = flow.run({"n": 0})
    assert run.output.out == "rejected" and run.decisions[0].chosen == "False"


def test_break_loop_from_fork_branch():
    def watcher(s, ctx):
        if s.n >= 2:
            ctx.break_loop("watcher saw enough")

    def worker(s):
        s.tools.append(f"w{s.n}")

    flow = (Pipeline("p", S).then(think).fork(watcher, worker).loop_to("think", when=lambda s: True)
            .then(review_after).build())
    run = flow.run({})
    assert run.ok and run.output.n == 2 and run.output.tools == ["w1", "w2"] and run.output.out == "after"
    (brk,) = [d for d in run.decisions if d.chosen == "break"]
    assert run.step(brk.step).stage == "watcher" and brk.evidence["reason"] == "watcher saw enough"

    run = Pipeline("p", S).fork(watcher, worker).build().run({"n": 5}, raise_on_error=False)
    assert run.status == "failed" and "not inside a loop" in run.error and run.output.tools == []
