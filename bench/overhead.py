"""µs per stage of the engine (no store) on a 10-stage linear pipeline, against plain Python.

Each stage reads two of five small fields and writes one. The baseline is the
same ten function calls on a dict, measured in the same process run, so the
ratio holds on a noisy shared machine. Prints figures; asserts nothing.

    python bench/overhead.py [--runs N] [--otel]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

from pydantic import BaseModel

sys.path.insert(0, ".")
from tracemem import Pipeline  # noqa: E402

STAGES = 10
FIELDS = ("f0", "f1", "f2", "f3", "f4")


class Five(BaseModel):
    f0: int = 0
    f1: int = 1
    f2: int = 2
    f3: int = 3
    f4: int = 4


def make_stage(i: int) -> Callable[[Any], None]:
    a, b, out = FIELDS[i % 5], FIELDS[(i + 1) % 5], FIELDS[(i + 2) % 5]
    ns: dict[str, Any] = {}
    exec(f"def stage_{i}(s):\n    s.{out} = s.{a} + s.{b}\n", ns)
    return ns[f"stage_{i}"]


def make_plain(i: int) -> Callable[[dict], None]:
    a, b, out = FIELDS[i % 5], FIELDS[(i + 1) % 5], FIELDS[(i + 2) % 5]
    def stage(d: dict) -> None:
        d[out] = d[a] + d[b]
    return stage


def build_flow(name: str = "overhead") -> Any:
    p = Pipeline(name, Five)
    for i in range(STAGES):
        p.then(make_stage(i))
    return p.build()


def per_stage_us(fn: Callable[[], Any], runs: int) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - start) / runs / STAGES * 1e6


def measure(label_fns: dict[str, Callable[[], Any]], runs: int, reps: int) -> dict[str, list[float]]:
    """Interleave the candidates rep by rep so machine noise hits all of them alike."""
    results: dict[str, list[float]] = {k: [] for k in label_fns}
    for _ in range(reps):
        for label, fn in label_fns.items():
            results[label].append(per_stage_us(fn, runs))
    return results


def report(results: dict[str, list[float]], baseline: str) -> None:
    base = statistics.median(results[baseline])
    print(f"{'variant':<34} {'µs/stage (median)':>18} {'min–max':>16} {'× plain':>9}")
    for label, values in results.items():
        med = statistics.median(values)
        print(f"{label:<34} {med:>18.2f} {min(values):>7.2f}–{max(values):<8.2f} {med / base:>9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--otel", action="store_true", help="also measure with OpenTelemetry export (in-memory)")
    args = ap.parse_args()
    flow = build_flow()
    plain = [make_plain(i) for i in range(STAGES)]

    def run_plain() -> None:
        d = {f: i for i, f in enumerate(FIELDS)}
        for stage in plain:
            stage(d)

    candidates: dict[str, Callable[[], Any]] = {
        "plain python (dict)": run_plain,
        "tracemem engine (no store)": lambda: flow.run({}),
    }
    if args.otel:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(exporter))

        def run_otel() -> None:
            flow.run({}, tracer_provider=tp)
            exporter.clear()

        candidates["tracemem engine + OTel (in-memory)"] = run_otel
    flow.run({})  # warm up
    print(f"10-stage linear pipeline, each stage reads 2 of 5 fields and writes 1; "
          f"{args.runs} runs × {args.reps} reps (goal: engine ≤ 10 µs/stage)")
    report(measure(candidates, args.runs, args.reps), "plain python (dict)")


if __name__ == "__main__":
    main()
