"""Forks: running parallel branches and merging what they wrote.

Sync branches run in threads (the first in the caller's thread), async ones under
`asyncio.gather` (sync ones then via `asyncio.to_thread`). Each branch writes into
its own buffer; the merge applies them in declared order — so appends to one list
merge in that order — after checking that no two branches set the same path.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel

from .errors import ForkConflictError, TracememError
from .paths import Path, apply_write, format_path
from .pipeline import StageSpec
from .scope import RunState, StageScope, unwrap

if TYPE_CHECKING:
    from .runner import _Execution

Outcome = tuple[int, int, Any, Optional[BaseException]]  # started, ended, stage context, error
_POOL: Optional[ThreadPoolExecutor] = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="tracemem-fork")
    return _POOL


async def run_branches(exe: "_Execution", specs: list[StageSpec], begun: list[tuple[StageScope, int]]
                       ) -> list[Outcome]:
    """Run every branch to completion; errors are returned, not raised."""

    def call_sync(i: int) -> Outcome:
        started = time.time_ns()
        try:
            coro = exe._call(specs[i], begun[i][0], begun[i][1])
            try:
                coro.send(None)
            except StopIteration as done:
                return started, time.time_ns(), done.value[1], None
            coro.close()
            raise TracememError("internal: a sync fork branch suspended")
        except Exception as err:
            return started, time.time_ns(), None, err

    async def call_async(i: int) -> Outcome:
        if not specs[i].is_async:
            return await asyncio.to_thread(call_sync, i)
        started = time.time_ns()
        try:
            _, ctx = await exe._call(specs[i], begun[i][0], begun[i][1])
            return started, time.time_ns(), ctx, None
        except Exception as err:
            return started, time.time_ns(), None, err

    if exe.async_mode:
        return list(await asyncio.gather(*(call_async(i) for i in range(len(specs)))))
    else:
        futures = [_pool().submit(call_sync, i) for i in range(1, len(specs))]
        return [call_sync(0)] + [f.result() for f in futures]



def fork_conflict(specs: list[StageSpec], recs: list[StageScope]
                   ) -> tuple[Optional[ForkConflictError], Any]:
    """Two branches conflict when one sets/deletes a path the other also touches (appends merge)."""
    touched: list[tuple[list[Path], list[Path]]] = []
    for rec in recs:
        sets = [p for p, verb, _ in rec.ops if verb != "append"]
        appends = [p for p, verb, _ in rec.ops if verb == "append"]
        touched.append((sets, appends))
    for i in range(len(recs)):
        for j in range(i + 1, len(recs)):
            for p in touched[i][0]:
                for q in touched[j][0] + touched[j][1]:
                    if p[: len(q)] == q or q[: len(p)] == p:
                        return ForkConflictError(format_path(p), specs[i].id, specs[j].id), (i, j)
            for p in touched[i][1]:
                for q in touched[j][0]:
                    if p[: len(q)] == q or q[: len(p)] == p:
                        return ForkConflictError(format_path(q), specs[i].id, specs[j].id), (i, j)
    return None, None


def apply_ops(state: RunState, ops: list[tuple[Path, str, Any]]) -> None:
    """Merge a fork branch's writes into committed state, copying containers on the way."""
    data = state.data
    for path, verb, value in ops:
        root = path[0]
        if len(path) > 1 or verb != "set":
            # copy every container the write goes through (for an append, the list itself too)
            data[root] = _copy_along(data[root], path[1:] if verb == "append" else path[1:-1])
        apply_write(data, path, verb, unwrap(value), state.schema.default)


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
