"""SIGTERM writes queued runs, as exit does — for the `tracemem` command only.

A process stopped with SIGTERM (`docker stop`, `kill`, systemd) runs no atexit hooks
by default. On a DuckDB file that loses nothing (every returned run is in the run
journal, folded in at the next open); on `:memory:` or PostgreSQL the runs still
queued would be lost. The `tracemem` command (the demo, the viewer) therefore installs
a handler that flushes every open store, restores the default action and sends SIGTERM
again, so the process still ends as terminated (exit status -15). The library never
installs one: an application decides what SIGTERM does and closes its stores in its own
shutdown hook. A handler already installed (or SIG_IGN) is left alone.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

FLUSH_TIMEOUT = 20.0  # seconds the handler waits for the flush before terminating anyway


def install_sigterm_flush(flush_all: Callable[[], None]) -> bool:
    """Install the handler if SIGTERM has its default action and this is the main thread; True if installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
    except (AttributeError, ValueError):  # no SIGTERM on this platform
        return False
    previous = signal.SIG_DFL

    def on_sigterm(signum: int, frame: Any) -> None:
        # flush in a helper thread: this frame may hold the writer's locks, and a flush here would wait forever
        helper = threading.Thread(target=flush_all, name="tracemem-sigterm-flush", daemon=True)
        helper.start()
        helper.join(FLUSH_TIMEOUT)
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    return True
