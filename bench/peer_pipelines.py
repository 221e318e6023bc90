"""The pipeline of bench/peers.py built for each peer, and the timing harness every section shares.

Why its own module: bench/peers.py (overhead, chat) and bench/peers_durability.py (durability)
measure the same 10-stage pipeline (bench/overhead.py's wiring) on LangGraph and Burr; both
import it from here, so neither imports the other back.
"""
from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any, Callable, Optional, TypedDict

# no peer may reach the network or a tracing backend while measured
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ.setdefault("BURR_TELEMETRY_ENABLED", "false")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.overhead import FIELDS, STAGES  # noqa: E402


def wiring(i: int) -> tuple[str, str, str]:
    """Stage i reads fields a and b and writes out, exactly as bench/overhead.py's make_stage(i)."""
    return FIELDS[i % 5], FIELDS[(i + 1) % 5], FIELDS[(i + 2) % 5]


def initial() -> dict[str, int]:
    return {f: i for i, f in enumerate(FIELDS)}  # = overhead.Five's defaults


class Five(TypedDict):
    """LangGraph's state for the pipeline: the same five ints as overhead.Five."""
    f0: int
    f1: int
    f2: int
    f3: int
    f4: int



class Variant:
    def __init__(self, label: str, fn: Callable[[], Any], after: Optional[Callable[[], Any]] = None,
                 reset: Optional[Callable[[], Any]] = None) -> None:
        """fn: one run; after: the flush that ends a measurement (timed); reset: untimed clean-up before one."""
        self.label, self.fn, self.after, self.reset = label, fn, after, reset
        self.runs = 1
        self.values: list[float] = []

    def timed(self, runs: int) -> float:
        """Seconds for `runs` runs plus the final flush, if any."""
        fn = self.fn
        start = time.perf_counter()
        for _ in range(runs):
            fn()
        if self.after:
            self.after()
        return time.perf_counter() - start

    def calibrate(self, budget: float, cap: int) -> None:
        self.fn()  # warm-up: first-call costs (imports, table creation, caches)
        if self.after:
            self.after()
        n, spent = 1, self.timed(1)
        while spent < min(0.2, budget / 2) and n < cap:
            n = min(cap, n * 4)
            spent = self.timed(n)
        self.runs = max(3, min(cap, round(budget / (spent / n))))

    def measure(self) -> None:
        if self.reset:
            self.reset()
        gc.collect()
        self.values.append(self.timed(self.runs) / self.runs / STAGES * 1e6)


# -- LangGraph --------------------------------------------------------------------
def langgraph_builder() -> Any:
    """The pipeline as a LangGraph StateGraph (not compiled): 10 nodes in a line, each returning one key."""
    from langgraph.graph import END, START, StateGraph

    def node(i: int) -> Callable[[Five], dict[str, int]]:
        a, b, out = wiring(i)

        def stage(state: Five) -> dict[str, int]:
            return {out: state[a] + state[b]}
        stage.__name__ = f"s{i}"
        return stage

    builder = StateGraph(Five)
    for i in range(STAGES):
        builder.add_node(f"s{i}", node(i))
    builder.add_edge(START, "s0")
    for i in range(STAGES - 1):
        builder.add_edge(f"s{i}", f"s{i + 1}")
    builder.add_edge(f"s{STAGES - 1}", END)
    return builder


# -- Burr -------------------------------------------------------------------------
BURR_LAST = f"s{STAGES - 1}"  # app.run(halt_after=[BURR_LAST]) runs the whole pipeline


def burr_app_factory() -> Callable[..., Any]:
    """The pipeline as a prebuilt Burr graph; the returned app(tracker=dir, persister=p) builds one
    Application per run from it (a Burr run is an application instance)."""
    from burr.core import ApplicationBuilder, GraphBuilder, State, action

    def make_action(i: int) -> Any:
        a, b, out = wiring(i)

        @action(reads=[a, b], writes=[out])
        def stage(state: State) -> State:
            return state.update(**{out: state[a] + state[b]})
        return stage

    graph = (GraphBuilder()
             .with_actions(**{f"s{i}": make_action(i) for i in range(STAGES)})
             .with_transitions(*[(f"s{i}", f"s{i + 1}") for i in range(STAGES - 1)])
             .build())

    def app(**extra: Any) -> Any:
        b = ApplicationBuilder().with_graph(graph).with_state(**initial()).with_entrypoint("s0")
        if "tracker" in extra:
            b = b.with_tracker("local", project="tracemem_peers", params={"storage_dir": extra["tracker"]})
        if "persister" in extra:
            b = b.with_state_persister(extra["persister"])
        return b.build()
    return app
