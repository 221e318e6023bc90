"""Per-stage timeouts: `.then(fn, timeout=seconds)`.

The runner's one step path (`Execution._call`) hands a stage with a timeout to
`call_with_timeout`; running past it fails the step with `StageTimeout`, recorded as
the step's error like any other failure, and the run fails.

- An async stage is awaited under `asyncio.wait_for`: at the timeout it is cancelled.
- A sync stage runs in a worker thread that the runner waits for. Python cannot kill
  a thread, so at the timeout the thread is *abandoned*: it runs on until the stage
  function returns, but its step is already recorded as failed, and what it records
  afterwards (scope writes, logs, rows) goes to a recorder nobody reads — it is
  discarded. Side effects outside the recorder (files, HTTP calls, `ctx.store`) still
  happen, so a stage that may hang should bound its own I/O too.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from typing import Any, Callable

from ..errors import StageTimeout
from ..scope.recorder import StepRecorder


def _in_thread(fn: Callable[[], Any], name: str) -> "concurrent.futures.Future[Any]":
    future: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
    context = contextvars.copy_context()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(fn))
        except BaseException as err:  # noqa: BLE001 - handed to the waiting runner
            future.set_exception(err)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def detached(rec: StepRecorder) -> StepRecorder:
    """A recorder holding what `rec` recorded so far, for the failed step of an abandoned stage: the
    abandoned thread keeps writing into `rec`, which nobody reads any more."""
    fresh = StepRecorder(rec.state, rec.step, rec.stage)
    fresh.reads, fresh.logs, fresh.rows = list(rec.reads), list(rec.logs), list(rec.rows)
    fresh.seq = rec.seq
    return fresh


async def call_with_timeout(invoke: Callable[[], Any], stage: str, timeout: float, is_async: bool,
                            async_mode: bool, on_abandon: Callable[[], None]) -> Any:
    """`invoke()` (the stage call) bounded by `timeout` seconds; StageTimeout past it."""
    if is_async:
        task = asyncio.ensure_future(invoke())
        done, _ = await asyncio.wait([task], timeout=timeout)
        if not done:  # (not wait_for: a TimeoutError the stage raises itself must stay its own error)
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - the cancelled stage's last word does not matter
                pass
            raise StageTimeout(stage, timeout, is_async=True)
        return task.result()
    future = _in_thread(invoke, f"tracemem-stage-{stage}")
    if async_mode:  # never block the event loop other stages (fork branches) run on
        done, _ = await asyncio.wait([asyncio.wrap_future(future)], timeout=timeout)
    else:  # a flow without async stages runs without an event loop: waiting here is the step
        done, _ = concurrent.futures.wait([future], timeout=timeout)
    if not done:
        on_abandon()
        raise StageTimeout(stage, timeout, is_async=False)
    return future.result()
