"""Appends through a shared mapping of the active segment (store/mapped_tail.py): no system call per
record, disk space reserved before it is written to, and logs of either layout reopen cleanly."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracemem.store.mapped_tail import FIRST_RESERVE, RESERVE
from tracemem.store.segment_log import JournalError, SegmentLog


def test_an_append_is_a_memory_copy_once_space_is_reserved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentLog(tmp_path / "j")  # the default without fsync
    assert log.mapped
    log.append(b"first")  # reserves the first MiB
    calls: list[str] = []
    for name in ("pwrite", "write", "posix_fallocate"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
    ends = [log.append(b"record %d" % i) for i in range(1000)]
    assert calls == []  # no system call for 1,000 appends within the reservation
    monkeypatch.undo()
    assert [r.data for r in log.read().records] == [b"first"] + [b"record %d" % i for i in range(1000)]
    assert log.read().upto == ends[-1] == log.end
    log.close()


def test_space_is_reserved_ahead_of_the_writes_and_a_sparse_file_holds_the_rest(tmp_path: Path) -> None:
    with SegmentLog(tmp_path / "j", segment_bytes=8 << 20) as log:
        log.append(b"x" * 1000)
        (seg,) = (tmp_path / "j").glob("*.seg")
        assert seg.stat().st_size == 8 << 20  # sized for the mapping ...
        assert seg.stat().st_blocks * 512 <= 2 * FIRST_RESERVE  # ... but one small run uses 64 KiB of disk
        for _ in range(3000):
            log.append(b"y" * 1000)  # 3 MB: reservations double up to a MiB at a time
        assert 3_000_000 < seg.stat().st_blocks * 512 <= 3_024_000 + RESERVE + 64 * 1024
        assert log.read().damage == [] and len(log.read().records) == 3001


def test_a_failed_reservation_is_an_error_and_leaves_no_partial_record(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentLog(tmp_path / "j", segment_bytes=4 << 20)
    log.append(b"kept")

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(JournalError, match="No space left"):
        log.append(b"y" * (RESERVE + 10))  # beyond the first reservation: needs more space
    monkeypatch.undo()
    log.append(b"after")
    assert [r.data for r in log.read().records] == [b"kept", b"after"] and log.read().damage == []
    log.close()


def test_a_file_system_that_cannot_reserve_space_falls_back_to_pwrite(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(fd: int, offset: int, size: int) -> None:
        raise OSError(95, "Operation not supported")
    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    with SegmentLog(tmp_path / "j", segment_bytes=4 << 20) as log:
        ends = [log.append(b"record %d" % i) for i in range(50)]  # no error: the appends go through pwrite
        assert [r.data for r in log.read().records] == [b"record %d" % i for i in range(50)]
    monkeypatch.undo()
    with SegmentLog(tmp_path / "j", segment_bytes=4 << 20) as log:
        assert log.opening_damage == [] and log.end == ends[-1]
        log.append(b"after")
        assert len(log.read().records) == 51


def test_a_record_larger_than_the_mapping_is_written_with_pwrite(tmp_path: Path) -> None:
    big = os.urandom(20_000)
    with SegmentLog(tmp_path / "j", segment_bytes=8192) as log:
        log.append(b"small")
        log.append(big)  # larger than a whole segment: a segment of its own, beyond the mapping
        log.append(b"next")
        assert [r.data for r in log.read().records] == [b"small", big, b"next"]
    with SegmentLog(tmp_path / "j", segment_bytes=8192) as log:
        assert log.opening_damage == [] and [r.data for r in log.read().records] == [b"small", big, b"next"]


@pytest.mark.parametrize("first, then", [(False, True), (True, False)], ids=["pwrite-then-mapped",
                                                                             "mapped-then-pwrite"])
def test_a_log_written_one_way_reopens_the_other_without_damage(tmp_path: Path, first: bool, then: bool) -> None:
    with SegmentLog(tmp_path / "j", mapped=first, segment_bytes=1 << 20) as log:
        log.append(b"one")
    with SegmentLog(tmp_path / "j", mapped=then, segment_bytes=1 << 20) as log:
        assert log.opening_damage == []
        log.append(b"two")
    for mapped in (first, then):
        with SegmentLog(tmp_path / "j", mapped=mapped, segment_bytes=1 << 20) as log:
            assert log.opening_damage == [] and [r.data for r in log.read().records] == [b"one", b"two"]


KILLED = r"""
import os, sys
from tracemem.store.segment_log import SegmentLog
log = SegmentLog(sys.argv[1])
for i in range(500):
    log.append(b"record %d" % i)
os.kill(os.getpid(), 9)  # no close, no flush: only what the kernel holds survives
"""


def test_what_a_killed_process_copied_into_the_mapping_survives_it(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "j")], capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr
    with SegmentLog(tmp_path / "j") as log:
        assert log.opening_damage == []
        assert [r.data for r in log.read().records] == [b"record %d" % i for i in range(500)]
