"""A step's side effects (`ctx.effect`, tool calls, effect stages): made live once, or replayed from the record.

Each effect becomes an `effects` row of the step; which effects a run replays instead of
making is its `EffectPolicy`'s to say (flow/effects.py has the whole table). The
idempotency key is `run id:step:name#n` (the n-th effect of that name in the step) or
`run id:step:key` when the caller names one.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, Mapping, NamedTuple, Optional

from ..scope.recorder import StepRecorder
from .effects import EffectPolicy, effect_hash, replayed_result
from .interrupt import Pause, PauseSignal

__all__ = ["StepEffects", "Making", "Replayed", "WITHHELD"]

WITHHELD = "this run replays a record that does not hold this effect; it is not made again unless asked"


class Replayed(NamedTuple):
    """An effect answered from the record (what `StepEffects.begin` gives instead of what making it needs)."""

    result: Any


class Making(NamedTuple):
    """What making an effect needs, and what its row records: its kind, name, input hash and idempotency key."""

    kind: str
    name: str
    input_hash: str
    key: str


class StepEffects:
    """The effects of one step, under the run's policy (live, or replayed from a record)."""

    def __init__(self, rec: StepRecorder, run_id: str, policy: EffectPolicy) -> None:
        self.rec, self.run_id, self.policy = rec, run_id, policy
        self._made: dict[str, int] = {}  # effects begun so far in this step, by name (their keys count them)

    def make(self, name: str, fn: Callable[[str], Any], input: Any, kind: str, key: Optional[str]) -> Any:
        """`ctx.effect`: run `fn(idempotency key)` once and record it, or return the recorded result."""
        ready = self.begin(kind, name, input, key)
        if isinstance(ready, Replayed):
            return ready.result
        started = time.time_ns()
        with self._failure_recorded(ready, started):
            result = fn(ready.key)
        self.record(ready, "live", result, None, started)
        return result

    async def amake(self, name: str, fn: Callable[[str], Awaitable[Any]], input: Any, kind: str,
                    key: Optional[str]) -> Any:
        """`make` for an async `fn`."""
        ready = self.begin(kind, name, input, key)
        if isinstance(ready, Replayed):
            return ready.result
        started = time.time_ns()
        with self._failure_recorded(ready, started):
            result = await fn(ready.key)
        self.record(ready, "live", result, None, started)
        return result

    @contextmanager
    def _failure_recorded(self, making: Making, started: int) -> Iterator[None]:
        """Around making an effect live: an error it raises is recorded as its row (one that asked a person
        first made nothing, so it has none)."""
        try:
            yield
        except PauseSignal:
            raise
        except Exception as err:
            self.record(making, "live", None, f"{type(err).__name__}: {err}", started)
            raise

    def begin(self, kind: str, name: str, input: Any, key: Optional[str]) -> Replayed | Making:
        """A replayed effect, or what making it needs; pauses the run instead when it replays a record that
        does not hold this effect."""
        n = self._made[name] = self._made.get(name, 0) + 1
        h = effect_hash(kind, name, input)
        making = Making(kind, name, h, f"{self.run_id}:{self.rec.step}:{key if key is not None else f'{name}#{n}'}")
        row = self.policy.recorded(kind, name, h)
        if row is not None:
            self.record(making, "replayed", replayed_result(row), None, time.time_ns(), source=row)
            return Replayed(replayed_result(row))
        if self.policy.withholds:
            self.withhold(name, kind, input)
        return making

    def withhold(self, name: str, kind: str, input: Any) -> None:
        """Pause the run before an effect its replayed record does not hold (it is not made)."""
        stage = self.rec.stage
        self.rec.pause = Pause({"effect": name, "kind": kind, "input": input, "why": WITHHELD}, stage, "effect",
                               self.rec.step)
        raise PauseSignal(f"stage '{stage}' would make the effect {name!r}, which the record this run replays "
                          f"does not hold: paused instead (resume with live_effects=True to make it)")

    def record(self, making: Making, mode: str, result: Any, error: Optional[str], started: int,
               source: Optional[Mapping[str, Any]] = None) -> None:
        """An `effects` row of this step: made live (`source` None) or replayed from the recorded `source`."""
        rec = self.rec
        origin = (self.run_id, rec.step) if source is None else (
            source.get("source_run_id") or source.get("run_id"), source.get("source_step") or source.get("step"))
        rec.add_row("effects", {
            "run_id": self.run_id, "step": rec.step, "idx": sum(1 for table, _ in rec.rows if table == "effects"),
            "kind": making.kind, "name": making.name, "input_hash": making.input_hash,
            "idempotency_key": making.key if source is None else source.get("idempotency_key"), "mode": mode,
            "source_run_id": origin[0], "source_step": origin[1], "result": json.dumps(result, default=str),
            "error": error, "started_at": started, "duration_ms": (time.time_ns() - started) / 1e6})
