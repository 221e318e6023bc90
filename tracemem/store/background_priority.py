"""The store's background writer runs at a lower CPU priority than the threads it records.

Why: the writer's DuckDB work (~5 µs of CPU per stage recorded) runs beside the flow's
thread, and on a machine with few cores the kernel would share a core between them
whenever DuckDB's own threads are busy too: the flow's thread then waits for the CPU,
not for the disk. At a nice value 10 above the process's, the writer takes the CPU
the flows leave; on an idle core it runs as fast as before. Measured with the writer
chasing a producer (2 cores, 2,000 runs and their flush per measurement): 10.6 -> 10.3
µs/stage. A writer that falls behind is bounded by the backlog as ever (flow.run waits
for room).

Linux only: there a thread's nice value is its own (setpriority with its thread id);
elsewhere the call would renice the whole process, so it is not made.
"""
from __future__ import annotations

import os
import sys
import threading

__all__ = ["WRITER_NICENESS", "lower_this_thread"]

WRITER_NICENESS = 10  # added to the thread's nice value (at most 19)


def lower_this_thread() -> bool:
    """Lower the calling thread's CPU priority by `WRITER_NICENESS`; whether it could."""
    if not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICENESS))
    except OSError:  # a sandbox that forbids it: the writer runs at the process's priority
        return False
    return True
