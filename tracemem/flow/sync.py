"""Driving a coroutine that never suspends, without an event loop.

A flow with no async stage runs its one coroutine by hand (`send(None)` once),
which costs nothing next to `asyncio.run`; the same trick runs a sync subflow and
a sync fork branch. One helper, so every caller fails the same way if a
coroutine does suspend.
"""
from __future__ import annotations

from typing import Any, Coroutine, TypeVar

from ..errors import TracememError

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T], suspended: str) -> T:
    """The coroutine's result; raises TracememError(`suspended`) if it tries to wait on anything."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise TracememError(suspended)
