"""Running a flow while its events are read: what `flow.stream()` and `flow.astream()` drive.

The run goes on a worker thread of its own (under its own event loop when the flow
has async stages) and hands each event to a queue the caller reads. A thread, for
both: a stage that calls a model synchronously would otherwise hold the caller's
event loop for the whole call (and every other request of a web server with it),
and no token could reach the caller before the stage ended.

Closing the stream early (`break`, `close()`, `aclose()`, an exception in the loop
body) stops the run before its next step: the step in flight finishes and is
recorded, an async flow's task is cancelled, and the run is recorded `interrupted`
with everything it did so far. Closing waits for that, so the record is complete
when the loop is left.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from ..errors import RunCancelled
from .events import EventFeed, FlowEvent
from .runner import Execution
from .sync import run_sync

_END = object()


class _Raised:
    """An error the worker hit before or outside the run's own record (re-raised to the reader)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Worker:
    """Runs one Execution on its own thread, posting its events (and then `_END`) through `post`."""

    def __init__(self, exe: Execution, has_async: bool, post: Callable[[Any], None]) -> None:
        self.exe, self.has_async, self.post = exe, has_async, post
        exe.events = EventFeed(post)
        exe.listeners.append(exe.events)
        exe.cancel = threading.Event()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.task: Optional[asyncio.Task[Any]] = None
        self.thread = threading.Thread(target=self.main, name="tracemem-stream", daemon=True)

    def main(self) -> None:
        try:
            if self.has_async:
                asyncio.run(self.execute_async())
            else:
                run_sync(self.exe.execute(False, async_mode=False), "internal: a sync flow suspended while streaming")
        except (RunCancelled, asyncio.CancelledError):
            pass  # the reader left; the run is recorded `interrupted`
        except BaseException as err:  # bad inputs, a sink failing: the reader gets it raised
            self.post(_Raised(err))
        finally:
            self.post(_END)

    async def execute_async(self) -> None:
        self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
        if self.exe.cancel is not None and self.exe.cancel.is_set():
            raise RunCancelled("the event stream was closed before the run started")
        await self.exe.execute(False, async_mode=True)

    def stop(self) -> None:
        """Stop before the next step; an async flow's task is cancelled where it awaits."""
        if self.exe.cancel is not None:
            self.exe.cancel.set()
        loop, task = self.loop, self.task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop has closed: the run is over already
                pass


def stream_run(exe: Execution, has_async: bool) -> Iterator[FlowEvent]:
    """The events of `exe`'s run as they happen (see the module docstring)."""
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    worker = _Worker(exe, has_async, events.put)
    worker.thread.start()
    finished = False
    try:
        while True:
            item = events.get()
            if item is _END:
                finished = True
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        if not finished:
            worker.stop()
            worker.thread.join()


async def astream_run(exe: Execution, has_async: bool) -> AsyncIterator[FlowEvent]:
    """`stream_run` for async code: the run's thread hands each event to this loop."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Any] = asyncio.Queue()
    holder: dict[str, _Worker] = {}

    def post(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, item)
        except RuntimeError:  # the reader's loop is gone: stop the run
            holder["worker"].stop()

    worker = holder["worker"] = _Worker(exe, has_async, post)
    worker.thread.start()
    finished = False
    try:
        while True:
            item = await events.get()
            if item is _END:
                finished = True
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        if not finished:
            worker.stop()
            while not finished:  # the run's thread ends after recording it; the loop stays free meanwhile
                finished = (await events.get()) is _END
