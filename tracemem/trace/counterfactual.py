"""Counterfactual checks: would this value have been different without that source?

`trace.counterfactual(without=source, flow=flow)` re-executes the traced run from
the step where the source first entered it, as a fork that leaves the source out
(recall excludes the memory, prompt assembly drops sections built from it,
load_snapshot does not load the past run), and compares the value. Model calls
whose exact request did not change are answered from the record (replay), so only
the calls the removal changed reach a model. The fork is recorded with its label,
so the answer is evidence anyone can re-read: causal, unlike `influence()`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..errors import TracememError, UsageError
from ..record import RunRecord


BASIS = ("causal: the run re-executed without the source from where it entered; unchanged model requests "
         "were answered from the record")
_ENTRIES = {"memory": (("memory_uses", "memory_id"), ("prompt_sections", "source_id")),
            "run": (("snapshot_uses", "source_run_id"),)}


@dataclass
class Counterfactual:
    """What re-executing without a source did to one value."""

    path: str
    without: str
    before: Any
    after: Any
    changed: bool
    run_id: str  # the counterfactual run (a fork of the traced run)
    from_step: int  # the fork continued after this step of the traced run
    live_calls: int  # model calls whose request changed, sent to a model
    replayed_calls: int  # model calls answered from the record
    basis: str = BASIS
    outcome: str = "ok"  # how the counterfactual run ended: ok, failed, or paused (it never waits for a person)
    paused_at: Optional[str] = None  # paused: the stage it stopped at (a question, or an effect not in the record)

    def __str__(self) -> str:
        if self.outcome == "paused":
            return (f"without {self.without}, the run stopped at stage '{self.paused_at}', which asks a person (or "
                    f"would repeat a side effect the record does not hold), so {self.path} is not known: "
                    f"{json.dumps(self.before, default=str)} → unknown (counterfactual run {self.run_id}, paused; "
                    f"{self.live_calls} live and {self.replayed_calls} replayed model call(s))")
        verdict = "changes" if self.changed else "does not change"
        return (f"without {self.without}, {self.path} {verdict}: {json.dumps(self.before, default=str)} → "
                f"{json.dumps(self.after, default=str)} (counterfactual run {self.run_id}, {self.live_calls} live "
                f"and {self.replayed_calls} replayed model call(s); {self.basis})")


def _source_text(without: Any) -> str:
    text = str(without)
    kind, sep, rest = text.partition(":")
    if sep and kind in ("memory", "run", "section") and rest:
        return text
    if text.startswith("m_"):
        return f"memory:{text}"
    raise UsageError(f"a counterfactual leaves out 'memory:ID', 'run:ID' or 'section:KIND:ID', got {text!r}")


def entry_step(run: "RunRecord", source: str) -> Optional[int]:
    """The first step of `run` where `source` ("kind:id") entered it (None: it never did)."""
    kind, _, ident = source.partition(":")
    steps = [row["step"] for table, column in _ENTRIES.get(kind, ()) for row in run.rows.get(table, ())
             if row.get(column) == ident and row.get("outcome", "injected") == "injected"]
    if kind == "section":
        skind, _, sid = ident.partition(":")
        steps += [row["step"] for row in run.rows.get("prompt_sections", ())
                  if row.get("source_kind") == skind and row.get("source_id") == sid]
    return min(steps) if steps else None


def counterfactual(run: RunRecord, path: str, without: Any, *, flow: Any, model: Any = None,
                   env: Optional[Mapping[str, Any]] = None, store: Any = None,
                   live_effects: bool = False) -> Counterfactual:
    """Re-execute the traced run without `without` and compare its value at `path` (see the module doc;
    `Trace.counterfactual` calls this). `model` (or `env`) is what a changed model call goes to; `flow` is
    the flow that recorded the run. Side effects are replayed from the record, never made again: one the record
    does not hold stops the run there (reported as its outcome), unless `live_effects=True`."""
    source = _source_text(without)
    store = store or run.store
    if store is None:
        raise TracememError("a counterfactual is recorded as a forked run: pass store=, or trace a run loaded "
                            "from a store")
    step = entry_step(run, source)
    if step is None:
        raise UsageError(f"{source} never entered run {run.run_id}; `store.affected('{source}')` lists the runs "
                         f"it did")
    after = max((s.step for s in run.steps if s.step < step), default=0)
    fork_env = dict(env or {})
    if model is not None:
        fork_env["model"] = model
    label = {"without": [source], "of_run": run.run_id, "path": path, "basis": "causal"}
    fork = flow.fork(run, after, store=store, env=fork_env, replay=True, without=[source], counterfactual=label,
                     raise_on_error=False, live_effects=live_effects)
    before, now = _value(run, path), _value(fork, path)
    calls = fork.rows.get("model_calls", [])
    replayed = sum(1 for c in calls if c.get("replayed"))
    paused = fork.status == "paused"
    return Counterfactual(path, source, before, None if paused else now, not paused and before != now, fork.run_id,
                          after, len(calls) - replayed, replayed, outcome=fork.status,
                          paused_at=(fork.resume_at or {}).get("stage") if paused else None)


def _value(run: "RunRecord", path: str) -> Any:
    try:
        return run.value_at(path)
    except TracememError:
        return None
