"""Stages with side effects, `.then(pay, effect=True)`: made once, replayed from the record after that.

A stage that pays, mails or books cannot be run again to answer "what if": so an
effect stage records, as its `effects` row, which fields it read (and their values'
hash) and what it wrote. A run that replays a record (a `replay=True` fork, a
counterfactual) replays the stage when it would read the same values: its recorded
writes are written again, as this step's, and the function is not called. When the
values differ (the effect would not be the same one), the stage is not run: the run
pauses there, and `flow.resume(run, live_effects=True)` makes it for real. A plain run
or fork calls it as any stage. See flow/effects.py for the whole table.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable

import pydantic_core

from ..scope.recorder import recorder_of, write_path
from ..scope.tracked import unwrap
from .effects import effect_hash, replayed_result
from .step_effects import Making

__all__ = ["effect_stage"]


def _jsonable(value: Any) -> Any:
    return pydantic_core.to_jsonable_python(unwrap(value), fallback=str)


def _replayed(view: Any, ctx: Any) -> bool:
    """Whether the recorded run this one replays holds this stage with the same inputs: then its writes are
    written again and True returned. Pauses instead when the record holds it with other inputs, or not at all
    (`ctx.effects.policy.withholds`)."""
    policy, rec, name = ctx.effects.policy, recorder_of(view), ctx.stage
    first = policy.peek("stage", name)
    if first is not None:
        values = {root: _jsonable(rec.read(root, tracked=False)) for root in replayed_result(first)["reads"]}
        row = policy.recorded("stage", name, effect_hash("stage", name, values))
        if row is not None:
            for path, verb, value in replayed_result(row)["writes"]:
                write_path(view, path, verb, json.loads(value) if value is not None else None)
            ctx.effects.record(Making("stage", name, row["input_hash"], row.get("idempotency_key") or ""), "replayed",
                               replayed_result(row), None, time.time_ns(), source=row)
            ctx.log(f"effect stage replayed from run {row.get('source_run_id') or row.get('run_id')}: not run again")
            return True
    if policy.withholds:
        ctx.effects.withhold(name, "stage", None)
    return False


def _made(view: Any, ctx: Any, started: int) -> None:
    """Record the effect a stage just made: the fields it read (their values as they were committed before it
    ran: what a replay compares) and what it wrote."""
    rec = recorder_of(view)
    roots = sorted({read[2] for read in rec.reads})
    values = {root: _jsonable(rec.state.data[root]) for root in roots}
    shape = {"reads": roots, "writes": [[path, verb, value] for _, _, path, verb, value in rec.writes]}
    making = Making("stage", ctx.stage, effect_hash("stage", ctx.stage, values), f"{ctx.run_id}:{ctx.step}:{ctx.stage}")
    ctx.effects.record(making, "live", shape, None, started)


def effect_stage(fn: Callable[..., Any], takes_ctx: bool, is_async: bool) -> Callable[..., Any]:
    """The stage function that makes `fn`'s effects once (see the module doc); its `effect_of` is `fn`, whose
    code the flow's hash fingerprints."""
    call = fn if takes_ctx else (lambda scope, ctx: fn(scope))

    if is_async:
        async def run_async(scope: Any, ctx: Any) -> None:
            if not _replayed(scope, ctx):
                started = time.time_ns()
                await call(scope, ctx)
                _made(scope, ctx, started)
        wrapper: Callable[..., Any] = run_async
    else:
        def run(scope: Any, ctx: Any) -> None:
            if not _replayed(scope, ctx):
                started = time.time_ns()
                call(scope, ctx)
                _made(scope, ctx, started)
        wrapper = run
    wrapper.__name__ = wrapper.__qualname__ = getattr(fn, "__name__", "effect")
    wrapper.effect_of = fn  # type: ignore[attr-defined]
    return wrapper
