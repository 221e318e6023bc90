"""store/handoff.py: the flow's thread hands the GIL over without changing anything else about itself."""
from __future__ import annotations

import sys

import pytest

from tracemem.store import handoff


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is a Linux thread attribute")
def test_yield_gil_gives_the_thread_its_own_timer_slack_back():
    prctl = handoff._prctl()
    assert prctl is not None
    before = prctl(handoff.PR_GET_TIMERSLACK, 0, 0, 0, 0)
    prctl(handoff.PR_SET_TIMERSLACK, 123_000, 0, 0, 0)
    try:
        handoff.yield_gil()
        assert prctl(handoff.PR_GET_TIMERSLACK, 0, 0, 0, 0) == 123_000
    finally:
        prctl(handoff.PR_SET_TIMERSLACK, before, 0, 0, 0)

