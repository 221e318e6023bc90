"""SIGTERM writes queued runs, as exit does.

A process stopped with SIGTERM (`docker stop`, `kill`, systemd) runs no atexit
hooks by default, so runs that `flow.run` had returned but the background writer
had not yet written were lost. When a store opens in the main thread and SIGTERM
still has its default action, tracemem installs a handler that flushes every open
store, restores the default action and sends SIGTERM again: the process still ends
as terminated by SIGTERM (exit status -15), never swallowing the signal. A handler
the application installed (or SIG_IGN) is left alone: it decides what SIGTERM does,
and if it exits, the usual exit flush runs.
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
