"""Handing the GIL to the background writer: a zero sleep that lasts microseconds, not 50.

Why: a flow's thread that never blocks (its journal append is a memory copy) gives the
GIL up only when the interpreter forces a switch, every 5 ms, so it sleeps zero once
per run while the writer is busy (`Writer.busy`). But Linux rounds every sleep up by the
thread's timer slack, 50 µs by default: each such sleep cost the flow's thread 55–75 µs,
~2 µs per stage. `yield_gil` sleeps with the calling thread's slack at 1 ns (then ~15 µs
here) and gives the thread its own slack back, so nothing else about the caller's thread
changes. Elsewhere (not Linux, no libc) it is `time.sleep(0)`.
"""
from __future__ import annotations

import ctypes
import sys
import time
from typing import Any, Callable, Optional

__all__ = ["yield_gil"]

PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30  # <linux/prctl.h>


def _prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Any = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _yield_gil(prctl: Callable[..., int]) -> Callable[[], None]:
    def yield_gil() -> None:
        """Let a thread waiting for the GIL take it: sleep zero with a 1 ns timer slack."""
        slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
        if slack <= 0 or prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) != 0:
            time.sleep(0)
            return
        try:
            time.sleep(0)
        finally:
            prctl(PR_SET_TIMERSLACK, slack, 0, 0, 0)
    return yield_gil


def _plain_sleep() -> None:
    time.sleep(0)


_PRCTL = _prctl()
yield_gil: Callable[[], None] = _yield_gil(_PRCTL) if _PRCTL is not None else _plain_sleep
