"""tracemem side by side with LangGraph and Burr: µs per stage and chat storage growth.

    python bench/peers.py [--quick] [--peers tracemem,langgraph,burr] [--only SUBSTR ...]
                          [--section overhead|durability|chat ...] [--no-overhead] [--no-durability]
                          [--no-chat] [--reps N] [--budget S] [--runs N] [--turns N] [--dir PATH]

1. The 10-stage linear pipeline of bench/overhead.py (each stage reads 2 of 5 int
   fields and writes 1), built once per framework and run many times:
   - tracemem: engine only; DuckDB store with durability "run" (runs handed to a
     background writer in batches) and "stage"; durability "run" with a flush()
     after every run (the like-for-like of LangGraph's durability "exit");
     store (run) + OpenTelemetry to an in-memory exporter (skipped with a note
     when tracemem.otel is not importable yet);
   - LangGraph: StateGraph over a TypedDict of 5 ints, 10 nodes in a line, each
     node returning one key; no checkpointer, InMemorySaver, SqliteSaver on a file
     (WAL, LangGraph's default durability "async", plus durability "exit");
     checkpointed variants use a fresh thread_id per run;
   - Burr: 10 `@action(reads=[a, b], writes=[c])` in a line; one Application built
     per run from a prebuilt graph (a Burr run is an application instance); no
     tracking, the local tracker, SQLitePersister on a file (WAL).
   Variants are interleaved rep by rep (order rotated each rep). Each measurement
   runs a variant for about --budget seconds (a run count fixed per variant at
   calibration, capped at --runs), and includes the final flush where a store
   buffers. Prints median and min–max µs per stage, × plain Python and × tracemem
   store (durability "run").
2. A chat of --turns turns on one thread, each turn one run / invoke / step that
   reads the history and appends a 200-character user message and a
   200-character reply: tracemem (bench/store.py's chat_growth: resume=previous),
   LangGraph SqliteSaver (`messages: Annotated[list, operator.add]`, same
   thread_id), Burr SQLitePersister (one `app.step` per turn on one app). Bytes
   added to the file(s) at 50/100/200/500 turns (after a checkpoint: DuckDB
   CHECKPOINT, SQLite wal_checkpoint(TRUNCATE); WAL files counted) and the fitted
   growth exponent (1 = linear, 2 = quadratic).
3. Durability, like with like (bench/peers_durability.py): the same pipeline under one
   section per guarantee (not durable at return; process-crash safe at return, per run;
   process-crash safe per stage; power-loss safe per stage), µs per stage and the
   fdatasync+fsync calls per run counted with strace, the machine's floors (write,
   json.dumps, sqlite NORMAL/FULL, fdatasync, DuckDB commit) from the same run, and
   the budget printed met / not met (engine ≤ 10 µs/stage, default ≤ 25, "stage" ≤ 40, fsync
   per stage ≤ 1.5× the fsync floor, each crash-safe mode ≥ 10× LangGraph's and ≥ 3× Burr's).
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import itertools
import operator
import os
import random
import sqlite3
import statistics
import string
import sys
import tempfile
import time
import warnings
from typing import Annotated, Any, Callable, TypedDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.overhead import FIELDS, STAGES, build_flow, make_plain  # noqa: E402
from bench.peer_pipelines import BURR_LAST, Variant, burr_app_factory, initial, langgraph_builder  # noqa: E402
from bench.store import chat_growth, growth_exponent  # noqa: E402
from tracemem.store import Store  # noqa: E402

MESSAGE = ("hello there " * 20)[:200]  # the same strings bench/store.py's chat uses
REPLY = ("ok " * 70)[:200]
_rng = random.Random(9)
_WORDS = ["".join(_rng.choices(string.ascii_lowercase, k=_rng.randint(2, 9))) for _ in range(2000)]


def text(seed: int) -> str:
    """200 characters of word-like text, different every turn (repeated text flatters a compressing store)."""
    r = random.Random(seed)
    out = ""
    while len(out) < 200:
        out += r.choice(_WORDS) + " "
    return out[:200]


def answer(user: str) -> str:
    """The scripted reply: 200 characters that depend on the message, so no two turns repeat."""
    return user[::-1] if user != MESSAGE else REPLY


SECTIONS = ("overhead", "durability", "chat")
BASELINE = "tracemem store, durability=run"
PLAIN = "plain python (dict)"


def tracemem_final() -> dict[str, int]:
    out = build_flow("check").run({}).output
    return {f: (out[f] if isinstance(out, dict) else getattr(out, f)) for f in FIELDS}


def same_result(peer: str, got: dict[str, int]) -> list[str]:
    """The peers must compute what tracemem computes: same graph, same state."""
    expected = tracemem_final()
    return [] if got == expected else [f"WARNING: {peer} final state {got} differs from tracemem's {expected}"]


class ChatState(TypedDict):
    """LangGraph's chat state: the fields of bench/store.py's Chat, messages under an append reducer."""
    user: str
    messages: Annotated[list[dict[str, str]], operator.add]
    reply: str


# -- tracemem ---------------------------------------------------------------------
def tracemem_variants(folder: str) -> tuple[list[Variant], list[str], list[Any]]:
    flow = build_flow("peers")
    plain = [make_plain(i) for i in range(STAGES)]

    def run_plain() -> None:
        d = initial()
        for stage in plain:
            stage(d)

    store_run = Store(os.path.join(folder, "tm-run.duckdb"), durability="run")
    store_stage = Store(os.path.join(folder, "tm-stage.duckdb"), durability="stage")
    store_sync = Store(os.path.join(folder, "tm-sync.duckdb"), durability="run", flush_interval=0)

    def run_synced() -> None:
        """durability "run" hands the finished run to a background writer (batches of up to 256 runs);
        flush_interval=0 journals each run durably before flow.run returns: the like-for-like of
        LangGraph's durability="exit"."""
        flow.run({}, store=store_sync)

    variants = [
        Variant(PLAIN, run_plain),
        Variant("tracemem engine (no store)", lambda: flow.run({})),
        Variant(BASELINE, lambda: flow.run({}, store=store_run), store_run.flush),
        Variant("tracemem store(run), on disk before return", run_synced),
        Variant("tracemem store, durability=stage", lambda: flow.run({}, store=store_stage)),
    ]
    notes: list[str] = []
    closers: list[Any] = [store_run, store_sync, store_stage]
    try:
        import tracemem.otel  # noqa: F401
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError as exc:
        notes.append(f"tracemem + OTel skipped: {exc} (tracemem/otel.py not importable yet)")
    else:
        exporter = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        store_otel = Store(os.path.join(folder, "tm-otel.duckdb"), durability="run")
        closers.append(store_otel)

        def run_otel() -> None:
            flow.run({}, store=store_otel, tracer_provider=tp)
            exporter.clear()

        variants.append(Variant("tracemem store(run) + OTel in-memory", run_otel, store_otel.flush))
    return variants, notes, closers


# -- LangGraph --------------------------------------------------------------------
def langgraph_variants(folder: str) -> tuple[list[Variant], list[str], list[Any]]:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    builder = langgraph_builder()
    bare = builder.compile()
    memory_saver = InMemorySaver()
    in_memory = builder.compile(checkpointer=memory_saver)

    def forget() -> None:
        """Drop earlier measurements' checkpoints so their heap does not slow the other variants' gc."""
        for table in (memory_saver.storage, memory_saver.writes, memory_saver.blobs):
            table.clear()
    conn = sqlite3.connect(os.path.join(folder, "lg-overhead.sqlite"), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # sets journal_mode=WAL
    on_file = builder.compile(checkpointer=saver)
    threads = itertools.count()

    def config() -> dict[str, Any]:
        return {"configurable": {"thread_id": f"t{next(threads)}"}}

    variants = [
        Variant("langgraph, no checkpointer", lambda: bare.invoke(initial())),
        Variant("langgraph, InMemorySaver", lambda: in_memory.invoke(initial(), config()), reset=forget),
        Variant("langgraph, SqliteSaver (WAL)", lambda: on_file.invoke(initial(), config())),
        Variant("langgraph, SqliteSaver durability=exit",
                lambda: on_file.invoke(initial(), config(), durability="exit")),
    ]
    check = bare.invoke(initial())
    return variants, same_result("LangGraph", {f: check[f] for f in FIELDS}), [conn]


# -- Burr -------------------------------------------------------------------------
def burr_variants(folder: str) -> tuple[list[Variant], list[str], list[Any]]:
    from burr.core.persistence import SQLitePersister

    app = burr_app_factory()
    last = BURR_LAST

    tracker_dir = os.path.join(folder, "burr-tracker")
    conn = sqlite3.connect(os.path.join(folder, "burr-overhead.sqlite"), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    persister = SQLitePersister(db_path=os.path.join(folder, "burr-overhead.sqlite"), connection=conn)
    persister.initialize()

    variants = [
        Variant("burr, no tracking", lambda: app().run(halt_after=[last])),
        Variant("burr, local tracker", lambda: app(tracker=tracker_dir).run(halt_after=[last])),
        Variant("burr, SQLitePersister (WAL)", lambda: app(persister=persister).run(halt_after=[last])),
    ]
    _, _, state = app().run(halt_after=[last])
    build_only = Variant("burr build", lambda: app())
    build_only.calibrate(0.1, 500)
    build_us = build_only.timed(build_only.runs) / build_only.runs * 1e6
    notes = [f"burr: ApplicationBuilder.build() from the prebuilt graph costs {build_us:.0f} µs per run "
             f"(= {build_us / STAGES:.1f} µs/stage of each burr figure, no tracking)"]
    notes += same_result("Burr", {f: state[f] for f in FIELDS})
    return variants, notes, [conn]


FACTORIES = {"tracemem": tracemem_variants, "langgraph": langgraph_variants, "burr": burr_variants}


def overhead(args: argparse.Namespace, folder: str) -> None:
    variants: list[Variant] = []
    notes: list[str] = []
    closers: list[Any] = []
    for peer in args.peers:
        try:
            vs, ns, cs = FACTORIES[peer](folder)
        except ImportError as exc:
            notes.append(f"{peer} skipped: {exc}")
            continue
        variants += vs
        notes += ns
        closers += cs
    if args.only:
        keep = [v for v in variants if v.label in (PLAIN, BASELINE) or any(s.lower() in v.label.lower() for s in args.only)]
        variants = keep
    for v in variants:
        v.calibrate(args.budget, args.runs)
    for rep in range(args.reps):
        shift = rep % len(variants)
        for v in variants[shift:] + variants[:shift]:
            v.measure()
    for c in closers:
        c.close()

    print(f"## µs per stage, {STAGES}-stage linear pipeline (each stage reads 2 of 5 int fields, writes 1); "
          f"{args.reps} reps interleaved, ~{args.budget:g} s per measurement")
    print("goal: judged in the durability section below, which holds the same modes side by side with the peers'")
    med = {v.label: statistics.median(v.values) for v in variants}
    base = med.get(BASELINE)
    plain = med.get(PLAIN)
    print(f"{'variant':<40} {'runs/rep':>8} {'median':>10} {'min–max':>19} {'× plain':>9} {'× tracemem':>11}")
    for v in variants:
        m = med[v.label]
        x_plain = f"{m / plain:>9.0f}" if plain else f"{'-':>9}"
        x_base = (f"{m / base:>11.2f}" if m / base >= 0.1 else f"{m / base:>11.4f}") if base else f"{'-':>11}"
        print(f"{v.label:<40} {v.runs:>8} {m:>10.2f} {min(v.values):>9.2f}–{max(v.values):<9.2f} {x_plain} {x_base}")
    print(f"(× tracemem = median / median of '{BASELINE}')")
    for n in notes:
        print(f"note: {n}")


# -- chat storage -----------------------------------------------------------------
def sqlite_bytes(conn: sqlite3.Connection, path: str) -> int:
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def tracemem_chat(turns: int, folder: str, marks: tuple[int, ...]) -> list[tuple[int, int]]:
    """bench/store.py's chat_growth with a different message and reply every turn."""
    from bench.store import Chat, file_bytes
    from tracemem import Pipeline

    def respond(scope: Chat) -> None:
        history = scope.messages
        scope.messages.append({"role": "user", "content": scope.user})
        scope.reply = answer(scope.user) if len(history) >= 0 else ""
        scope.messages.append({"role": "assistant", "content": scope.reply})

    flow = Pipeline("chat", Chat).then(respond).build()
    store = Store(os.path.join(folder, "tm-chat-distinct.duckdb"))
    sizes = [(0, file_bytes(store))]
    previous = None
    for turn in range(1, turns + 1):
        previous = flow.run({"user": text(turn)}, resume=previous, store=store)
        if turn in marks or turn == turns:
            sizes.append((turn, file_bytes(store)))
    assert len(previous.output.messages) == 2 * turns
    store.close()
    return sizes


def langgraph_chat(turns: int, folder: str, marks: tuple[int, ...]) -> list[tuple[int, int]]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def respond(state: ChatState) -> dict[str, Any]:
        history = state.get("messages", [])
        reply = answer(state["user"]) if len(history) >= 0 else ""
        return {"messages": [{"role": "user", "content": state["user"]},
                             {"role": "assistant", "content": reply}], "reply": reply}

    path = os.path.join(folder, "lg-chat.sqlite")
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    graph = StateGraph(ChatState).add_node("respond", respond).add_edge(START, "respond") \
        .add_edge("respond", END).compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": "chat"}}
    sizes = [(0, sqlite_bytes(conn, path))]
    for turn in range(1, turns + 1):
        graph.invoke({"user": text(turn)}, cfg)
        if turn in marks or turn == turns:
            sizes.append((turn, sqlite_bytes(conn, path)))
    final = graph.get_state(cfg).values
    assert len(final["messages"]) == 2 * turns, len(final["messages"])
    conn.close()
    return sizes


def burr_chat(turns: int, folder: str, marks: tuple[int, ...]) -> list[tuple[int, int]]:
    from burr.core import ApplicationBuilder, State, action
    from burr.core.persistence import SQLitePersister

    @action(reads=["messages"], writes=["messages", "reply", "user"])
    def respond(state: State, user: str) -> State:
        history = state["messages"]
        reply = answer(user) if len(history) >= 0 else ""
        return (state.update(user=user, reply=reply)
                .append(messages={"role": "user", "content": user})
                .append(messages={"role": "assistant", "content": reply}))

    path = os.path.join(folder, "burr-chat.sqlite")
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    persister = SQLitePersister(db_path=path, connection=conn)
    persister.initialize()
    app = (ApplicationBuilder().with_actions(respond=respond).with_transitions(("respond", "respond"))
           .with_state(user="", messages=[], reply="").with_entrypoint("respond")
           .with_identifiers(app_id="chat").with_state_persister(persister).build())
    sizes = [(0, sqlite_bytes(conn, path))]
    for turn in range(1, turns + 1):
        app.step(inputs={"user": text(turn)})
        if turn in marks or turn == turns:
            sizes.append((turn, sqlite_bytes(conn, path)))
    assert len(app.state["messages"]) == 2 * turns
    conn.close()
    return sizes


def chat(args: argparse.Namespace, folder: str) -> None:
    marks = tuple(m for m in (50, 100, 200, 500) if m < args.turns) + (args.turns,)
    if len(marks) < 3:
        marks = tuple(sorted({max(1, args.turns // 5), max(1, args.turns // 2), args.turns}))
    systems: dict[str, Callable[[], list[tuple[int, int]]]] = {}
    if "tracemem" in args.peers:
        systems["tracemem, repeated text (chat_growth)"] = lambda: chat_growth(args.turns, folder, marks)
        systems["tracemem (DuckDB), distinct text"] = lambda: tracemem_chat(args.turns, folder, marks)
    if "langgraph" in args.peers:
        systems["langgraph SqliteSaver (WAL)"] = lambda: langgraph_chat(args.turns, folder, marks)
    if "burr" in args.peers:
        systems["burr SQLitePersister (WAL)"] = lambda: burr_chat(args.turns, folder, marks)
    results: dict[str, tuple[list[tuple[int, int]], float]] = {}
    notes = []
    for label, fn in systems.items():
        start = time.perf_counter()
        try:
            points = fn()
        except ImportError as exc:
            notes.append(f"{label} skipped: {exc}")
            continue
        results[label] = (points, time.perf_counter() - start)

    print(f"\n## {args.turns}-turn chat storage (one turn = one run / invoke / step on the same thread, "
          f"appending a 200-char user message and a 200-char reply, different text every turn; "
          f"'repeated text' = bench/store.py's chat_growth, the same message every turn)")
    print("goal: tracemem ≤ 1 MB over 500 turns, growing linearly; reference here at 500 turns: "
          "langgraph 304 MB, burr 60 MB")
    print(f"bytes added to the file(s) since the empty store, at turn:")
    print(f"{'system':<36} " + " ".join(f"{m:>12}" for m in marks) + f" {'exponent':>9} {'seconds':>8}")
    for label, (points, secs) in results.items():
        base = points[0][1]
        by_turn = dict(points)
        cells = " ".join(f"{by_turn[m] - base:>12,}" if m in by_turn else f"{'-':>12}" for m in marks)
        print(f"{label:<36} {cells} {growth_exponent(points):>9.2f} {secs:>8.1f}")
    tm = results.get("tracemem (DuckDB), distinct text", (None,))[0]
    for label, (points, _) in results.items():
        added = points[-1][1] - points[0][1]
        ratio = f", {added / (tm[-1][1] - tm[0][1]):.0f}× tracemem" if tm and not label.startswith("tracemem") \
            and tm[-1][1] > tm[0][1] else ""
        print(f"chat {label}: {added / 1e6:.2f} MB added over {points[-1][0]} turns, "
              f"growth exponent {growth_exponent(points):.2f}{ratio}")
    for n in notes:
        print(f"note: {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 reps, short measurements, 50 turns")
    ap.add_argument("--peers", default="tracemem,langgraph,burr",
                    help="comma-separated subset of tracemem,langgraph,burr")
    ap.add_argument("--only", action="append", default=[],
                    help="keep only variants whose label contains this (repeatable); plain and tracemem "
                         "store(run) are always kept as the baselines")
    ap.add_argument("--section", action="append", choices=SECTIONS, default=[],
                    help="run only this section (repeatable; default: all of " + ", ".join(SECTIONS) + ")")
    ap.add_argument("--no-overhead", action="store_true", help="skip the µs/stage comparison")
    ap.add_argument("--no-chat", action="store_true", help="skip the chat storage comparison")
    ap.add_argument("--no-durability", action="store_true", help="skip the durability table")
    ap.add_argument("--dir", default=None,
                    help="where the durability section's files go (default: a temp dir under the cwd, not tmpfs)")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 5, quick 2)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds per measurement (default 1.0, quick 0.05)")
    ap.add_argument("--runs", type=int, default=None, help="max runs per measurement (default 2000, quick 50)")
    ap.add_argument("--turns", type=int, default=None, help="chat turns (default 500, quick 50)")
    args = ap.parse_args()
    quick = args.quick
    args.reps = args.reps or (2 if quick else 5)
    args.budget = args.budget or (0.05 if quick else 1.0)
    args.runs = args.runs or (50 if quick else 2000)
    args.turns = args.turns or (50 if quick else 500)
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(args.peers) - set(FACTORIES)
    if unknown:
        ap.error(f"unknown peers {sorted(unknown)}; choose from {sorted(FACTORIES)}")
    if "tracemem" not in args.peers:
        args.peers.insert(0, "tracemem")  # the baseline every ratio is taken against
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    versions = []
    for dist in ("tracemem-agents", "duckdb", "langgraph", "langgraph-checkpoint-sqlite", "apache-burr"):
        try:
            from importlib.metadata import version
            versions.append(f"{dist} {version(dist)}")
        except Exception:
            versions.append(f"{dist} (not installed)")
    print(f"python {sys.version.split()[0]}; " + ", ".join(versions))
    sections = args.section or [s for s in SECTIONS if not getattr(args, f"no_{s}")]
    with tempfile.TemporaryDirectory(prefix="tracemem-peers-") as folder:
        if "overhead" in sections:
            overhead(args, folder)
        if "durability" in sections:
            from bench.peers_durability import durability
            durability(args)
        if "chat" in sections:
            chat(args, folder)


if __name__ == "__main__":
    main()
