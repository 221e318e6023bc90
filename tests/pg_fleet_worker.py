"""One worker process of the fleet test (tests/test_pg_fleet.py): the demo support agent, recording into
a shared PostgreSQL store with durability "stage".

    python tests/pg_fleet_worker.py URL WORKER RUNS SUBJECTS [--flag-at N] [--hang-after N]

Each run answers one of the demo's three turns for one of SUBJECTS shared subjects; every other run
resumes the newest finished run of that subject, whichever worker recorded it, so threads continue
across workers. `--flag-at N`: after run N, flag a memory of the first subject that recall has
injected, and print `FLAGGED <memory_id> <utc iso time after the flag committed>`. `--hang-after N`:
after N runs, start one more whose second stage never ends (prints `HANGING <run_id>`), to be killed.
Prints `DONE <run ids...>` at the end.
"""
from __future__ import annotations

import argparse
import sys
import time

from stages.demo import SESSIONS, build_flow, models
from tracemem import Pipeline
from tracemem.store import Store
from tracemem.times import utc_now


def flag_one(store: Store, subject: str) -> None:
    rows = store.sql("SELECT m.memory_id FROM memories m JOIN memory_uses u USING (memory_id) "
                     "WHERE u.outcome = 'injected' AND m.subject = ? AND m.review_state IN ('fresh', 'reviewed') "
                     "AND m.deleted_at IS NULL ORDER BY m.created_at LIMIT 1", [subject]).fetchall()
    if not rows:
        print("FLAGGED none", flush=True)
        return
    store.memory.flag(rows[0][0], "contradicted", "fleet test: flagged in one worker")
    print(f"FLAGGED {rows[0][0]} {utc_now().isoformat()}", flush=True)


def hang(store: Store, worker: int) -> None:
    from stages.scope import AgentScope

    def first(scope: AgentScope) -> None:
        scope.context["first"] = "done"

    def second(scope: AgentScope, ctx) -> None:
        print(f"HANGING {ctx.run_id}", flush=True)
        time.sleep(3600)

    Pipeline("victim", AgentScope).then(first).then(second).build().run(
        {"question": "never finishes"}, store=store, subject=f"victim-{worker}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("worker", type=int)
    parser.add_argument("runs", type=int)
    parser.add_argument("subjects", type=int)
    parser.add_argument("--flag-at", type=int, default=-1)
    parser.add_argument("--hang-after", type=int, default=-1)
    parser.add_argument("--lease", type=float, default=2.0)
    args = parser.parse_args()
    store = Store(args.url, durability="stage", lease_seconds=args.lease,
                  log=lambda message: print(f"LOG {message}", file=sys.stderr, flush=True))
    flow, env = build_flow(), models()
    done = []
    for i in range(args.runs):
        if i == args.hang_after:
            hang(store, args.worker)
        subject = f"user-{(i + args.worker) % args.subjects}"
        turn, question = SESSIONS[(i // args.subjects + args.worker) % len(SESSIONS)]
        resume = None
        if i % 2:
            latest = store.runs(subject=subject, status="ok", limit=1, pipeline="support")
            resume = latest[0]["run_id"] if latest else None
        run = flow.run({"question": question, "turn_id": f"w{args.worker}-{i}-{turn}"}, store=store,
                       subject=subject, env=env, resume=resume)
        done.append(run.run_id)
        if i == args.flag_at:
            flag_one(store, "user-0")
    store.close()
    print("DONE " + " ".join(done), flush=True)


if __name__ == "__main__":
    sys.exit(main())
