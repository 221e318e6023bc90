"""The viewer's backtrack reads a run a block of steps at a time (trace/stored_index.py): for every value of
every run of real stores (the demo: memories, prompts, model calls, a thread; forks, loops, subflows, a failed
step, a list built by appends) it finds the same trace as a backtrack over the whole loaded run."""
from __future__ import annotations

import io

import pytest
from pydantic import BaseModel

from stages.demo import run_demo
from tracemem import Pipeline
from tracemem.store import Store
from tracemem.trace.stored_index import StoredIndex
from tracemem.trace.walk import backtrack
from tracemem.ui.run_page import load_steps
from tracemem.ui.run_outline import paths_written


class Shape(BaseModel):
    n: int = 0
    items: list[str] = []
    left: str = ""
    right: str = ""
    text: str = ""
    out: str = ""
    answer: str = ""


def a(s):
    s.n += 1
    s.items.append(f"item {s.n}")


def b(s):
    s.left = f"left {s.n}"


def c(s):
    s.right = "right"


def again(s):
    return s.n < 4


def upper(s):
    s.out = s.text.upper()


def finish(s):
    s.items[1] = s.items[1] + "!"
    s.answer = f"{s.left}/{s.right}/{s.out}/{len(s.items)}"


def explode(s):
    s.left = "never committed"
    raise ValueError("nonsense")


SHAPES = (Pipeline("shapes", Shape, max_iterations=8).then(a).fork(b, c).loop_to("a", when=again, max_iterations=8)
          .subflow(Pipeline("inner", Shape).then(upper).build(), inputs={"text": "left"}, outputs={"out": "out"})
          .then(finish).build())


def same_traces(store: Store, block: int) -> int:
    """Compare every written path (and each list element) of every top-level run; how many were compared."""
    compared = 0
    for r in store.runs(limit=100):
        run_id = r["run_id"]
        whole = store.run(run_id)
        paths, _ = paths_written(store, run_id)
        elements = [f"{p}[{i}]" for p in paths if p == "items" for i in (0, 1, -1)]
        for path in paths + elements:
            head = load_steps(store, run_id, -1, -1)
            index = StoredIndex(store, head, lambda first, last: load_steps(store, run_id, first, last), block=block)
            lazy = backtrack(head, path, index=index).to_json()
            eager = whole.backtrack(path).to_json()
            assert lazy == eager, (run_id, path)
            assert head.steps == [] and len(index._blocks) <= len(whole.steps) // block + 2
            compared += 1
    return compared


@pytest.mark.parametrize("block", [1, 3, 256])
def test_the_demo_traces_alike_read_a_block_at_a_time(tmp_path, block):
    path = str(tmp_path / "demo.duckdb")
    run_demo(path, fresh=True, out=io.StringIO())
    with Store(path, read_only=True) as store:
        assert same_traces(store, block) > 10


@pytest.mark.parametrize("block", [1, 4])
def test_forks_loops_subflows_failures_and_lists_trace_alike(tmp_path, block):
    path = str(tmp_path / "shapes.duckdb")
    with Store(path) as store:
        SHAPES.run({}, store=store)
        first = SHAPES.run({}, store=store)
        SHAPES.fork(first.run_id, 3, edits={"right": "edited"}, store=store)
        Pipeline("broken", Shape).then(a).then(explode).build().run({}, store=store, raise_on_error=False)
    with Store(path, read_only=True) as store:
        assert same_traces(store, block) > 20
