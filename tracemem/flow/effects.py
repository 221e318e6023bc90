"""Side effects happen once: tool calls, effect stages and `ctx.effect` calls, recorded and replayed.

A model call can be replayed from the record; a refund cannot be un-sent. So every
effect a step makes is recorded as an `effects` row (what ran, with what input, its
result, its idempotency key) and a run that re-executes recorded work replays it
instead of repeating it:

| the run                            | a recorded effect                     | an effect the record does not hold |
|------------------------------------|---------------------------------------|------------------------------------|
| a run, a plain fork                | (none recorded)                       | runs live                          |
| a resume (the stage re-entered)    | replayed: what it returned before     | runs live (e.g. the approved call) |
| a `replay=True` fork, a counterfactual | replayed                          | not run: the run pauses there      |
| any of them with `live_effects=True` | runs live again                     | runs live                          |

An effect matches a recorded one by kind, name and a hash of its input (a tool call's
validated arguments; for an effect stage, the values of the fields it read), each
recorded effect replayed at most once, in recorded order. The idempotency key,
`run id:step:call` (a tool call's id, an effect stage's id, or `name#n` for the n-th
`ctx.effect` of that name in the step), is the same when a crashed run is resumed and
the step runs again, so an API that takes one (payments do) can refuse the repeat: across
a crash between an effect and its record, effects are at-least-once; otherwise exactly once.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["EffectBook", "EffectPolicy", "effect_hash", "LIVE"]


def effect_hash(kind: str, name: str, value: Any) -> str:
    """The hash an effect is matched by: its kind, name and input as canonical JSON."""
    text = json.dumps({"kind": kind, "name": name, "input": value}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class EffectBook:
    """Recorded effects (`effects` rows) by kind, name and input hash, each handed out once, in recorded
    order (thread-safe: a map's steps take from one book at once)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self._rows: dict[tuple[str, str, str], deque[Mapping[str, Any]]] = {}
        self._lock = threading.Lock()
        for row in rows:
            if row.get("error") is None:  # an effect that failed is not an answer to replay
                self._rows.setdefault((row["kind"], row["name"], row["input_hash"]), deque()).append(row)

    def __len__(self) -> int:
        return sum(map(len, self._rows.values()))

    def __repr__(self) -> str:
        return f"<EffectBook {len(self)} effects>"

    def take(self, kind: str, name: str, h: str) -> Optional[Mapping[str, Any]]:
        """The next recorded effect of this kind, name and input (None: not recorded, or all handed out)."""
        with self._lock:
            queue = self._rows.get((kind, name, h))
            return queue.popleft() if queue else None

    def next_of(self, kind: str, name: str) -> Optional[Mapping[str, Any]]:
        """The next recorded effect of this kind and name whatever its input (not handed out): what an effect
        stage read when it ran, to compare with what it would read now."""
        with self._lock:
            for (k, n, _), queue in self._rows.items():
                if k == kind and n == name and queue:
                    return queue[0]
        return None

    @classmethod
    def of_run(cls, run: "Run", after_step: int = 0, consumed: Iterable[Mapping[str, Any]] = ()) -> "EffectBook":
        """The effects `run` (and its subflows) recorded in steps after `after_step`, less the `consumed` rows
        (effects a run replaying this one replayed already)."""
        rows = [r for r in run.rows.get("effects", ()) if (r.get("step") or 0) > after_step]
        for child in run.children:
            if (child.parent_step or 0) > after_step:
                rows.extend(child.rows.get("effects", ()))
        book = cls(sorted(rows, key=lambda r: (r.get("step") or 0, r.get("idx") or 0)))
        for row in consumed:
            if row.get("mode") == "replayed":
                book.take(row["kind"], row["name"], row["input_hash"])
        return book


@dataclass(frozen=True)
class EffectPolicy:
    """How a run treats its effects: `books` hold the recorded ones it replays (the first that holds an effect
    answers it); `strict` withholds (pauses at) an effect no book holds instead of making it; `live` makes
    every effect again."""

    books: tuple[EffectBook, ...] = ()
    strict: bool = False
    live: bool = False

    def recorded(self, kind: str, name: str, h: str) -> Optional[Mapping[str, Any]]:
        """The recorded effect to replay for this one (None: make it, or withhold it when `withholds`)."""
        if self.live:
            return None
        return next((row for book in self.books if (row := book.take(kind, name, h)) is not None), None)

    def peek(self, kind: str, name: str) -> Optional[Mapping[str, Any]]:
        """The next recorded effect of this kind and name, whatever its input (None: none, or `live`)."""
        if self.live:
            return None
        return next((row for book in self.books if (row := book.next_of(kind, name)) is not None), None)

    def also(self, book: Optional[EffectBook]) -> "EffectPolicy":
        """This policy with `book` tried first (a re-entered stage's own effects before the pause)."""
        return self if book is None else replace(self, books=(book,) + self.books)

    @property
    def withholds(self) -> bool:
        """Whether an effect the record does not hold is withheld (the run pauses) instead of made."""
        return self.strict and not self.live


LIVE = EffectPolicy()
"""A run's effects run live (a new run, a plain fork)."""


def replayed_result(row: Mapping[str, Any]) -> Any:
    """What a recorded effect returned, as recorded (JSON data)."""
    result = row.get("result")
    return json.loads(result) if isinstance(result, str) else result
