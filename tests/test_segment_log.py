"""The journal's segment log: round trips, damage detection, checkpoints, threads, and real SIGKILLs."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tracemem import TracememError
from tracemem.store.log_format import RECORD_HEADER, SEGMENT_HEADER, frame, journal_dir, scan
from tracemem.store.segment_log import JournalError, JournalLockedError, SegmentLog


def payloads(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [f"record {i} ".encode() + rng.randbytes(rng.randint(1, 300)) for i in range(n)]


def only_segment(path: Path) -> Path:
    (seg,) = sorted(path.glob("*.seg"))
    return seg


LAYOUTS = {"appended": {"preallocate": False, "mapped": False},  # pwrite, the file grows with each record
           "preallocated": {"preallocate": True, "mapped": False},  # pwrite into an allocated segment
           "mapped": {"preallocate": False, "mapped": True}}  # copies into a mapping (the default without fsync)


@pytest.fixture(params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> dict[str, bool]:
    return LAYOUTS[request.param]


def test_round_trip_and_reopen(tmp_path: Path, layout: dict[str, bool]) -> None:
    data = payloads(200)
    with SegmentLog(tmp_path / "j", **layout, segment_bytes=8192) as log:
        ends = [log.append(d) for d in data]
        got = log.read()
        assert [r.data for r in got.records] == data
        assert [r.end for r in got.records] == ends and got.damage == [] and got.upto == log.end == ends[-1]
        assert len(list((tmp_path / "j").glob("*.seg"))) > 3  # rotated
    with SegmentLog(tmp_path / "j", **layout, segment_bytes=8192) as log:
        assert log.opening_damage == [] and log.end == ends[-1]
        more = payloads(5, seed=1)
        log.append_many(more)
        assert [r.data for r in log.records()] == data + more
        assert [r.data for r in log.records(after=ends[99])] == data[100:] + more


def test_readonly_reader_sees_what_the_writer_appended(tmp_path: Path) -> None:
    with SegmentLog(tmp_path / "j") as log:
        log.append(b"one")
        reader = SegmentLog(tmp_path / "j", readonly=True)
        assert [r.data for r in reader.records()] == [b"one"]
        with pytest.raises(JournalError, match="readonly"):
            reader.append(b"x")
    with pytest.raises(JournalError, match="no journal"):
        SegmentLog(tmp_path / "absent", readonly=True)


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path: Path, layout: dict[str, bool]) -> None:
    data = payloads(4)
    src = tmp_path / "src"
    with SegmentLog(src, **layout, segment_bytes=4096) as log:
        ends = [log.append(d) for d in data]
    image = only_segment(src).read_bytes()
    last_start = ends[-2]  # the segment starts at LSN 0, so LSNs are file offsets
    for cut in range(last_start, ends[-1]):
        torn = tmp_path / f"cut{cut}"
        torn.mkdir()
        # a killed writer leaves the file cut short; a preallocated (or mapped) one, zeros after the cut
        rest = bytes(len(image) - cut) if layout != LAYOUTS["appended"] else b""
        (torn / only_segment(src).name).write_bytes(image[:cut] + rest)
        with SegmentLog(torn, **layout, segment_bytes=4096) as log:
            if cut == last_start:  # nothing of the last record reached the file: a clean end
                assert log.opening_damage == []
            else:
                (damage,) = log.opening_damage
                assert damage.lsn == last_start and damage.offset == last_start, (cut, damage)
                assert damage.reason
            got = log.read()
            assert [r.data for r in got.records] == data[:-1], cut
            log.append(b"after")  # the log stays usable: appends go to a new segment after the damage
            assert [r.data for r in log.records()] == data[:-1] + [b"after"]
            log.checkpoint(got.upto)
            assert [r.data for r in log.records()] == [b"after"]


def test_flipped_bits_are_detected_never_applied(tmp_path: Path) -> None:
    data = payloads(6)
    src = tmp_path / "src"
    with SegmentLog(src) as log:
        ends = [log.append(d) for d in data]
    image = bytearray(only_segment(src).read_bytes())
    victim_start, victim_end = ends[2], ends[3]  # the fourth record
    for pos in range(victim_start, victim_end, 7):
        for bit in (0, 5):
            bad = bytearray(image)
            bad[pos] ^= 1 << bit
            _, end, reason = scan(bytes(bad), len(bad), 1 << 20)
            assert end == victim_start and reason is not None, (pos, bit)
    bad = bytearray(image)
    bad[victim_start + RECORD_HEADER + 3] ^= 0x10
    only_segment(src).write_bytes(bytes(bad))
    with SegmentLog(src) as log:
        (damage,) = log.opening_damage
        assert damage.reason == "checksum mismatch" and damage.skipped == len(bad) - victim_start
        got = log.read()
        assert [r.data for r in got.records] == data[:3]
        assert got.damage == [damage]


def test_checkpoint_deletes_only_what_is_applied(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with SegmentLog(path, segment_bytes=4096) as log:
        ends = [log.append(d) for d in payloads(120)]
        segments = sorted(path.glob("*.seg"))
        assert len(segments) >= 4
        with pytest.raises(JournalError, match="past the journal's end"):
            log.checkpoint(log.end + 1)
        log.checkpoint(ends[59])
        starts = sorted(int(p.stem, 16) for p in path.glob("*.seg"))
        assert starts[0] <= ends[59]  # the segment holding unapplied records stays
        assert all(p.exists() for p in segments if int(p.stem, 16) >= starts[0])
        assert [r.end for r in log.records()] == ends[60:]
        log.checkpoint(ends[10])  # going back is a no-op
        assert log.applied == ends[59]
    with SegmentLog(path, segment_bytes=4096) as log:
        assert log.applied == ends[59] and [r.end for r in log.records()] == ends[60:]
        assert [r.end for r in log.records(after=0)][-60:] == ends[60:]  # the caller may ask for more
        log.checkpoint(log.end)
        assert log.read().records == [] and len(list(path.glob("*.seg"))) == 1


def test_recovery_replayed_twice_is_the_same(tmp_path: Path) -> None:
    """A crash after applying but before checkpoint replays the same records, with the same LSNs."""
    path = tmp_path / "j"
    with SegmentLog(path) as log:
        log.append_many(payloads(30))
    with SegmentLog(path) as log:
        first = log.read()
    with SegmentLog(path) as log:  # "crashed" before checkpoint
        second = log.read()
        assert second == first
        log.checkpoint(second.upto)
    with SegmentLog(path) as log:
        assert log.read().records == []


def test_concurrent_appends_from_threads(tmp_path: Path, layout: dict[str, bool]) -> None:
    threads, per = 8, 300
    with SegmentLog(tmp_path / "j", **layout, segment_bytes=16384) as log:
        def work(t: int) -> None:
            for i in range(per):
                log.append(f"{t}:{i}:".encode() + bytes([t]) * (i % 50 + 1))
        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        got = log.read()
    assert got.damage == []
    seen: dict[int, list[int]] = {}
    for r in got.records:
        t, i, rest = r.data.split(b":", 2)
        assert rest == bytes([int(t)]) * (int(i) % 50 + 1)
        seen.setdefault(int(t), []).append(int(i))
    assert seen == {t: list(range(per)) for t in range(threads)}  # each thread's records, in its order


def test_group_commit_shares_fdatasyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = os.fdatasync

    def slow_disk(fd: int) -> None:
        calls.append(fd)
        time.sleep(0.002)  # so that appenders pile up behind a running sync
        real(fd)
    with SegmentLog(tmp_path / "j", fsync=True) as log:
        monkeypatch.setattr(os, "fdatasync", slow_disk)
        pool = [threading.Thread(target=lambda: [log.append(b"x" * 100) for _ in range(20)]) for _ in range(8)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        assert len(log.read().records) == 160
        assert 0 < len(calls) < 160  # every append returned synced, with fewer fdatasyncs than appends
        assert log.sync() == log.end


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    with SegmentLog(tmp_path / "j"):
        with pytest.raises(JournalLockedError, match=f"process {os.getpid()}"):
            SegmentLog(tmp_path / "j")
    SegmentLog(tmp_path / "j").close()  # released on close


def test_bad_input_and_closed_log(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "j", max_record=100)
    for bad in (b"", b"x" * 101):
        with pytest.raises(JournalError, match="1 to 100 bytes"):
            log.append(bad)
    assert issubclass(JournalError, TracememError)
    log.close()
    with pytest.raises(JournalError, match="closed"):
        log.append(b"x")
    with pytest.raises(JournalError, match="at least 4096"):
        SegmentLog(tmp_path / "k", segment_bytes=16)


def test_damaged_marker_and_foreign_files_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with SegmentLog(path) as log:
        end = log.append(b"one")
        log.checkpoint(end)
        log.append(b"two")
    (path / "applied").write_bytes(b"garbage")
    (path / "notes.seg").write_bytes(b"hello")
    with SegmentLog(path) as log:
        reasons = sorted(d.reason for d in log.opening_damage)
        assert any("marker" in r for r in reasons) and any("not a segment name" in r for r in reasons)
        assert [r.data for r in log.records()] == [b"one", b"two"]  # at-least-once from the oldest segment


def test_the_marker_is_rewritten_in_place_and_an_empty_one_is_no_marker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "j"
    with SegmentLog(path) as log:
        first = log.append(b"one")
        marker = (path / "applied").stat().st_ino
        monkeypatch.setattr(os, "replace", lambda *a: pytest.fail("a checkpoint renamed a file"))
        log.checkpoint(first)
        second = log.append(b"two")
        log.checkpoint(second)
        monkeypatch.undo()
        assert (path / "applied").stat().st_ino == marker and (path / "applied").stat().st_size == 12
    with SegmentLog(path) as log:
        assert log.applied == second and log.opening_damage == [] and list(log.records()) == []
    (path / "applied").write_bytes(b"")  # created, then a crash before its first checkpoint
    with SegmentLog(path) as log:
        assert log.applied == 0 and log.opening_damage == []
        assert [r.data for r in log.records()] == [b"one", b"two"]


def test_a_new_markers_directory_entry_is_synced_once_with_its_first_synced_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracemem.store.checkpoint_marker as checkpoint_marker

    synced: list[Path] = []
    monkeypatch.setattr(checkpoint_marker, "fsync_dir", synced.append)
    with SegmentLog(tmp_path / "j") as log:  # without fsync: opening and unsynced checkpoints sync nothing
        log.checkpoint(log.append(b"one"))
        assert synced == []
        log.checkpoint(log.append(b"two"), sync=True)
        log.checkpoint(log.append(b"three"), sync=True)
        assert synced == [tmp_path / "j"]
    with SegmentLog(tmp_path / "j") as log:  # an existing marker's entry is durable already
        log.checkpoint(log.append(b"four"), sync=True)
        assert synced == [tmp_path / "j"]


def test_segment_with_a_bad_header_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with SegmentLog(path, segment_bytes=4096) as log:
        for d in payloads(40):
            log.append(d)
    first = sorted(path.glob("*.seg"))[0]
    image = bytearray(first.read_bytes())
    image[0] ^= 0xFF
    first.write_bytes(bytes(image))
    with SegmentLog(path, segment_bytes=4096) as log:
        got = log.read()
        assert got.damage[0].reason.startswith("not a journal segment") and got.damage[0].segment == str(first)
        assert got.records and got.records[0].lsn > int(first.stem, 16)
        log.checkpoint(got.upto)
        assert not first.exists()


@pytest.mark.parametrize("left", [b"", bytes(4096)], ids=["empty", "preallocated-zeros"])
def test_a_segment_left_headerless_by_a_crash_is_reused(tmp_path: Path, left: bytes) -> None:
    path = tmp_path / "j"
    with SegmentLog(path) as log:
        end = log.append(b"one")
    (path / f"{end:016x}.seg").write_bytes(left)  # created (maybe preallocated), killed before its header
    with SegmentLog(path) as log:
        assert log.opening_damage == []
        assert [r.data for r in log.read().records] == [b"one"]
        log.append(b"two")
        assert [r.data for r in log.read().records] == [b"one", b"two"]


def test_layout_helpers(tmp_path: Path) -> None:
    assert journal_dir(tmp_path / "agent.duckdb") == tmp_path / "agent.duckdb.journal"
    assert len(frame(b"abc")) == RECORD_HEADER + 3 and SEGMENT_HEADER == 24


CHILD = r"""
import os, sys
from tracemem.store.segment_log import SegmentLog
path, fsync, start = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
log = SegmentLog(path, fsync=fsync, segment_bytes=8192)
out = os.fdopen(1, "w", buffering=1)
i = start
while True:
    out.write(f"B {i}\n")
    log.append((f"{i}:" + "x" * (i % 700)).encode())
    out.write(f"A {i}\n")
    i += 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("fsync", [False, True], ids=["process-crash", "fsync"])
def test_sigkill_at_random_points_loses_nothing_acknowledged(tmp_path: Path, fsync: bool) -> None:
    """A child appends numbered records and says so before and after each append; it is SIGKILLed
    at a random moment, 30 times over one journal. Every acknowledged record is there, once, whole;
    nothing is there that was never begun; and the journal always reopens."""
    path = tmp_path / "j"
    rng = random.Random(20)
    expected: list[int] = []
    for trial in range(30):
        next_seq = expected[-1] + 1 if expected else 0
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), "1" if fsync else "0", str(next_seq)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        begun = acked = next_seq - 1
        early = trial % 5 == 0  # now and then, kill it while it starts up or opens the journal
        deadline = time.monotonic() + (rng.uniform(0.0, 0.15) if early else rng.uniform(0.05, 0.3))
        while time.monotonic() < deadline or (acked < next_seq and not early):
            line = child.stdout.readline()
            if not line:
                break
            kind, seq = line.split()
            begun, acked = (int(seq), acked) if kind == "B" else (begun, int(seq))
        child.send_signal(signal.SIGKILL)
        for line in child.stdout:  # what it said before it died
            kind, seq = line.split()
            begun, acked = (int(seq), acked) if kind == "B" else (begun, int(seq))
        child.wait()
        with SegmentLog(path, segment_bytes=8192) as log:  # always reopens
            records = log.read().records
        got = []
        for r in records:
            seq, body = r.data.split(b":")
            assert body == b"x" * (int(seq) % 700), f"trial {trial}: record {int(seq)} is not whole"
            got.append(int(seq))
        must = expected + list(range(next_seq, acked + 1))
        assert got[:len(must)] == must, f"trial {trial}: acknowledged records missing or out of order"
        extra = got[len(must):]
        assert extra == [] or (extra == [acked + 1] and begun == acked + 1), (
            f"trial {trial}: records {extra} were never begun (begun {begun}, acked {acked})")
        print(f"trial {trial}: acked {acked - next_seq + 1}, in flight {begun > acked}, landed {bool(extra)}")
        expected = got  # the append the kill interrupted may or may not have landed: whole either way
    assert len(expected) > 30


def test_a_few_zero_bytes_after_the_last_record_end_a_preallocated_segment_cleanly() -> None:
    from tracemem.store.log_format import segment_header

    image = segment_header(0, 1) + frame(b"abc")
    for pad in range(0, 12):
        found, end, reason = scan(image + bytes(pad), len(image) + pad, 100, zero_tail_ok=True)
        assert [d for _, d in found] == [b"abc"] and end == len(image) and reason is None, pad
        if pad:  # in a segment that was never preallocated, the same zeros are lost writes
            assert "zero-filled tail" in str(scan(image + bytes(pad), len(image) + pad, 100)[2])


def test_a_short_write_leaves_no_partial_record(tmp_path: Path, layout: dict[str, bool],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fills mid-append writes short: the bytes that did land are cleared (or cut off), so the
    next append starts clean and the log reopens without damage."""
    with SegmentLog(tmp_path / "j", **layout, segment_bytes=4096) as log:
        log.append(b"first")
        real, cut = os.pwrite, [True]

        def half(fd: int, data: bytes, offset: int) -> int:  # the record's write lands half; the rest works
            if cut and len(data) > 1000:
                cut.clear()
                return real(fd, data[: len(data) // 2], offset)
            return real(fd, data, offset)
        monkeypatch.setattr(os, "pwrite", half)
        with pytest.raises(JournalError, match="short write"):
            log.append(b"x" * 200_000)  # larger than a segment: written with pwrite in every layout
        monkeypatch.undo()
        log.append(b"after")
        got = log.read()
        assert [r.data for r in got.records] == [b"first", b"after"] and got.damage == []
    with SegmentLog(tmp_path / "j", **layout, segment_bytes=4096) as log:
        assert log.opening_damage == [] and [r.data for r in log.read().records] == [b"first", b"after"]


def test_appends_go_on_while_a_checkpoint_writes_its_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracemem.store.checkpoint_marker import CheckpointMarker

    log = SegmentLog(tmp_path / "j", segment_bytes=4096)
    ends = [log.append(b"x" * 1000) for _ in range(8)]  # several segments: the checkpoint deletes some
    entered, release = threading.Event(), threading.Event()
    real_write = CheckpointMarker.write

    def slow_write(marker: CheckpointMarker, lsn: int, sync: bool) -> None:
        entered.set()
        assert release.wait(10)
        real_write(marker, lsn, sync)
    monkeypatch.setattr(CheckpointMarker, "write", slow_write)
    checkpointer = threading.Thread(target=log.checkpoint, args=(ends[5],))
    checkpointer.start()
    assert entered.wait(10)
    started = time.monotonic()
    more = [log.append(b"y" * 1000) for _ in range(5)]  # (the checkpoint holds no lock an append takes)
    assert time.monotonic() - started < 5 and checkpointer.is_alive()
    release.set()
    checkpointer.join(10)
    assert log.applied == ends[5] and [r.data for r in log.records()][-5:] == [b"y" * 1000] * 5
    assert more[-1] == log.end
    log.close()


def test_a_log_without_fsync_rotates_without_syncing_and_a_sync_writes_back_every_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracemem.store.segment_log as segment_log

    calls: list[str] = []
    real_fdatasync, real_sync = os.fdatasync, os.sync
    monkeypatch.setattr(segment_log.os, "fdatasync", lambda fd: (calls.append("fdatasync"), real_fdatasync(fd))[1])
    monkeypatch.setattr(segment_log.os, "sync", lambda: (calls.append("sync"), real_sync())[1])
    for fsync in (False, True):
        calls.clear()
        log = SegmentLog(tmp_path / f"j{fsync}", segment_bytes=4096, fsync=fsync)
        for _ in range(12):  # three segments' worth
            log.append(b"z" * 1000, sync=False)
        assert len(log._segments) >= 3
        rotations = calls.count("fdatasync")
        assert rotations == (len(log._segments) - 1 if fsync else 0)  # the flow's append never waits on a disk
        calls.clear()
        assert log.sync() == log.end  # power-loss safe from here: the closed segments too
        assert calls == (["fdatasync"] if fsync else ["sync", "fdatasync"])
        log.close()
