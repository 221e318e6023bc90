"""`load_snapshot`: show the agent what it decided the last time it met a similar question.

Embeds the current question, finds the most similar past runs of the same
pipeline made with the same embedder id (exact cosine over `run_embeddings`),
keeps those at or above `min_score` — strictly: none qualifies → nothing is
injected, no fallback; no question → no search; a past run that failed or was
interrupted answered nothing and is passed over (logged) — and writes each, projected, to
the scope as formatted context naming the past run, its query and the score.
Each use is a `snapshot_uses` row, so backtracking crosses into the past run.

Past runs are found by the question they recorded (`runs.query`): the pipeline
must record one — `Pipeline(..., query="question")`, which is the default when the
scope has a `question` field; building a pipeline that uses `load_snapshot` and
records no query is an error. When nothing is injected, the step log says why:
no past run yet, past runs that recorded no query, none embedded with this
embedder, or none at cosine ≥ min_score (naming the closest and its score).

Projections: "decisions" (each decider's choice, the rule that matched and the
values it read), "answer" (the past run's final value of `answer_path`), "writes"
(its commit log), "full" (all three).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Optional

from tracemem import Run, StageContext, TracememError
from tracemem.text import clip
from tracemem.trace import describe_decision

PROJECTIONS = ("decisions", "answer", "writes", "full")


def _question(scope: Any, query_from: Optional[str]) -> str:
    if query_from:
        return str(getattr(scope, query_from) or "").strip()
    question = str(getattr(scope, "question", "") or "").strip() if hasattr(type(scope), "question") else ""
    if question:
        return question
    for message in reversed(list(getattr(scope, "messages", []) or [])):  # Messages, or dicts of older scopes
        if message.get("role") == "user":
            return str(message.get("content") or "").strip()
    return ""


def project(run: Run, projection: str, answer_path: str, max_writes: int = 30) -> str:
    """The text a past run contributes to the prompt under one projection."""
    parts: list[str] = []
    if projection in ("decisions", "full"):
        steps = {s.step: s for s in run.steps}
        for d in run.decisions:
            parts.append(f"  {describe_decision(steps[d.step].stage, d.chosen, d.evidence, values=True)}")
        if not run.decisions:
            parts.append("  (no decisions recorded)")
    if projection in ("answer", "full"):
        try:
            value = run.value_at(answer_path)
        except TracememError:
            value = None
        parts.append(f"  answer: {json.dumps(value, ensure_ascii=False)}")
    if projection in ("writes", "full"):
        for w in run.writes[:max_writes]:
            shown = "" if w.value is None else " " + clip(w.value, 120)
            parts.append(f"  {w.path} {w.verb}{shown}")
        if len(run.writes) > max_writes:
            parts.append(f"  … {len(run.writes) - max_writes} more writes")
    return "\n".join(parts)


def _finished_runs(store: Any, ctx: StageContext, question: str, embedder: Any, top_k: int,
                   min_score: float) -> list[tuple[str, str, float]]:
    """The top_k most similar past runs that ended ok and are not suspect: a failed or interrupted run
    answered nothing, and a suspect one (marked wrong, or resting on a since-flagged memory or on a
    suspect past run) must not teach its answer again."""
    k = top_k
    while True:
        found = store.similar_runs(ctx.pipeline, question, embedder=embedder, top_k=k, min_score=min_score,
                                   exclude=(ctx.run_id,))
        ids = [run_id for run_id, _, _ in found]
        status = dict(store.sql("SELECT run_id, status FROM runs WHERE list_contains(?, run_id)",
                                [ids]).fetchall()) if ids else {}
        suspect = store.suspect(ids)
        hits = [h for h in found if status.get(h[0]) == "ok" and h[0] not in suspect and not ctx.excluded("run", h[0])]
        if len(hits) >= top_k or len(found) < k:  # enough, or no more candidates above min_score
            break
        k *= 2
    chosen = hits[:top_k]
    last = chosen[-1][2] if len(chosen) == top_k else -1.0
    for run_id, _, score in found:  # say which better-scored runs were passed over, and why
        if score < last:
            continue
        if status.get(run_id) != "ok":
            ctx.log(f"load_snapshot: skipped past run {run_id} (status {status.get(run_id)}, similarity {score:.2f})")
        elif run_id in suspect:
            ctx.log(f"load_snapshot: skipped suspect past run {run_id} ({suspect[run_id]}; similarity {score:.2f})")
        elif ctx.excluded("run", run_id):
            ctx.log(f"load_snapshot: left out past run {run_id} (counterfactual; similarity {score:.2f})")
    return chosen


def _why_nothing(store: Any, ctx: StageContext, question: str, embedder: Any, min_score: float) -> str:
    """Why no past run qualified, in the words a user can act on."""
    pipeline = ctx.run.pipeline
    [(runs, with_query)] = store.sql("SELECT count(*), count(query) FROM runs WHERE pipeline = ? AND run_id <> ?",
                                     [pipeline, ctx.run_id]).fetchall()
    if not runs:
        return f"no past run of '{pipeline}' to compare with yet"
    if not with_query:
        return (f"none of the {runs} past runs of '{pipeline}' recorded a query, so none can match; build the "
                f"pipeline with Pipeline('{pipeline}', ..., query='<field holding the question>')")
    embedder = embedder or store.snapshot_embedder
    if embedder is None:
        return "the store embeds no run queries (Store(..., snapshot_embedder=None))"
    [(embedded,)] = store.sql("SELECT count(*) FROM run_embeddings WHERE pipeline = ? AND embedder_id = ? "
                              "AND run_id <> ?", [pipeline, embedder.embedder_id, ctx.run_id]).fetchall()
    if not embedded:
        return f"no past run of '{pipeline}' has its query embedded with {embedder.embedder_id}"
    closest = store.similar_runs(pipeline, question, embedder=embedder, top_k=1, min_score=-1.0,
                                 exclude=(ctx.run_id,))
    best = f" (closest: run {closest[0][0]} at {closest[0][2]:.2f})" if closest else ""
    return f"no past run at cosine ≥ {min_score}{best}"


def load_snapshot(*, embedder: Any = None, top_k: int = 1, min_score: float = 0.7, projection: str = "decisions",
                  query_from: Optional[str] = None, into: str = "snapshot", answer_path: str = "answer"
                  ) -> Callable[[Any, StageContext], None]:
    """A stage writing past-run context to `scope.<into>` (empty when no past run qualifies)."""
    if projection not in PROJECTIONS:
        raise TracememError(f"load_snapshot: projection must be one of {', '.join(PROJECTIONS)}, got {projection!r}")

    def snapshot(scope: Any, ctx: StageContext) -> None:
        store = ctx.store
        if store is None:
            raise TracememError("load_snapshot needs a store: flow.run(..., store=Store('agent.duckdb'))")
        question = _question(scope, query_from)
        if not question:
            ctx.log("load_snapshot: no question in the scope; no search")
            setattr(scope, into, "")
            return
        hits = _finished_runs(store, ctx, question, embedder, top_k, min_score)
        if not hits:
            ctx.log(f"load_snapshot: {_why_nothing(store, ctx, question, embedder, min_score)}; nothing injected")
            setattr(scope, into, "")
            return
        blocks = []
        for run_id, past_query, score in hits:
            past = store.run(run_id)
            blocks.append(f"Past run {run_id} (similarity {score:.2f}) answered a similar question: "
                          f"{json.dumps(past_query, ensure_ascii=False)}\n{project(past, projection, answer_path)}")
            ctx.emit("snapshot_uses", source_run_id=run_id, score=score, projection=projection, query=question)
            ctx.log(f"load_snapshot: injected past run {run_id} (similarity {score:.2f}, projection '{projection}')")
        setattr(scope, into, "\n\n".join(blocks))

    snapshot.__name__ = snapshot.__qualname__ = "load_snapshot"
    snapshot.requires_query = "finds past runs by the query each run recorded"  # type: ignore[attr-defined]
    return snapshot
