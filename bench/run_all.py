"""Run every benchmark in bench/ and write bench/RESULTS.md: machine, versions, goals met or gap, full outputs.

    python bench/run_all.py [--quick] [--only overhead,store,...] [--out PATH] [--timeout S]

Each script runs as a subprocess with this interpreter (its output streams to
the terminal as it runs); the headline figures are parsed from the text the
scripts print. A script that is absent is skipped with a note; a script that
fails or cannot be parsed is reported as such in the table, never as a number.
`--quick` passes `--quick` to the scripts that take it and small sizes to the
others; goals that a quick run does not measure (500 turns, 100k records) are
marked "not measured".
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Optional

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
SCRIPTS = ("overhead", "store", "memory", "memory_scale", "snapshot", "scale", "blame",
           "resume", "tools", "ui", "user_sql", "postgres", "pg_durability", "peers", "model_requests", "why")
# for scripts without a --quick flag of their own
QUICK_ARGS = {"overhead": [("--runs", "200"), ("--reps", "2")],
              "store": [("--runs", "200"), ("--reps", "2"), ("--turns", "50")],
              "snapshot": [("--sizes", "2000,10000"), ("--queries", "50")],
              "memory_scale": [("--smoke", "")], "blame": [("--runs", "5000"), ("--memories", "1000")],
              "resume": [("--rounds", "100"), ("--reps", "2")], "ui": [("--runs", "2000"), ("--steps", "100")],
              "user_sql": [("--runs", "200"), ("--queries", "20")], "model_requests": [("--turns", "100")],
              "pg_durability": [("--runs", "50"), ("--reps", "2")]}
PACKAGES = ("tracemem-agents", "duckdb", "numpy", "pydantic", "pyarrow", "opentelemetry-sdk",
            "langgraph", "langgraph-checkpoint-sqlite", "apache-burr")
NUM = r"([0-9][0-9,]*\.?[0-9]*)"
BASELINE = "tracemem store, durability=run"  # peers.py's reference row
LOCOMO_R10, LOCOMO_MULTI_HOP = 0.75, 0.50  # the memory goal: evidence recall@10, overall and on multi-hop questions


@dataclass
class Result:
    name: str
    argv: list[str] = field(default_factory=list)
    status: str = "not run"  # ok | failed (exit N) | timed out | absent
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def num(s: str) -> float:
    return float(s.replace(",", ""))


# -- running ----------------------------------------------------------------------
def help_text(script: str) -> str:
    try:
        out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ""
    return out.stdout


def supports(help: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help) is not None


def otel_importable() -> bool:
    out = subprocess.run([sys.executable, "-c", "import tracemem.otel"], cwd=ROOT, capture_output=True)
    return out.returncode == 0


def run_script(name: str, quick: bool, timeout: float) -> Result:
    script = os.path.join(BENCH, f"{name}.py")
    res = Result(name)
    if not os.path.exists(script):
        res.status = "absent"
        print(f"\n### {name}.py: absent, skipped", flush=True)
        return res
    args: list[str] = []
    help = help_text(script)
    if quick:
        if supports(help, "--quick"):
            args = ["--quick"]
        else:
            args = [part for flag, value in QUICK_ARGS.get(name, []) if supports(help, flag)
                    for part in ((flag, value) if value else (flag,))]
    if name == "overhead" and supports(help, "--otel") and otel_importable():
        args.append("--otel")
    res.argv = [f"bench/{name}.py", *args]
    print(f"\n### {' '.join(res.argv)}", flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, script, *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=1)
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def pump(stream, key: str, sink) -> None:
        for line in stream:
            chunks[key].append(line)
            sink.write(line)
            sink.flush()

    threads = [threading.Thread(target=pump, args=(proc.stdout, "out", sys.stdout), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, "err", sys.stderr), daemon=True)]
    for t in threads:
        t.start()
    try:
        rc = proc.wait(timeout=timeout)
        res.status = "ok" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        res.status = f"timed out after {timeout:.0f} s"
    for t in threads:
        t.join(timeout=10)
    res.seconds = time.perf_counter() - start
    res.stdout, res.stderr = "".join(chunks["out"]), "".join(chunks["err"])
    print(f"### {name}.py: {res.status} in {res.seconds:.0f} s", flush=True)
    return res


# -- parsing ----------------------------------------------------------------------
def first(pattern: str, text: str, flags: int = re.M) -> Optional[re.Match]:
    return re.search(pattern, text, flags)


def parse_overhead(text: str) -> dict:
    out = {}
    for key, label in (("plain", "plain python (dict)"), ("engine", "tracemem engine (no store)"),
                       ("otel", "tracemem engine + OTel (in-memory)")):
        m = first(rf"^{re.escape(label)}\s+{NUM}\s+{NUM}\s*[–-]\s*{NUM}", text)
        if m:
            out[key] = (num(m.group(1)), num(m.group(2)), num(m.group(3)))
    return out


def parse_store(text: str) -> dict:
    out: dict = {}
    for key, label in (("run", "store, durability=run"), ("stage", "store, durability=stage"),
                       ("engine", "engine only (no store)")):
        m = first(rf"^{re.escape(label)}\s+{NUM}\s+{NUM}\s*[–-]\s*{NUM}", text)
        if m:
            out[key] = (num(m.group(1)), num(m.group(2)), num(m.group(3)))
    m = first(rf"=\s*{NUM}\s*events/s", text)
    if m:
        out["ingest"] = num(m.group(1))
    m = first(rf"growth exponent\s+(nan|{NUM}).*?added over (\d+) turns:\s*{NUM}\s*MB", text)
    if m:
        out["exponent"] = float("nan") if m.group(1) == "nan" else num(m.group(1))
        out["turns"], out["mb"] = int(m.group(3)), num(m.group(4))
    return out


def parse_memory(text: str) -> dict:
    out: dict = {"scale": {}, "locomo": {}}
    for m in re.finditer(rf"n=(\d+):\s*vector top-10 p50 {NUM} ms p95 {NUM} ms \| search\(\) p50 {NUM} p95 {NUM}", text):
        out["scale"][int(m.group(1))] = {"vec_p50": num(m.group(2)), "search_p50": num(m.group(4)),
                                         "search_p95": num(m.group(5))}
    for m in re.finditer(rf"^\s+(.+?)\s+@5 {NUM}\s+@10 {NUM}\s+{NUM} ms/query", text, re.M):
        out["locomo"][m.group(1).strip()] = num(m.group(3))
    m = first(r"LoCoMo evidence recall \((\d+) conversations, (\d+) questions", text)
    if m:
        out["conversations"], out["questions"] = int(m.group(1)), int(m.group(2))
    # multi-hop recall@10 per method, from the table of all conversations ("| name | @5 | @10 | c1 @5 / @10 | …")
    out["multi_hop"] = {}
    whole = text.split("\nall\n", 1)[1] if "\nall\n" in text else ""
    for m in re.finditer(rf"^\| (.+?) \| {NUM} \| {NUM} \| {NUM} / {NUM} \|", whole, re.M):
        out["multi_hop"][m.group(1).strip()] = num(m.group(5))
    return out


def parse_snapshot(text: str) -> dict:
    """Top-1 latency by number of stored runs: the 'p50 ms' column of the table snapshot.py prints
    (falling back to a line naming 100k runs and a latency in ms)."""
    sizes: dict[int, float] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cols = [c.lower() for c in re.split(r"\s{2,}", line.strip())]
        p50 = next((j for j, c in enumerate(cols) if "p50" in c), None)
        if p50 is None or len(cols) < 2 or re.search(r"\d", cols[0]):
            continue
        for row in lines[i + 1:]:
            cells = row.split()
            if len(cells) != len(cols) or not re.fullmatch(r"[\d,]+", cells[0]):
                break
            sizes[int(num(cells[0]))] = num(cells[p50])
    if sizes:
        return {"sizes": sizes}
    for line in lines:
        if "goal" in line.lower() or "ms" not in line:
            continue
        if re.search(r"(?<![\d,])(100,000|100000|100k)(?![\d,])", line, re.I):
            m = re.search(rf"p50\D{{0,12}}?{NUM}\s*ms", line) or re.search(rf"{NUM}\s*ms", line)
            if m:
                return {"sizes": {100_000: num(m.group(1))}}
    return {}


def parse_scale(text: str) -> dict:
    """bench/scale.py: long threads and big stores (the figure, and the size it was measured at)."""
    out: dict = {}
    m = first(r"^## backtrack the last reply of a (\d+)-turn thread", text)
    if m:
        out["turns"] = int(m.group(1))
    for key, label, unit in (("backtrack", "backtrack from the file, first call", "ms"),
                             ("cli", "CLI backtrack RUN reply, start-up included", "s"),
                             ("startup", "CLI start-up (tracemem --help)", "s")):
        m = first(rf"^{re.escape(label)}\s+{NUM}\s*{unit}\b", text)
        if m:
            out[key] = num(m.group(1))
    rows = re.findall(rf"^per turn at turn ([\d,]+)\s+{NUM}\s*ms", text, re.M)
    if rows:
        out["resume_turns"], out["resume"] = int(num(rows[-1][0])), num(rows[-1][1])
    m = first(rf"^first turn after opening, at turn [\d,]+\s+{NUM}\s*ms", text)
    if m:
        out["resume_first"] = num(m.group(1))
    m = first(rf"heap growth exponent: (nan|{NUM}) with a store, (nan|{NUM}) without", text)
    if m:
        out["heap_exponent"] = float("nan") if m.group(1) == "nan" else num(m.group(1))
        out["heap_exponent_no_store"] = float("nan") if m.group(3) == "nan" else num(m.group(3))
    heap = re.findall(rf"^\s+([\d,]+)\s+{NUM}\s+{NUM}\s*$", text, re.M)
    if heap:
        out["heap_turns"], out["heap_mb"] = int(num(heap[-1][0])), num(heap[-1][1])
    for key, label, unit in (("runs", r"store\.runs\(limit=20\) at ([\d,]+) runs", "ms"),
                             ("run", r"store\.run\(id\) at ([\d,]+) runs, random ids", "ms"),
                             ("prune", r"prune\(keep_last=100\) of ([\d,]+) runs", "s")):
        m = first(rf"^{label}\s+{NUM}\s*{unit}\b", text)
        if m:
            out[key], out[f"{key}_n"] = num(m.group(2)), int(num(m.group(1)))
    m = first(r"^## a store of ([\d,]+) runs \(built in ([\d.]+) s", text)
    if m:
        out["built_runs"], out["built_s"] = int(num(m.group(1))), float(m.group(2))
    return out


def scale_goals(res: Result) -> list[tuple[str, str, str, str]]:
    sc = parse_scale(res.stdout)
    rows: list[tuple[str, str, str, str]] = []

    def row(goal: str, target: str, key: str, size_key: str, full: int, limit: float, unit: str, shown: str) -> None:
        if key not in sc:
            rows.append((goal, target, missing(res), "—"))
        elif sc.get(size_key, 0) < full:
            rows.append((goal, target, f"{shown} at only {sc.get(size_key, 0):,}", "not measured (quick)"))
        else:
            rows.append((goal, target, shown, verdict(sc[key], limit, True, unit)))

    row("backtrack, last reply of a 1,000-turn thread, from the file (scale.py)", "≤ 50 ms", "backtrack", "turns",
        1000, 50, " ms", f"{sc.get('backtrack', 0):.1f} ms")
    row("the same through the CLI, start-up included (scale.py)", "≤ 0.8 s", "cli", "turns", 1000, 0.8, " s",
        f"{sc.get('cli', 0):.2f} s (start-up alone {sc.get('startup', 0):.2f} s)")
    row("resume=<run id> per turn at turn 1,000 (scale.py)", "≤ 2 ms", "resume", "resume_turns", 1000, 2, " ms",
        f"{sc.get('resume', 0):.2f} ms (first turn after opening {sc.get('resume_first', 0):.1f} ms)")
    if "heap_exponent" in sc:
        rows.append(("Python heap of a live thread (scale.py)", "linear in turns",
                     f"exponent {sc['heap_exponent']:.2f} with a store ({sc.get('heap_mb', 0):.1f} MB at "
                     f"{sc.get('heap_turns', 0):,} turns), {sc['heap_exponent_no_store']:.2f} without",
                     "met" if sc["heap_exponent"] <= 1.15 else "gap"))
    else:
        rows.append(("Python heap of a live thread (scale.py)", "linear in turns", missing(res), "—"))
    row("store.runs(limit=20) at 1M runs (scale.py)", "≤ 5 ms", "runs", "runs_n", 1_000_000, 5, " ms",
        f"{sc.get('runs', 0):.2f} ms")
    row("store.run(id) at 1M runs (scale.py)", "≤ 10 ms", "run", "run_n", 1_000_000, 10, " ms",
        f"{sc.get('run', 0):.2f} ms")
    row("prune of 100k runs (scale.py)", "≤ 1 s", "prune", "prune_n", 100_000, 1, " s", f"{sc.get('prune', 0):.2f} s")
    return rows


def parse_peers(text: str) -> dict:
    rows = []
    for m in re.finditer(rf"^(?P<label>\S.*?)\s+(?P<runs>\d+)\s+{NUM}\s+{NUM}–{NUM}\s+(\S+)\s+(\S+)\s*$", text, re.M):
        rows.append({"label": m.group("label").strip(), "median": num(m.group(3)), "min": num(m.group(4)),
                     "max": num(m.group(5)), "x_tracemem": m.group(7)})
    chat = []
    for m in re.finditer(rf"^chat (.+?): {NUM} MB added over (\d+) turns, growth exponent (nan|{NUM})(.*)$", text, re.M):
        chat.append({"label": m.group(1), "mb": num(m.group(2)), "turns": int(m.group(3)),
                     "exponent": float("nan") if m.group(4) == "nan" else num(m.group(4)),
                     "ratio": m.group(6).strip(" ,")})
    notes = re.findall(r"^note: (.*)$", text, re.M)
    return {"rows": rows, "chat": chat, "notes": notes}


def parse_durability_goals(text: str) -> list[tuple[str, str, str]]:
    """peers.py's durability section prints the run journal's goals as 'goal: NAME: VALUE µs/stage — VERDICT'
    or 'goal: NAME: not measured (WHY)'."""
    out = []
    for m in re.finditer(r"^goal: (.+?): (?:([0-9][0-9,.]* µs/stage) — (.+?)(?: \(quick run.*\))?|(not measured.*))$",
                         text, re.M):
        if m.group(4):
            out.append((m.group(1), m.group(4), "—"))
        else:
            out.append((m.group(1), m.group(2), m.group(3)))
    return out


# -- the summary ------------------------------------------------------------------
def verdict(value: Optional[float], target: float, at_most: bool, unit: str = "") -> str:
    if value is None:
        return "not measured"
    if (value <= target) if at_most else (value >= target):
        return "met"
    if at_most:
        return f"gap: {value / target:.1f}× the limit (+{value - target:,.4g}{unit})"
    return f"gap: {value / target:.2f} of the target ({value - target:,.4g}{unit})"


def missing(res: Result, what: str = "") -> str:
    if res.status == "absent":
        return f"not run (bench/{res.name}.py absent)"
    if not res.ok:
        return f"not measured ({res.name}.py {res.status})"
    return f"not parsed from {res.name}.py output{what}"


def goals(results: dict[str, Result], quick: bool) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    ov = parse_overhead(results["overhead"].stdout)
    st = parse_store(results["store"].stdout)
    mem = parse_memory(results["memory"].stdout)
    snap = parse_snapshot(results["snapshot"].stdout)
    peers = parse_peers(results["peers"].stdout)
    peer_rows = {r["label"]: r for r in peers["rows"]}
    peer_chat = {c["label"]: c for c in peers["chat"]}

    # engine
    if "engine" in ov:
        m, lo, hi = ov["engine"]
        rows.append(("engine overhead (overhead.py)", "≤ 10 µs/stage", f"{m:.2f} µs/stage (min–max {lo:.2f}–{hi:.2f})",
                     verdict(m, 10, True, " µs")))
    else:
        rows.append(("engine overhead (overhead.py)", "≤ 10 µs/stage", missing(results["overhead"]), "—"))
    if "otel" in ov:
        m, lo, hi = ov["otel"]
        rows.append(("engine + OTel in-memory (overhead.py)", "(no goal)", f"{m:.2f} µs/stage (min–max {lo:.2f}–{hi:.2f})", "info"))

    # store
    if "run" in st:
        m, lo, hi = st["run"]
        extra = ""
        if BASELINE in peer_rows:
            extra = f"; peers.py: {peer_rows[BASELINE]['median']:.2f}"
        rows.append(("store overhead, durability run (store.py)", "≤ 20 µs/stage",
                     f"{m:.2f} µs/stage (min–max {lo:.2f}–{hi:.2f}){extra}", verdict(m, 20, True, " µs")))
    else:
        rows.append(("store overhead, durability run (store.py)", "≤ 20 µs/stage", missing(results["store"]), "—"))
    if "stage" in st:
        m, lo, hi = st["stage"]
        rows.append(("store overhead, durability stage (store.py)", "(no goal)", f"{m:,.2f} µs/stage (min–max {lo:,.2f}–{hi:,.2f})", "info"))
    if "ingest" in st:
        rows.append(("ingest (store.py)", "≥ 100,000 events/s", f"{st['ingest']:,.0f} events/s",
                     verdict(st["ingest"], 100_000, False, " /s")))
    else:
        rows.append(("ingest (store.py)", "≥ 100,000 events/s", missing(results["store"]), "—"))

    # durable modes against the peers (the run journal's goals)
    for name, measured, status in parse_durability_goals(results["peers"].stdout):
        earlier = re.search(r"\(([^()]*) then\)", name)
        target = next(iter(re.findall(r"≤ .*$", name)),
                      f"no slower than {earlier.group(1)}" if earlier else "(see peers.py)")
        rows.append((f"{name} (peers.py)", target, measured, status))

    # chat storage
    target = "≤ 1 MB over 500 turns, linear (exponent ≤ 1.2)"
    if "mb" in st:
        figures = [(st["mb"], st["exponent"], "repeated text, store.py")]
        distinct = next((c for label, c in peer_chat.items() if label.startswith("tracemem") and "distinct" in label), None)
        if distinct and distinct["turns"] == st["turns"]:
            figures.append((distinct["mb"], distinct["exponent"], "distinct text, peers.py"))
        measured = "; ".join(f"{mb:.2f} MB, exponent {ex:.2f} ({how})" for mb, ex, how in figures)
        if st["turns"] != 500:
            status = f"not measured (only {st['turns']} turns)"
        else:
            worst_mb = max(f[0] for f in figures)
            worst_ex = max(f[1] for f in figures)
            gaps = []
            if worst_mb > 1:
                gaps.append(f"{worst_mb:.2f} MB")
            if not worst_ex <= 1.2:
                gaps.append(f"exponent {worst_ex:.2f}")
            status = "met" if not gaps else "gap: " + ", ".join(gaps)
        rows.append((f"chat storage over {st['turns']} turns", target, measured, status))
    else:
        rows.append(("chat storage over 500 turns", target, missing(results["store"]), "—"))

    # exact requests recorded over a long thread
    target = "linear over 1,000 turns (exponent ≤ 1.2)"
    req = re.search(rf"with exact requests: {NUM} MB added over {NUM} turns \(exponent (nan|{NUM})\)",
                    results["model_requests"].stdout)
    if req:
        mb, turns, exponent = num(req.group(1)), int(num(req.group(2))), float(req.group(3).replace(",", ""))
        status = f"not measured (only {turns} turns)" if turns < 1000 else \
            ("met" if exponent <= 1.2 else f"gap: exponent {exponent:.2f}")
        rows.append((f"a thread's exact model requests over {turns:,} turns (model_requests.py)", target,
                     f"{mb:.2f} MB, exponent {exponent:.2f}", status))
    else:
        rows.append(("a thread's exact model requests (model_requests.py)", target, missing(results["model_requests"]), "—"))

    # memory search
    scale = mem["scale"]
    if 100_000 in scale:
        s = scale[100_000]
        rows.append(("memory search at 100k (memory.py)", "≤ 10 ms",
                     f"search() p50 {s['search_p50']:.2f} ms, p95 {s['search_p95']:.2f} ms (vector top-10 p50 {s['vec_p50']:.2f} ms)",
                     verdict(s["search_p50"], 10, True, " ms")))
    elif scale:
        n = max(scale)
        rows.append(("memory search at 100k (memory.py)", "≤ 10 ms",
                     f"only n={n:,} measured: search() p50 {scale[n]['search_p50']:.2f} ms", "not measured (quick)"))
    else:
        rows.append(("memory search at 100k (memory.py)", "≤ 10 ms", missing(results["memory"]), "—"))

    # LoCoMo: recall@10 of the evidence over all questions, and over the multi-hop ones
    goal, target = "LoCoMo evidence recall@10 (memory.py)", f"≥ {LOCOMO_R10:.2f} (multi-hop ≥ {LOCOMO_MULTI_HOP:.2f})"
    ours = {k: v for k, v in mem["locomo"].items() if "baseline" not in k.lower() and "vector only" not in k.lower()}
    if ours:
        name, best = max(ours.items(), key=lambda kv: kv[1])
        scope = f"{mem.get('conversations', '?')} conversations, {mem.get('questions', '?')} questions"
        others = ", ".join(f"{k} {v:.3f}" for k, v in ours.items() if k != name)
        hop = mem["multi_hop"].get(name)
        measured = f"{best:.3f}" + (f", multi-hop {hop:.3f}" if hop is not None else "") + f" ({name}; {scope})" + \
            (f"; {others}" if others else "")
        status = verdict(best, LOCOMO_R10, False)
        if status == "met" and hop is not None:
            status = verdict(hop, LOCOMO_MULTI_HOP, False).replace("gap:", "gap (multi-hop):")
        if mem.get("conversations", 10) < 10:
            status += " (subset)"
        rows.append((goal, target, measured, status))
    elif results["memory"].ok and "LoCoMo skipped" in results["memory"].stdout:
        rows.append((goal, target, "not measured (LoCoMo data absent)", "—"))
    else:
        rows.append((goal, target, missing(results["memory"]), "—"))

    # snapshot
    snap_sizes = snap.get("sizes", {})
    if 100_000 in snap_sizes:
        others = ", ".join(f"{n:,} runs {ms:.2f} ms" for n, ms in sorted(snap_sizes.items()) if n != 100_000)
        rows.append(("snapshot top-1 at 100k runs (snapshot.py)", "≤ 10 ms",
                     f"p50 {snap_sizes[100_000]:.2f} ms" + (f" ({others})" if others else ""),
                     verdict(snap_sizes[100_000], 10, True, " ms")))
    elif snap_sizes:
        n = max(snap_sizes)
        rows.append(("snapshot top-1 at 100k runs (snapshot.py)", "≤ 10 ms",
                     f"only {n:,} runs measured: p50 {snap_sizes[n]:.2f} ms", "not measured (quick)"))
    else:
        rows.append(("snapshot top-1 at 100k runs (snapshot.py)", "≤ 10 ms", missing(results["snapshot"]), "—"))
    rows += scale_goals(results["scale"])
    return rows


def peers_section(res: Result) -> list[str]:
    if not res.ok and not res.stdout:
        return [f"peers.py: {missing(res)}", ""]
    p = parse_peers(res.stdout)
    lines = []
    if p["rows"]:
        lines += ["| variant | µs/stage median | min–max | × tracemem store (run) |", "|---|---:|---:|---:|"]
        for r in p["rows"]:
            lines.append(f"| {r['label']} | {r['median']:,.2f} | {r['min']:,.2f}–{r['max']:,.2f} | {r['x_tracemem']} |")
        lines.append("")
    if p["chat"]:
        lines += ["| chat storage | MB added | turns | growth exponent | vs tracemem |", "|---|---:|---:|---:|---|"]
        for c in p["chat"]:
            lines.append(f"| {c['label']} | {c['mb']:,.2f} | {c['turns']} | {c['exponent']:.2f} | {c['ratio'] or '—'} |")
        lines.append("")
    for n in p["notes"]:
        lines.append(f"- {n}")
    if p["notes"]:
        lines.append("")
    if not lines:
        lines = [f"peers.py: {missing(res)}", ""]
    return lines


def machine() -> list[str]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count() or 0
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
            mem = f", {kb / 2**20:.1f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = "load average at start {:.2f} / {:.2f} / {:.2f} (1/5/15 min)".format(*os.getloadavg())
    versions = []
    for pkg in PACKAGES:
        try:
            versions.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            versions.append(f"{pkg} (not installed)")
    return [f"- machine: {ncpu} CPUs ({cpu}){mem}, {platform.system()} {platform.release()}",
            f"- python {platform.python_version()} ({sys.executable})",
            f"- packages: {', '.join(versions)}",
            *([f"- {load}"] if load else [])]


def write_report(path: str, results: dict[str, Result], quick: bool, started: dt.datetime, info: list[str],
                 total: float) -> None:
    lines = ["# Benchmark results", "",
             "Generated by `bench/run_all.py` (`make bench`); do not edit by hand. Earlier measurements, dated, "
             "with the machine and its load: [HISTORY.md](HISTORY.md) (kept by hand; this script never "
             "rewrites it).", "",
             f"- date: {started.strftime('%Y-%m-%d %H:%M %Z').strip()} ({'quick smoke run' if quick else 'full run'}, "
             f"{total / 60:.1f} min in all)",
             *info, "",
             "## Goals", "",
             "| goal | target | measured (median) | status |", "|---|---|---|---|"]
    for goal, target, measured, status in goals(results, quick):
        lines.append(f"| {goal} | {target} | {measured.replace('|', '/')} | {status} |")
    lines += ["",
              "Timings are medians over interleaved repetitions in one process; the min–max spread shows "
              "how noisy the machine was. The chat goal is judged on the larger of the two tracemem figures "
              "(bench/store.py repeats the same message every turn, which DuckDB compresses; peers.py "
              "uses different text every turn).", "",
              "## Side by side with LangGraph and Burr (peers.py)", ""]
    lines += peers_section(results["peers"])
    lines += ["## Scripts", "", "| script | command | status | seconds |", "|---|---|---|---:|"]
    for name in SCRIPTS:
        r = results[name]
        lines.append(f"| {name}.py | `{' '.join(r.argv) or '—'}` | {r.status} | {r.seconds:.0f} |")
    lines.append("")
    for name in SCRIPTS:
        r = results[name]
        lines += [f"## Output: {name}.py", ""]
        if r.status in ("absent", "not run"):
            lines += [f"({r.status})", ""]
            continue
        lines += ["```text", r.stdout.rstrip() or "(no output)", "```", ""]
        if r.stderr.strip() and not r.ok:
            tail = r.stderr.strip()[-4000:]
            lines += ["stderr (last 4000 characters):", "", "```text", tail, "```", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, few repetitions")
    ap.add_argument("--only", default=",".join(SCRIPTS), help="comma-separated subset of " + ",".join(SCRIPTS))
    ap.add_argument("--out", default=os.path.join(BENCH, "RESULTS.md"))
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per script (default 900)")
    args = ap.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SCRIPTS)
    if unknown:
        ap.error(f"unknown scripts {sorted(unknown)}; choose from {', '.join(SCRIPTS)}")
    started = dt.datetime.now().astimezone()
    info = machine()
    print("\n".join(info), flush=True)
    t0 = time.perf_counter()
    results = {name: (run_script(name, args.quick, args.timeout) if name in chosen else Result(name))
               for name in SCRIPTS}
    total = time.perf_counter() - t0
    write_report(args.out, results, args.quick, started, info, total)
    print(f"\nwrote {os.path.relpath(args.out, os.getcwd())} ({total / 60:.1f} min)")
    for goal, target, measured, status in goals(results, args.quick):
        print(f"  [{status}] {goal} ({target}): {measured}")


if __name__ == "__main__":
    main()
