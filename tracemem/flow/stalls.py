"""Running a set of sync branches in the caller's thread, with helper threads only once a branch stalls.

Why: handing a branch to another thread costs tens of µs on a busy machine (a wake-up,
then the two threads taking turns at the GIL), which is more than a quick branch — a
tool that looks something up in memory — costs to run. Yet a branch that waits (a tool
calling a server) must not hold the others up. So the caller's thread claims and runs
the branches one after another, and a watcher thread (one per process, started on first
use, asleep while no branch set runs) checks every `STALL_AFTER` seconds: a set where
no branch was claimed for that long while some are left — every thread in it is stuck
in a branch — turns eager and gets a helper. From then on it works as before: whoever
claims a branch while others are left wakes one more helper unless one is on its way,
so each blocked branch brings the next helper. Quick branches never leave the caller's
thread; slow ones start at most `STALL_AFTER` (plus a wake-up) late. A branch that
holds the GIL gains nothing from a helper anyway; the watcher gets its turn when the
branch waits, which is when a helper helps.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Executor
from typing import Callable, Generic, Optional, TypeVar

T = TypeVar("T")

STALL_AFTER = 0.001  # seconds without a claim (while branches are left) before a set gets helpers
LINGER = 0.05  # seconds the watcher keeps watching after the last set ended, before it sleeps untimed


class ClaimSet(Generic[T]):
    """`call(i)` for every i < count, claimed one by one by the caller's thread and any helpers."""

    def __init__(self, call: Callable[[int], T], count: int, pool: Executor) -> None:
        self.call, self.count, self.pool = call, count, pool
        self.outcomes: list[Optional[T]] = [None] * count
        self.next = 0  # the next branch to claim
        self.claimed_at = time.monotonic()
        self.eager = False  # a branch stalled: claims wake helpers
        self.waking = 0  # helpers on their way
        self.left = count  # branches not finished
        self.lock = threading.Lock()
        self.finished: Optional[threading.Event] = None  # made when helpers are called in: they may finish last

    def run(self, watch: "StallWatch") -> list[T]:
        if self.count == 1:  # nothing to run beside it
            self.work(False)
            return self.outcomes  # type: ignore[return-value]
        watch.add(self)
        try:
            self.work(False)
            with self.lock:
                finished = self.finished if self.left else None
            if finished is not None:
                finished.wait()
        finally:
            watch.discard(self)
        return self.outcomes  # type: ignore[return-value]

    def work(self, helper: bool) -> None:
        """Run branches until none is left to start."""
        lock = self.lock
        if helper:
            with lock:
                self.waking -= 1
        while True:
            with lock:
                i = self.next
                if i >= self.count:
                    return
                self.next = i + 1
                self.claimed_at = time.monotonic()
                wake = self.eager and i < self.count - 1 and not self.waking
                if wake:
                    self.waking += 1
            if wake:
                self.pool.submit(self.work, True)
            self.outcomes[i] = self.call(i)
            with lock:
                self.left -= 1
                if not self.left and self.finished is not None:
                    self.finished.set()

    def poke(self, now: float) -> None:
        """The watcher's check: branches are left and none was claimed for `STALL_AFTER`: get a helper."""
        with self.lock:
            if self.eager or self.next >= self.count or now - self.claimed_at < STALL_AFTER:
                return
            self.eager = True
            self.finished = threading.Event()
            self.waking += 1
        self.pool.submit(self.work, True)


class StallWatch:
    """The watcher thread: pokes every running claim set each `STALL_AFTER` (see the module docstring)."""

    def __init__(self) -> None:
        self._sets: set[ClaimSet] = set()
        self._cond = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None
        self._idle = False

    def add(self, claims: ClaimSet) -> None:
        with self._cond:
            self._sets.add(claims)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="tracemem-fork-watch", daemon=True)
                self._thread.start()
            elif self._idle:
                self._idle = False
                self._cond.notify()

    def discard(self, claims: ClaimSet) -> None:
        with self._cond:
            self._sets.discard(claims)

    def _watch(self) -> None:
        quiet_since: Optional[float] = None
        while True:
            time.sleep(STALL_AFTER)
            now = time.monotonic()
            with self._cond:
                if not self._sets:
                    if quiet_since is None:
                        quiet_since = now
                    elif now - quiet_since > LINGER:
                        self._idle = True
                        while self._idle:
                            self._cond.wait()
                        quiet_since = None
                    continue
                quiet_since = None
                sets = list(self._sets)
            for claims in sets:
                claims.poke(now)
