"""Server time of the viewer's pages (`tracemem ui`) on a big store. Prints figures; asserts nothing.

    python bench/ui.py [--runs 100000] [--steps 1000] [--huge 200000] [--reps 5]

Builds one store file with:
- `--runs` recorded runs: one real 7-stage run (recorded by a flow), copied with new ids, times,
  pipelines, subjects and statuses by SQL inside DuckDB, so filling 100k runs takes seconds;
- one real run of about `--steps` steps (a three-stage loop) whose answer depends on every round;
- one real run of about `--huge` steps (a counter and its loop decider, each round reading the
  last): a page of it, and its backtrack, must cost what they cost for a short run.

Then asks the app in process (Starlette's TestClient, no network) for each page and reads the
`Server-Timing` header the app sets (time until the response head, page rendered), median of
`--reps` after one warm-up. Goals: the runs page ≤ 200 ms at 100k runs; the run page and the
backtrack page of a 1,000-step run ≤ 300 ms each, of a 200,000-step run ≤ 1 s each. The baseline,
measured in the same run, is what every request pays before any page work: opening the store
read-only and closing it (the
viewer never keeps the file open, so an agent can always start beside it).
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pydantic import BaseModel  # noqa: E402

from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402

SOURCES = ("runs", "steps", "reads", "writes", "decisions")


class Chat(BaseModel):
    question: str = ""
    notes: list[str] = []
    route: str = ""
    answer: str = ""


def read(s: Chat) -> None:
    s.notes.append(f"read {s.question}")


def think(s: Chat) -> None:
    s.notes.append(f"thought {len(s.notes)}")


def choose(s: Chat) -> str:
    return "long" if len(s.question) > 10 else "short"


def long(s: Chat) -> None:
    s.route = "long"


def short(s: Chat) -> None:
    s.route = "short"


def answer(s: Chat) -> None:
    s.answer = f"{s.route}: {s.notes[-1]}"


def again(s: Chat) -> bool:
    return len(s.notes) < 2 * ROUNDS[0]  # two notes a round


ROUNDS = [333]


class Count(BaseModel):
    n: int = 0
    answer: str = ""


def bump(s: Count) -> None:
    s.n += 1


def counted(s: Count) -> None:
    s.answer = f"counted {s.n}"


def huge_run(path: str, steps: int) -> str:
    """A run of about `steps` steps: a counter and its loop decider, round after round, then the answer."""
    rounds = max(1, steps // 2)
    counter = (Pipeline("counter", Count, max_iterations=rounds + 5).then(bump)
               .loop_to("bump", when=lambda s: s.n < rounds, max_iterations=rounds + 5).then(counted).build())
    with Store(path) as store:
        return counter.run({}, store=store).run_id


def fill(path: str, runs: int, steps: int) -> tuple[str, float]:
    """The store described in the module docstring; returns the long run's id and the fill time."""
    started = time.perf_counter()
    chat = (Pipeline("chat", Chat).then(read).then(think).branch(choose, {"long": long, "short": short})
            .then(answer).then(think, id="think2").build())
    ROUNDS[0] = max(1, steps // 3)
    looping = (Pipeline("looping", Chat, max_iterations=ROUNDS[0] + 5).then(read).then(think)
               .loop_to("read", when=again, max_iterations=ROUNDS[0] + 5).then(answer).build())
    with Store(path) as store:
        seed = chat.run({"question": "what is the refund window?"}, store=store, subject="user-0")
        store.flush()
        rid = "printf('%016x', i) AS run_id"
        shift = "started_at - to_seconds(i) AS started_at, ended_at - to_seconds(i) AS ended_at"
        copy = {  # by column name, so columns added by later schema versions are copied too
            "runs": f"t.* REPLACE ({rid}, ['chat', 'support', 'triage', 'rag', 'tools'][1 + i % 5] AS pipeline, "
                    "CASE WHEN i % 97 = 0 THEN 'failed' WHEN i % 89 = 0 THEN 'paused' WHEN i % 83 = 0 "
                    f"THEN 'interrupted' ELSE 'ok' END AS status, {shift}, 'user-' || (i % 1000) AS subject)",
            "steps": f"t.* REPLACE ({rid}, {shift})",
            "reads": f"t.* REPLACE ({rid})",
            "writes": f"t.* REPLACE ({rid})",
            "decisions": f"t.* REPLACE ({rid})",
        }
        for table in SOURCES:
            store.sql(f"INSERT INTO {table} BY NAME SELECT {copy[table]} FROM {table} t, "
                      f"range(1, {max(runs - 1, 1)}) r(i) WHERE t.run_id = ?", [seed.run_id])
        long_run = looping.run({"question": "a long conversation"}, store=store, subject="user-1")
    return long_run.run_id, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--huge", type=int, default=200_000, help="steps of the huge run (0: none)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from starlette.testclient import TestClient

    from tracemem.ui import create_app

    folder = tempfile.mkdtemp(prefix="bench-ui-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = os.path.join(folder, "ui.duckdb")
    long_id, fill_s = fill(path, args.runs, args.steps)
    started = time.perf_counter()
    huge_id = huge_run(path, args.huge) if args.huge else None
    huge_s = time.perf_counter() - started
    with Store(path, read_only=True) as store:
        total, steps, huge = store.sql(
            "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps WHERE run_id = ?), "
            "(SELECT count(*) FROM steps WHERE run_id = ?)", [long_id, huge_id]).fetchall()[0]
    print(f"store: {total:,} runs, {os.path.getsize(path) / 1e6:.1f} MB, filled in {fill_s:.1f} s; long run "
          f"{long_id[:8]}: {steps} steps; huge run {str(huge_id)[:8]}: {huge:,} steps, recorded in {huge_s:.1f} s")

    def open_close() -> float:
        start = time.perf_counter()
        Store(path, read_only=True, snapshot_if_locked=True, embedder=None, snapshot_embedder=None).close()
        return (time.perf_counter() - start) * 1000

    web = TestClient(create_app(path, timeout=600), base_url="http://127.0.0.1")  # (a bench: no time limit)
    nodes: dict[str, str] = {}

    token = re.search(r'name="token" value="([^"]+)"', web.get("/sql").text).group(1)

    def page(url: str) -> float:
        if url.startswith("POST "):  # the SQL console runs a query only when its own form posts it
            r = web.post(url[5:].split("?")[0], data={"q": url.split("?q=", 1)[1].replace("+", " "), "token": token})
        else:
            r = web.get(url)
        if r.status_code != 200:
            raise SystemExit(f"{url} answered {r.status_code}: {r.text[:300]}")
        found = re.search(r"·\s+(\d+) nodes", r.text)
        if found:
            nodes[url] = f"{found.group(1)} nodes" + (", walk cut at its budget" if 'id="truncated"' in r.text else "")
        return float(r.headers["server-timing"].split("dur=")[1])

    pages = [("runs page", "/runs", 200), ("runs page, status=failed", "/runs?status=failed", 200),
             ("runs page, subject + id prefix", "/runs?subject=user-7&id=0", 200),
             ("runs page 500 (offset 25k)", "/runs?page=500", 200),
             (f"run page, {steps}-step run", f"/runs/{long_id}", 300),
             (f"backtrack page, {steps}-step run", f"/runs/{long_id}/backtrack?path=answer", 300),
             ("  same, whole walk (depth 100k)", f"/runs/{long_id}/backtrack?path=answer&depth=100000&nodes=20000",
              None),
             ("scope page, middle step", f"/runs/{long_id}/scope/{max(1, steps // 2)}", None),
             *([(f"run page, {huge:,}-step run", f"/runs/{huge_id}", 1000),
                ("  same, a page in the middle", f"/runs/{huge_id}?at={huge // 2}", 1000),
                (f"backtrack page, {huge:,}-step run", f"/runs/{huge_id}/backtrack?path=answer", 1000)]
               if huge_id else []),
             ("memory page", "/memories", None),
             ("SQL page (fenced), GROUP BY", "POST /sql?q=SELECT+status,count(*)+FROM+runs+GROUP+BY+1", None)]
    samples: dict[str, list[float]] = {"baseline": []}
    open_close()
    for _, url, _ in pages:
        page(url)  # warm-up
    for _ in range(args.reps):  # interleaved, so a noisy moment hits every figure alike
        samples["baseline"].append(open_close())
        for _, url, _ in pages:
            samples.setdefault(url, []).append(page(url))
    baseline = statistics.median(samples["baseline"])
    print(f"baseline: open the store read-only and close it (every request does): {baseline:7.1f} ms")
    print(f"## server time per page (Server-Timing), median of {args.reps}; × baseline; goal")
    for label, url, goal in pages:
        ms = statistics.median(samples[url])
        verdict = "" if goal is None else f"goal ≤ {goal} ms: {'met' if ms <= goal else 'NOT met'}"
        extra = f"  [{nodes[url]}]" if url in nodes else ""
        print(f"{label:34s} {ms:8.1f} ms  {ms / baseline:5.1f}x  {verdict}{extra}")
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores)")


if __name__ == "__main__":
    main()
