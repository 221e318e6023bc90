"""The memory pages: subjects, each subject's records, and one record with its history and every run
that injected or excluded it (and why).

Flag and forget are there only when the viewer was started with `--allow-edit`. They go through
`store.memory` on a writable Store opened for that one action (`Source.writing`), so each change
lands in `memory_events` like any other; while an agent holds the file the action is refused with
the reason, and nothing is changed.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..errors import UsageError
from ..memory.errors import MemoryNotFoundError
from ..memory.records import REVIEW_STATES
from ..store import StoreLockedError
from .queries import rows
from .web import check_post, render, source

__all__ = ["ROUTES", "memory_uses"]


def memories(request: Request) -> Response:
    subject = (request.query_params.get("subject") or "").strip()
    everything = bool(request.query_params.get("all"))
    with source(request).reading() as store:
        subjects = rows(
            store,
            "SELECT subject, count(*) FILTER (WHERE deleted_at IS NULL) AS live, count(*) AS total, "
            "count(*) FILTER (WHERE review_state IN ('stale', 'contradicted') AND deleted_at IS NULL) AS flagged "
            "FROM memories GROUP BY subject ORDER BY subject LIMIT 1000")
        if not subject and len(subjects) == 1:
            subject = subjects[0]["subject"]
        records, uses = [], {}
        if subject:
            records = store.memory.records(subject, include_forgotten=everything)
            uses = {r["memory_id"]: (r["injected"], r["excluded"]) for r in rows(
                store, "SELECT u.memory_id, count(*) FILTER (WHERE u.outcome = 'injected') AS injected, "
                "count(*) FILTER (WHERE u.outcome <> 'injected') AS excluded FROM memory_uses u "
                "WHERE u.memory_id IN (SELECT memory_id FROM memories WHERE subject = ?) GROUP BY 1", [subject])}
    return render(request, "memories.html", subjects=subjects, subject=subject, records=records, uses=uses,
                  everything=everything)


def memory_uses(store: Any, memory_id: str) -> list[dict[str, Any]]:
    """Every recorded use of a memory: run, step and stage, injected or excluded, and why."""
    return rows(store,
        "SELECT u.run_id, u.step, s.stage, u.outcome, u.reason, u.score, u.rank, r.started_at, r.status, r.query "
        "FROM memory_uses u LEFT JOIN runs r USING (run_id) "
        "LEFT JOIN steps s ON s.run_id = u.run_id AND s.step = u.step "
        "WHERE u.memory_id = ? ORDER BY r.started_at, u.run_id, u.step", [memory_id])


def memory(request: Request) -> Response:
    memory_id = request.path_params["memory_id"]
    with source(request).reading() as store:
        try:
            record = store.memory.get(memory_id)
        except MemoryNotFoundError:
            record = None
        history = store.memory.history(memory_id)  # MemoryNotFoundError (404) when it never existed
        uses = memory_uses(store, memory_id)
        prompts = rows(store, "SELECT run_id, prompt_id, idx, step FROM prompt_sections "
                              "WHERE source_kind = 'memory' AND source_id = ? ORDER BY run_id, prompt_id, idx",
                       [memory_id])
    return render(request, "memory.html", memory_id=memory_id, record=record, history=history, uses=uses,
                  prompts=prompts, states=REVIEW_STATES, done=request.query_params.get("done", ""))


async def change(request: Request) -> Response:
    """POST /memories/{id}/flag (state, reason) or /forget (reason), only with --allow-edit."""
    memory_id, action = request.path_params["memory_id"], request.path_params["action"]
    if action not in ("flag", "forget"):
        return render(request, "error.html", status=404, title="Not found",
                      message=f"there is no memory action {action!r}; the actions are flag and forget")
    if not request.app.state.allow_edit:
        return render(request, "error.html", status=403, title="Read-only viewer",
                      message="this viewer was started read-only; start it with `tracemem ui --allow-edit` "
                              "to flag or forget memories")
    form = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
    check_post(request, form.get("token"))
    reason = (form.get("reason") or "").strip()
    state = form.get("state", "")
    if action == "flag" and (state not in REVIEW_STATES or not reason):
        raise UsageError(f"flag needs a review state ({', '.join(REVIEW_STATES)}) and a reason; got "
                         f"state {state!r} and {'a' if reason else 'no'} reason")

    def apply() -> None:
        with source(request).writing() as store:
            if action == "flag":
                store.memory.flag(memory_id, state, reason)
            else:
                store.memory.forget(memory_id, reason=reason or None)

    try:
        await run_in_threadpool(apply)
    except StoreLockedError as err:
        return render(request, "error.html", status=409, title="The store is busy",
                      message=f"memory {memory_id} was not changed: {err} The viewer keeps reading a copy while "
                              f"an agent runs; try again when it has finished.")
    done = "flagged" if action == "flag" else "forgotten"
    return RedirectResponse(f"/memories/{quote(memory_id, safe='')}?done={done}", status_code=303)


ROUTES = [Route("/memories", memories), Route("/memories/{memory_id}", memory),
          Route("/memories/{memory_id}/{action:str}", change, methods=["POST"])]
