"""store/switching.py: the switch interval is short while any writer writes, and the application's comes back."""
from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from tracemem.store import Store
from tracemem.store.switching import WRITING_SWITCH_INTERVAL, quick_switching


def test_the_applications_interval_comes_back_after_nested_writers():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.003)
    app = sys.getswitchinterval()
    try:
        with quick_switching():
            short = sys.getswitchinterval()
            assert abs(short - WRITING_SWITCH_INTERVAL) < 1e-6
            with quick_switching():  # a second store's writer, overlapping
                assert sys.getswitchinterval() == short
            assert sys.getswitchinterval() == short  # the first still writes
        assert sys.getswitchinterval() == app
    finally:
        sys.setswitchinterval(before)


def test_a_shorter_application_interval_is_left_alone():
    before = sys.getswitchinterval()
    sys.setswitchinterval(WRITING_SWITCH_INTERVAL / 5)
    app = sys.getswitchinterval()  # (as the interpreter keeps it: whole microseconds)
    try:
        with quick_switching():
            assert sys.getswitchinterval() == app
        assert sys.getswitchinterval() == app
    finally:
        sys.setswitchinterval(before)


def test_a_failing_batch_puts_the_interval_back():
    before = sys.getswitchinterval()
    try:
        with quick_switching():
            raise OSError("disk full")
    except OSError:
        pass
    assert sys.getswitchinterval() == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_batch_gets_the_applications_interval_back():
    before = sys.getswitchinterval()
    with quick_switching():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report its interval, then leave without running pytest's exit handlers
            os.write(write, repr(sys.getswitchinterval()).encode())
            os._exit(0)
        os.close(write)
        seen = float(os.read(read, 64).decode())
        os.waitpid(pid, 0)
    assert seen == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_the_background_writer_runs_at_a_lower_cpu_priority_than_the_flows_thread(tmp_path) -> None:
    from tracemem.store.background_priority import WRITER_NICENESS

    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with Store(str(tmp_path / "p.duckdb")) as store:
        _flow().run({}, store=store)
        writer = store.writer._thread
        assert writer is not None and writer.native_id is not None
        deadline = time.monotonic() + 10
        while os.getpriority(os.PRIO_PROCESS, writer.native_id) == main and time.monotonic() < deadline:
            time.sleep(0.01)  # (it lowers itself as it starts)
        assert os.getpriority(os.PRIO_PROCESS, writer.native_id) == min(19, main + WRITER_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main  # the flow's thread: untouched


def _flow():
    from pydantic import BaseModel

    from tracemem import Pipeline

    class One(BaseModel):
        n: int = 0

    def bump(s) -> None:
        s.n = s.n + 1
    return Pipeline("one", One).then(bump).build()
