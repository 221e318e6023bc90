"""The durability table of bench/peers.py: like with like, one section per guarantee.

    python bench/peers.py --section durability [--quick] [--peers ...] [--reps N] [--budget S]

A durable mode is only comparable with a peer's mode that promises the same thing, so the
same 10-stage pipeline runs under every variant, grouped by what survives when `run()` /
`invoke()` returns:

1. not durable at return: tracemem's engine without a store (the floor under every
   tracemem row: a goal below it cannot be met on the machine at hand, and the bench
   says so), tracemem durability="run" (default, batched by a background
   writer; placed here or, when a SIGKILL probe finds it journaled at return, in 2),
   LangGraph without a checkpointer
   and with InMemorySaver, Burr without a persister;
2. process-crash safe at return, per run: tracemem flush_interval=0, LangGraph
   SqliteSaver durability="exit" (synchronous=NORMAL); with a power-loss safe row each
   (tracemem fsync=True when the store has that option; SQLite synchronous=FULL, its
   default) and LangGraph's default durability="async" (each step saved in the background);
3. process-crash safe per stage: tracemem durability="stage", LangGraph SqliteSaver
   durability="sync" and Burr SQLitePersister (a commit after every step), both SQLite
   WAL with synchronous=NORMAL (a commit is in the OS, not on the disk);
4. power-loss safe per stage: tracemem durability="stage" with fsync=True (when the
   store has that option), the same SQLite peers with synchronous=FULL (an fsync of the
   WAL per commit; SQLite's default, which both peers inherit when the caller does not
   set it).

Each variant's µs per stage is the median of interleaved repetitions (as in the overhead
section); every tracemem variant's final flush is timed, so the background writer's work
counts. Its fdatasync and fsync calls per run are counted, not inferred: one child
process builds every variant again and runs each as many runs as its timing did, under
`strace -f -e trace=fsync,fdatasync` with a getppid() marker before and after each one
(sqlite and DuckDB sync from C, which no Python-level wrapper sees; without strace the
child's Python-level os.fsync/os.fdatasync calls are reported instead, marked as such).
The machine's floors are measured in the same process between repetitions with
bench/timing.py's Bench, and the goals are printed met / not met.
Files go to a temporary directory on the working directory's file system, so a sync is
a real one (not tmpfs). Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.timing import Bench, append_fd, real_entries, sqlite_con  # noqa: E402
from bench.overhead import STAGES, build_flow  # noqa: E402
from bench.peer_pipelines import BURR_LAST, Variant, burr_app_factory, initial, langgraph_builder  # noqa: E402
from tracemem.store import Store  # noqa: E402

NOT_AT_RETURN = "not durable at return"
PER_RUN = "process-crash safe at return, per run"
PER_STAGE = "process-crash safe per stage"
POWER = "power-loss safe per stage"
GROUPS = (NOT_AT_RETURN, PER_RUN, PER_STAGE, POWER)
TM_ENGINE = "tracemem engine, no store (the floor under every tracemem row)"
TM_RUN = "tracemem durability=run (default)"
TM_FI0 = "tracemem flush_interval=0"
TM_STAGE = "tracemem durability=stage"
TM_STAGE_FSYNC = "tracemem durability=stage, fsync=True"
TM_FI0_FSYNC = "tracemem flush_interval=0, fsync=True (+ power loss)"
NO_FSYNC = "n/a (this tracemem has no fsync option)"
FLOOR_WRITE = "200 B os.write, O_APPEND"
FLOOR_JSON = "json.dumps of a step entry"
FLOOR_NORMAL = "sqlite3 WAL INSERT+commit, synchronous=NORMAL"
FLOOR_FULL = "sqlite3 WAL INSERT+commit, synchronous=FULL"
FLOOR_FSYNC = "200 B os.write + fdatasync (the fsync floor)"
FLOOR_DUCK = "DuckDB INSERT+commit (file)"
BUDGET_ENGINE, BUDGET_RUN, BUDGET_STAGE = 10, 25, 40  # µs per stage: the budget recording must stay within
LG_EXIT = "langgraph SqliteSaver durability=exit, synchronous=NORMAL"
LG_SYNC = "langgraph SqliteSaver durability=sync, synchronous=NORMAL"
BURR_STEP = "burr SQLitePersister (per step), synchronous=NORMAL"
AHEAD = ((TM_RUN, LG_EXIT, 10), (TM_FI0, LG_EXIT, 10), (TM_STAGE, LG_SYNC, 10), (TM_STAGE, BURR_STEP, 3))
"""Each process-crash-safe tracemem mode, the peer's mode with the same guarantee, and how many times faster."""
MARKER = "getppid"  # a syscall nothing else here makes: brackets each variant in the strace log


def store_has_fsync() -> bool:
    return "fsync" in inspect.signature(Store.__init__).parameters


@dataclass
class Spec:
    """One row: its guarantee, its label, and how to build it in a folder (None: not measurable here)."""
    group: str
    label: str
    build: Optional[Callable[[str], tuple[Variant, list[Any]]]]
    why_not: str = ""


# -- the variants -----------------------------------------------------------------
def tracemem_specs(default_safe: bool = False) -> list[Spec]:
    """default_safe: the probe found durability "run" (the default) process-crash safe at return."""
    flow = build_flow("peers-durability")

    def store(name: str, **kw: Any) -> Callable[[str], tuple[Variant, list[Any]]]:
        def build(folder: str) -> tuple[Variant, list[Any]]:  # every mode's final flush is timed: the
            s = Store(os.path.join(folder, f"tm-{name}.duckdb"), **kw)  # background writer's work counts
            return Variant(name, lambda: flow.run({}, store=s), s.flush), [s]
        return build

    def engine(folder: str) -> tuple[Variant, list[Any]]:
        return Variant("engine", lambda: flow.run({})), []

    fsync = store_has_fsync()
    return [
        Spec(NOT_AT_RETURN, TM_ENGINE, engine),
        Spec(NOT_AT_RETURN if not default_safe else PER_RUN, TM_RUN, store("run", durability="run")),
        Spec(PER_RUN, TM_FI0, store("fi0", durability="run", flush_interval=0)),
        Spec(PER_RUN, TM_FI0_FSYNC, store("fi0-fsync", durability="run", flush_interval=0, fsync=True)
             if fsync else None, NO_FSYNC),
        Spec(PER_STAGE, TM_STAGE, store("stage", durability="stage")),
        Spec(POWER, TM_STAGE_FSYNC, store("stage-fsync", durability="stage", fsync=True) if fsync else None,
             NO_FSYNC),
    ]


def sqlite_conn(path: str, synchronous: str) -> sqlite3.Connection:
    """A WAL connection the peer is handed, with synchronous set and read back (FULL=2, NORMAL=1)."""
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    got = conn.execute("PRAGMA synchronous").fetchone()[0]
    if got != {"NORMAL": 1, "FULL": 2}[synchronous]:
        raise RuntimeError(f"{path}: PRAGMA synchronous={synchronous} did not take (reads back {got})")
    return conn


def langgraph_specs() -> list[Spec]:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    builder = langgraph_builder()
    threads = itertools.count()

    def config() -> dict[str, Any]:
        return {"configurable": {"thread_id": f"t{next(threads)}"}}

    def bare(folder: str) -> tuple[Variant, list[Any]]:
        graph = builder.compile()
        return Variant("", lambda: graph.invoke(initial())), []

    def in_memory(folder: str) -> tuple[Variant, list[Any]]:
        saver = InMemorySaver()
        graph = builder.compile(checkpointer=saver)

        def forget() -> None:
            for table in (saver.storage, saver.writes, saver.blobs):
                table.clear()
        return Variant("", lambda: graph.invoke(initial(), config()), reset=forget), []

    def on_file(durability: str, synchronous: str) -> Callable[[str], tuple[Variant, list[Any]]]:
        def build(folder: str) -> tuple[Variant, list[Any]]:
            conn = sqlite_conn(os.path.join(folder, f"lg-{durability}-{synchronous}.sqlite"), synchronous)
            saver = SqliteSaver(conn)
            saver.setup()  # its own PRAGMA journal_mode=WAL; synchronous stays as set
            graph = builder.compile(checkpointer=saver)
            return Variant("", lambda: graph.invoke(initial(), config(), durability=durability)), [conn]
        return build

    lg = "langgraph SqliteSaver"
    return [
        Spec(NOT_AT_RETURN, "langgraph, no checkpointer", bare),
        Spec(NOT_AT_RETURN, "langgraph, InMemorySaver", in_memory),
        Spec(PER_RUN, f"{lg} durability=exit, synchronous=NORMAL", on_file("exit", "NORMAL")),
        Spec(PER_RUN, f"{lg} durability=exit, synchronous=FULL (+ power loss)", on_file("exit", "FULL")),
        Spec(PER_RUN, f"{lg} durability=async (default), synchronous=FULL", on_file("async", "FULL")),
        Spec(PER_STAGE, f"{lg} durability=sync, synchronous=NORMAL", on_file("sync", "NORMAL")),
        Spec(POWER, f"{lg} durability=sync, synchronous=FULL", on_file("sync", "FULL")),
    ]


def burr_specs() -> list[Spec]:
    from burr.core.persistence import SQLitePersister

    app = burr_app_factory()

    def bare(folder: str) -> tuple[Variant, list[Any]]:
        return Variant("", lambda: app().run(halt_after=[BURR_LAST])), []

    def persisted(synchronous: str) -> Callable[[str], tuple[Variant, list[Any]]]:
        def build(folder: str) -> tuple[Variant, list[Any]]:
            path = os.path.join(folder, f"burr-{synchronous}.sqlite")
            conn = sqlite_conn(path, synchronous)
            persister = SQLitePersister(db_path=path, connection=conn)
            persister.initialize()  # commits after every save_state: one commit per step
            return Variant("", lambda: app(persister=persister).run(halt_after=[BURR_LAST])), [conn]
        return build

    return [
        Spec(NOT_AT_RETURN, "burr, no persister", bare),
        Spec(PER_STAGE, "burr SQLitePersister (per step), synchronous=NORMAL", persisted("NORMAL")),
        Spec(POWER, "burr SQLitePersister (per step), synchronous=FULL", persisted("FULL")),
    ]


SPECS: dict[str, Callable[..., list[Spec]]] = {"tracemem": tracemem_specs, "langgraph": langgraph_specs,
                                               "burr": burr_specs}


def all_specs(peers: list[str], default_safe: bool = False) -> tuple[list[Spec], list[str]]:
    specs: list[Spec] = []
    notes: list[str] = []
    for peer in peers:
        try:
            specs += SPECS[peer](default_safe) if peer == "tracemem" else SPECS[peer]()
        except ImportError as exc:
            notes.append(f"{peer} skipped: {exc}")
    return specs, notes


def build_all(specs: list[Spec], folder: str) -> tuple[dict[str, Variant], list[Any]]:
    """The variants that build; a spec whose build raises (an option this tracemem rejects, say)
    gets `why_not` set to the error and is printed as such, not measured."""
    variants: dict[str, Variant] = {}
    closers: list[Any] = []
    for spec in specs:
        if spec.build is None:
            continue
        try:
            v, cs = spec.build(folder)
        except Exception as exc:  # noqa: BLE001 — reported in the table, the other variants still run
            spec.why_not = f"not built: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        v.label = spec.label
        variants[spec.label] = v
        closers += cs
    return variants, closers


# -- what the default mode promises -----------------------------------------------
PROBE = """
import os, signal, sys
sys.path.insert(0, {root!r})
from bench.overhead import build_flow
from tracemem.store import Store
store = Store({path!r})
run = build_flow("probe").run({{}}, store=store)
print(run.run_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # right after flow.run returned: no flush, no exit handler
"""


def default_survives_kill(folder: str) -> Optional[bool]:
    """Probed, not assumed: a child runs one flow into Store(path) (durability "run", the default),
    is SIGKILLed as flow.run returns, and the file is reopened. True: that run is there (the default
    mode is process-crash safe at return); None: the probe itself failed."""
    path = os.path.join(folder, "probe.duckdb")
    proc = subprocess.run([sys.executable, "-c", PROBE.format(root=ROOT, path=path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    run_id = proc.stdout.strip()
    if proc.returncode != -9 or not run_id:
        return None
    with Store(path) as store:
        return run_id in {r["run_id"] for r in store.runs(limit=10)}


# -- counting syncs ---------------------------------------------------------------
def count_child(folder: str, peers: list[str], runs: dict[str, int]) -> None:
    """In the child process: each variant warmed up, then `runs` runs and its flush between markers.
    Prints the Python-level os.fsync/os.fdatasync calls per variant as JSON (the strace-less fallback)."""
    calls = {"n": 0}
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def counted(fd: int, real: Callable[[int], None] = real) -> None:
            calls["n"] += 1
            real(fd)
        setattr(os, name, counted)
    specs = {s.label: s for s in all_specs(peers)[0]}
    py: dict[str, Optional[int]] = {}
    for label, n in runs.items():  # one variant open at a time: no other store's background commits counted
        variants, closers = build_all([specs[label]], folder) if label in specs else ({}, [])
        v = variants.get(label)
        if v is not None:
            v.fn()
            if v.after:
                v.after()
            if v.reset:
                v.reset()
        before = calls["n"]
        os.getppid()  # markers for every label, built or not, so the pairs stay in order
        if v is not None:
            v.timed(n)
        os.getppid()
        py[label] = calls["n"] - before if v is not None else None
        for c in closers:
            c.close()
    print(json.dumps(py))


def per(count: int, runs: int) -> str:
    """count/runs, readable when a batched mode syncs once in hundreds of runs: 0.0031, 1.02, 23."""
    x = count / runs
    return "0" if count == 0 else f"{x:.2g}" if x < 0.1 else f"{x:.2f}".rstrip("0").rstrip(".")


def count_syncs(folder: str, peers: list[str], runs: dict[str, int]) -> tuple[dict[str, str], dict[str, float], str]:
    """fdatasync+fsync per run for each label, as printable cells and (when strace counted them) numbers,
    and a note on how they were counted."""
    strace = shutil.which("strace")
    out_file = os.path.join(folder, "strace.log")
    child = [sys.executable, os.path.abspath(__file__), "--count-child", os.path.join(folder, "count"),
             ",".join(peers), json.dumps(runs)]
    os.makedirs(child[3], exist_ok=True)
    argv = ([strace, "-f", "--seccomp-bpf", "-qq", "-o", out_file, "-e", f"trace=fsync,fdatasync,{MARKER}"]
            if strace else []) + child
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {}, {}, f"syncs not counted: the counting child exited {proc.returncode}: {' / '.join(tail)}"
    py = json.loads(proc.stdout.strip().splitlines()[-1])
    if not strace:
        cells = {label: f"≥{per(py[label], n)} (py)" for label, n in runs.items() if py[label] is not None}
        return cells, {}, ("strace is not installed (Debian: apt-get install strace), so only Python-level "
                       "os.fsync/os.fdatasync calls are counted ('py'): sqlite's and DuckDB's syncs, made "
                       "from C, are invisible to that")
    cells: dict[str, str] = {}
    per_run: dict[str, float] = {}
    labels = list(runs)
    segment = -1  # index into labels while inside a marker pair (odd marker count)
    counts = {label: [0, 0] for label in labels}  # [fdatasync, fsync]
    markers = 0
    with open(out_file) as f:
        for line in f:
            m = re.search(r"\b(fsync|fdatasync|getppid)\(", line)
            if not m:
                continue
            if m.group(1) == MARKER:
                markers += 1
                segment = (markers - 1) // 2 if markers % 2 else -1
            elif segment >= 0:
                counts[labels[segment]][0 if m.group(1) == "fdatasync" else 1] += 1
    if markers != 2 * len(labels):
        return {}, {}, f"syncs not counted: {markers} markers in the strace log, expected {2 * len(labels)}"
    for label, n in runs.items():
        if py[label] is None:
            cells[label] = "not counted (the counting child could not build it)"
            continue
        fdatasync, fsync = counts[label]
        cells[label] = f"{per(fdatasync + fsync, n)} ({per(fdatasync, n)}+{per(fsync, n)})"
        per_run[label] = (fdatasync + fsync) / n
    return cells, per_run, ("syncs/run: fdatasync+fsync calls per run counted by strace -f in a child process "
                   "(its runs per variant = the timing's), split as (fdatasync+fsync)")


# -- floors -----------------------------------------------------------------------
def floors(folder: str, fast_ops: int, sync_ops: int) -> tuple[Bench, list[Any]]:
    """The machine's floors with bench/timing.py's Bench and helpers."""
    import duckdb

    entries, run = real_entries()
    n = len(entries)
    payload = b"x" * 200
    b = Bench()
    fd = append_fd(os.path.join(folder, "floor-write.bin"))
    fd_sync = append_fd(os.path.join(folder, "floor-fdatasync.bin"))
    cons = {s: sqlite_con(os.path.join(folder, f"floor-{s}.db"), s) for s in ("NORMAL", "FULL")}
    duck = duckdb.connect(os.path.join(folder, "floor.duckdb"))
    duck.execute("CREATE TABLE step_journal (run_id VARCHAR, step INTEGER, kind VARCHAR, payload VARCHAR)")
    text = json.dumps(entries[3])
    b.add("floors", FLOOR_WRITE, lambda i: os.write(fd, payload), fast_ops)
    b.add("floors", FLOOR_JSON, lambda i: json.dumps(entries[i % n]), fast_ops)
    b.add("floors", FLOOR_NORMAL, lambda i: cons["NORMAL"].execute(
        "INSERT INTO journal VALUES (?, ?, 'step', ?)", (run.run_id, i, text)), max(10, fast_ops // 20))
    b.add("floors", FLOOR_FSYNC, lambda i: (os.write(fd_sync, payload), os.fdatasync(fd_sync)), sync_ops, each=True)
    b.add("floors", FLOOR_FULL, lambda i: cons["FULL"].execute(
        "INSERT INTO journal VALUES (?, ?, 'step', ?)", (run.run_id, i, text)), sync_ops, each=True)
    b.add("floors", FLOOR_DUCK, lambda i: duck.execute(
        "INSERT INTO step_journal VALUES (?, ?, 'step', ?)", [run.run_id, i, text]), sync_ops, each=True)
    return b, [fd, fd_sync, *cons.values(), duck]


# -- the section ------------------------------------------------------------------
def goal(name: str, value: Optional[float], limit: Optional[float], quick: bool) -> str:
    if value is None or limit is None:
        return f"goal: {name}: not measured"
    verdict = "met" if value <= limit else f"not met ({value / limit:,.2f}× the limit)"
    return f"goal: {name}: {value:,.2f} µs/stage — {verdict}" + (" (quick run: indicative only)" if quick else "")


def durability(args: argparse.Namespace) -> None:
    quick = args.quick
    budget = min(args.budget, 0.4)
    runs_cap = 20 if quick else min(args.runs, 2000)
    folder = tempfile.mkdtemp(prefix="tracemem-durability-", dir=args.dir or os.getcwd())
    try:
        safe = default_survives_kill(folder)
        specs, notes = all_specs(args.peers, bool(safe))
        notes.insert(0, f"durability \"run\" (the default) probed: a child SIGKILLed as flow.run returned; "
                        + {True: "the run was in the file on reopening, so it is listed as process-crash safe "
                                 "at return, per run",
                           False: "the run was not in the file on reopening (not durable at return)",
                           None: "the probe failed; listed as not durable at return"}[safe])
        variants, closers = build_all(specs, folder)
        bench, files = floors(folder, 300 if quick else 5000, 10 if quick else 100)
        for v in variants.values():
            v.calibrate(budget, runs_cap)
        order = list(variants.values())
        for rep in range(args.reps):
            shift = rep % len(order)
            for v in order[shift:] + order[:shift]:
                v.measure()
            bench.run(1)
        for c in closers:
            c.close()
        for f in files:
            os.close(f) if isinstance(f, int) else f.close()
        syncs, per_run, how = count_syncs(folder, args.peers, {label: v.runs for label, v in variants.items()})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(specs, variants, bench, (syncs, per_run, how), notes, args, budget)


def report(specs: list[Spec], variants: dict[str, Variant], bench: Bench,
           counted: tuple[dict[str, str], dict[str, float], str], notes: list[str], args: argparse.Namespace,
           budget: float) -> None:
    syncs, per_run, how = counted
    med = {label: statistics.median(v.values) for label, v in variants.items()}
    base = med.get(TM_RUN)
    floor = {label: bench.median(label) for label in bench.results}
    print(f"\n## durability: µs per stage and syncs per run, one section per guarantee; {STAGES}-stage pipeline, "
          f"{args.reps} reps interleaved, ~{budget:g} s per measurement; tracemem "
          f"{'with' if store_has_fsync() else 'without'} a fsync store option")
    print(f"  {'variant':<72} {'median':>9} {'min–max':>21} {'× tm run':>9}  {'syncs/run (fdatasync+fsync)':<28}")
    for group in GROUPS:
        print(f"### {group}")
        if group == NOT_AT_RETURN and any(s.label == TM_RUN and s.group == PER_RUN for s in specs):
            print(f"  {'tracemem on a file: none':<72} its default is journaled before flow.run returns "
                  f"(probed, see the notes): next section")
        for spec in (s for s in specs if s.group == group):
            if spec.label not in variants:
                print(f"  {spec.label:<72} {spec.why_not}")
                continue
            v, m = variants[spec.label], med[spec.label]
            ratio = f"{m / base:>9.2f}" if base else f"{'-':>9}"
            spread = f"{min(v.values):,.2f}–{max(v.values):,.2f}"
            print(f"  {spec.label:<72} {m:>9,.2f} {spread:>21} {ratio}  {syncs.get(spec.label, 'not counted')}")
    print(f"(µs/stage medians; × tm run = median / median of '{TM_RUN}'; {how})")
    print("### the machine's floors, same run (µs per operation, median of interleaved reps)")
    for label, value in floor.items():
        vals = bench.results[label]
        print(f"  {label:<72} {value:>9,.2f} {min(vals):>10,.2f}–{max(vals):<10,.2f}")
    fsync_floor = floor.get(FLOOR_FSYNC)
    q = args.quick
    for name, label, limit in ((f"engine ≤ {BUDGET_ENGINE} µs/stage", TM_ENGINE, BUDGET_ENGINE),
                               (f"default durability=\"run\" ≤ {BUDGET_RUN} µs/stage", TM_RUN, BUDGET_RUN),
                               (f"durability=\"stage\" ≤ {BUDGET_STAGE} µs/stage", TM_STAGE, BUDGET_STAGE)):
        print(goal(name, med.get(label), limit, q))
    if TM_STAGE_FSYNC in med and fsync_floor:
        print(goal(f"fsync per stage ≤ 1.5× the fsync floor ({fsync_floor:,.1f} µs)", med[TM_STAGE_FSYNC],
                   1.5 * fsync_floor, q))
    else:
        print(f"goal: fsync per stage ≤ 1.5× the fsync floor ({fsync_floor or 0:,.1f} µs): "
              f"not measured ({NO_FSYNC})")
    for mine, peer, times in AHEAD:  # every process-crash-safe mode against the peers' with the same guarantee
        if peer in med:
            print(goal(f"{mine} {times}× ahead of {peer} ({med[peer]:,.1f} µs)", med.get(mine), med[peer] / times, q))
        else:
            print(f"goal: {mine} {times}× ahead of {peer}: not measured (that peer did not run)")
    for label in (TM_FI0, TM_STAGE):
        if per_run.get(label, 0) >= 0.9:
            notes.append(f"'{label}' syncs {per_run[label]:.1f} times per run: it commits a DuckDB "
                         f"transaction, which syncs DuckDB's WAL, so today it is power-loss safe too, at that cost")
    for n in notes:
        print(f"note: {n}")


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--count-child":
    count_child(sys.argv[2], sys.argv[3].split(","), json.loads(sys.argv[4]))
