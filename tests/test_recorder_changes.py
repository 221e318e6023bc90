"""A step's recorder keeps its changes path by path only when it runs beside others (a fork branch, a map
item), whose changes are merged into the run's state one by one; a stage that runs alone commits its overlay.
Tracked copies start in a shared read-only empty mapping that no recorder can fill."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

from tracemem import ForkConflictError, Pipeline, RunFailed, TracememError
from tracemem.flow.fork import changes
from tracemem.scope.recorder import RunState, StepRecorder
from tracemem.scope.schema import ScopeSchema


class S(BaseModel):
    n: int = 0
    items: list[str] = []
    done: list[str] = []


def _state() -> RunState:
    schema = ScopeSchema(S)
    return RunState(schema, schema.initial({"items": ["a"]}, "t"), b"")


def test_only_a_step_beside_others_keeps_its_changes():
    state = _state()
    alone, beside = StepRecorder(state, 1, "alone"), StepRecorder(state, 2, "branch", beside_others=True)
    for rec in (alone, beside):
        rec.set_field("n", 3)
        rec.read("items").append("b")
    assert alone.ops is None
    assert [(path, verb, value) for path, verb, value in changes(beside)] == [(("n",), "set", 3),
                                                                             (("items",), "append", "b")]
    with pytest.raises(TracememError, match="recorder of parallel step 1 \\('alone'\\) kept no changes"):
        changes(alone)
    assert [w[2:4] for w in alone.writes] == [w[2:4] for w in beside.writes] == [("n", "set"), ("items", "append")]


def test_tracked_copies_are_per_recorder():
    state = _state()
    first = StepRecorder(state, 1, "first")
    copy = first.read("items")
    assert first.read("items") is copy  # the same tracked copy for the step's second read
    second = StepRecorder(state, 2, "second")
    assert not second.proxies and second.read("items") is not copy
    with pytest.raises(TypeError):  # the shared empty mapping takes no entry
        StepRecorder(state, 3, "third").proxies["items"] = copy  # type: ignore[index]


def test_parallel_steps_merge_and_conflict_end_to_end():
    def mark(s):
        s.done = s.done + ["x"]

    def tag(s):
        s.items.append(s.items[0] + "!")  # appends merge, in branch order

    def tag_too(s):
        s.items.append("?")

    def each(s, ctx):
        s.done.append(ctx.item)

    run = (Pipeline("merge", S).then(mark).fork(tag, tag_too).map(each, over="items").build()
           .run({"items": ["a"]}))
    assert run.output.items == ["a", "a!", "?"] and run.output.done == ["x", "a", "a!", "?"]
    assert {w.path for w in run.writes if w.verb == "append"} == {"items", "done"}

    def one(s):
        s.n = 1

    def two(s):
        s.n = 2

    with pytest.raises(RunFailed) as failed:
        Pipeline("clash", S).then(mark).fork(one, two).build().run({})
    assert isinstance(failed.value.__cause__, ForkConflictError) and failed.value.run.output.n == 0
