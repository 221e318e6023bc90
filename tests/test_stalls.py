"""Sync branches (a fork's, a map's: the tool agent's tool calls) run in the caller's thread until one stalls,
then in helper threads: quick ones never pay a hand-off, waiting ones still overlap."""
from __future__ import annotations

import threading
import time

from pydantic import BaseModel

from tracemem import Pipeline
from tracemem.flow.fork import BranchOutcome, run_claimed
from tracemem.flow.stalls import STALL_AFTER


def test_quick_branches_all_run_in_the_callers_thread_in_order() -> None:
    seen: list[tuple[int, int]] = []

    def call(i: int) -> BranchOutcome:
        seen.append((i, threading.get_ident()))
        return BranchOutcome(i, i, None)

    for _ in range(50):
        seen.clear()
        outcomes = run_claimed(call, 6)
        assert [o.started for o in outcomes] == list(range(6))
        assert [i for i, _ in seen] == list(range(6))
        assert {ident for _, ident in seen} == {threading.get_ident()}


def test_waiting_branches_get_helpers_and_overlap() -> None:
    threads: set[int] = set()
    lock = threading.Lock()

    def call(i: int) -> BranchOutcome:
        started = time.monotonic_ns()
        with lock:
            threads.add(threading.get_ident())
        time.sleep(0.5)
        return BranchOutcome(started, time.monotonic_ns(), None)

    began = time.monotonic()
    outcomes = run_claimed(call, 4)
    took = time.monotonic() - began
    assert took < 1.2, f"4 branches of 0.5 s each took {took:.3f} s: they did not overlap"
    assert len(threads) == 4  # the caller's thread and three helpers, one per waiting branch
    latest_start = max(o.started for o in outcomes)
    assert all(o.ended > latest_start for o in outcomes)  # every branch was still running when the last began


def test_one_slow_branch_does_not_hold_up_the_quick_ones_after_it() -> None:
    done_at: dict[int, float] = {}

    def call(i: int) -> BranchOutcome:
        if i == 0:
            time.sleep(1.0)
        done_at[i] = time.monotonic()
        return BranchOutcome(0, 0, None)

    began = time.monotonic()
    run_claimed(call, 5)
    assert all(done_at[i] - began < 0.5 for i in range(1, 5)), (
        f"quick branches waited for the slow one: {[round(done_at[i] - began, 3) for i in range(1, 5)]} s "
        f"(a helper should take them after {STALL_AFTER} s)")


def test_a_failing_branch_is_returned_not_raised_and_the_rest_still_run() -> None:
    def call(i: int) -> BranchOutcome:
        return BranchOutcome(i, i, ValueError("no") if i == 1 else None)

    outcomes = run_claimed(call, 3)
    assert [type(o.error).__name__ if o.error else None for o in outcomes] == [None, "ValueError", None]


class Items(BaseModel):
    items: list[int] = []
    out: list[int] = []


def test_a_map_of_waiting_stages_still_runs_them_at_once() -> None:
    def slow(scope: Items, ctx) -> None:  # noqa: ANN001
        time.sleep(0.4)
        scope.out.append(ctx.item * 10)

    flow = Pipeline("m", Items).map(slow, over="items", id="slow").build()
    began = time.monotonic()
    run = flow.run({"items": [1, 2, 3]})
    took = time.monotonic() - began
    assert run.output.out == [10, 20, 30]  # committed in element order
    assert took < 0.9, f"three 0.4 s stages took {took:.3f} s"



def _four_sleepers_overlap() -> float:
    """Seconds four branches of 0.5 s each take together (2 s one after another)."""
    began = time.monotonic()
    run_claimed(lambda i: (time.sleep(0.5), BranchOutcome(0, 0, None))[1], 4)
    return time.monotonic() - began


def test_a_forked_child_gets_its_own_watcher_and_waiting_branches_still_overlap() -> None:
    """A process forked after a fan-out ran has no watcher thread (fork copies only the calling thread):
    its next fan-out starts one, so a branch that waits still brings a helper."""
    import os
    assert _four_sleepers_overlap() < 1.2  # the parent's watcher thread now exists
    pid = os.fork()
    if pid == 0:  # the child reports through its exit code
        os._exit(0 if _four_sleepers_overlap() < 1.2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "in the forked child, waiting branches ran one after another"
