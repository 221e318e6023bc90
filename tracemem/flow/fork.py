"""Forks: running parallel branches and merging what they wrote.

Sync branches run in threads — the first in the caller's thread, the others in the
flow's `BranchPool` — and async ones under `asyncio.gather` (sync ones then via
`asyncio.to_thread`). Each branch writes into its own recorder; the merge applies them
in declared order — so appends to one list merge in that order — after checking that
no two branches set the same path. The runner hands in a callback per branch, so this
module never sees the runner.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from pydantic import BaseModel

from ..errors import ForkConflictError, TracememError
from ..scope.paths import Path, apply_write, format_path
from ..scope.recorder import RunState, StepRecorder
from ..scope.tracked import unwrap
from .sync import run_sync


@dataclass
class BranchOutcome:
    """How one branch went: when it ran, and what it raised (None: it finished)."""

    started: int
    ended: int
    error: Optional[BaseException]


class BranchPool:
    """The threads a flow's sync branches run in: made on first use, owned by the flow (a forked child
    process makes its own)."""

    def __init__(self, max_workers: int = 32) -> None:
        self.max_workers = max_workers
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():  # (a forked child has none of its parent's threads)
                self._pool, self._pid = ThreadPoolExecutor(self.max_workers, "tracemem-branch"), os.getpid()
            return self._pool


async def run_branches(call: Callable[[int], Awaitable[Any]], is_async: list[bool], async_mode: bool,
                       pool: BranchPool) -> list[BranchOutcome]:
    """Run branch i by awaiting `call(i)`, every branch to completion; errors are returned, not raised."""

    def call_sync(i: int) -> BranchOutcome:
        started = time.time_ns()
        try:
            run_sync(call(i), "internal: a sync fork branch suspended")
            return BranchOutcome(started, time.time_ns(), None)
        except Exception as err:
            return BranchOutcome(started, time.time_ns(), err)

    async def call_async(i: int) -> BranchOutcome:
        if not is_async[i]:
            return await asyncio.to_thread(call_sync, i)
        started = time.time_ns()
        try:
            await call(i)
            return BranchOutcome(started, time.time_ns(), None)
        except Exception as err:
            return BranchOutcome(started, time.time_ns(), err)

    if async_mode:
        return list(await asyncio.gather(*(call_async(i) for i in range(len(is_async)))))
    others = [pool.get().submit(call_sync, i) for i in range(1, len(is_async))]
    done = [call_sync(0)] if is_async else []
    return done + [future.result() for future in others]


def fork_conflict(ids: list[str], recs: list[StepRecorder]) -> Optional[ForkConflictError]:
    """Two branches conflict when one sets/deletes a path the other also touches (appends merge)."""
    touched: list[tuple[list[Path], list[Path]]] = []
    for rec in recs:
        ops = changes(rec)
        sets = [p for p, verb, _ in ops if verb != "append"]
        appends = [p for p, verb, _ in ops if verb == "append"]
        touched.append((sets, appends))
    if not any(sets for sets, _ in touched):  # only appends (parallel tool calls): they all merge
        return None
    for i in range(len(recs)):
        for j in range(i + 1, len(recs)):
            for p in touched[i][0]:
                for q in touched[j][0] + touched[j][1]:
                    if p[: len(q)] == q or q[: len(p)] == p:
                        return ForkConflictError(format_path(p), ids[i], ids[j])
            for p in touched[i][1]:
                for q in touched[j][0]:
                    if p[: len(q)] == q or q[: len(p)] == p:
                        return ForkConflictError(format_path(q), ids[i], ids[j])
    return None


def merge_branch(state: RunState, rec: StepRecorder) -> None:
    """Merge a fork branch's writes into committed state, copying containers on the way."""
    data = state.data
    for path, verb, value in changes(rec):
        root = path[0]
        if len(path) > 1 or verb != "set":
            # copy every container the write goes through (for an append, the list itself too)
            data[root] = _copy_along(data[root], path[1:] if verb == "append" else path[1:-1])
        apply_write(data, path, verb, unwrap(value), state.schema.default)
    state.last_write.update(rec.own)


def changes(rec: StepRecorder) -> list[tuple[Path, str, Any]]:
    """A parallel step's changes, path by path (`StepRecorder.ops`, kept by every step that runs beside others)."""
    if rec.ops is None:
        raise TracememError(f"internal: the recorder of parallel step {rec.step} ('{rec.stage}') kept no changes")
    return rec.ops


def _copy_along(value: Any, rest: tuple) -> Any:
    """Shallow-copy each container on a path so committed values are never shared in place."""
    if isinstance(value, list):
        copy: Any = list(value)
    elif isinstance(value, dict):
        copy = dict(value)
    elif isinstance(value, BaseModel):
        copy = value.model_copy()
    else:
        return value
    if rest:
        key = rest[0]
        if isinstance(copy, (list, dict)):
            copy[key] = _copy_along(copy[key], rest[1:])
        else:
            copy.__dict__[key] = _copy_along(getattr(copy, key), rest[1:])
    return copy
