"""The optional second parameter of a stage: run facts, untracked dependencies, loop control."""
from __future__ import annotations

import copy
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

if TYPE_CHECKING:
    from .run import Run
    from .scope import StageScope


class StageContext:
    """What a stage may know besides the scope.

    `args` is the run input (read-only); `env` holds untracked dependencies such as
    model clients (`flow.run(..., env={...})`), never recorded; `store` is the Store
    the run records into (or None); `subject` is whose run this is (memory scoping).
    """

    __slots__ = ("run_id", "step", "stage", "name", "iteration", "args", "env", "subject", "store", "run",
                 "_rec", "_break", "_logs")

    def __init__(self, run: "Run", rec: "StageScope", name: str, iteration: int, args: Mapping[str, Any],
                 env: Mapping[str, Any], store: Any) -> None:
        self.run_id = run.run_id
        self.run = run
        self.step = rec.step
        self.stage = rec.stage
        self.name = name
        self.iteration = iteration
        self.args = args
        self.env = env
        self.subject = run.subject
        self.store = store
        self._rec = rec
        self._break: Optional[str] = None
        self._logs: list[str] = []

    def break_loop(self, reason: str = "") -> None:
        """Leave the innermost loop after this stage (recorded as a 'break' decision)."""
        self._break = reason or "break_loop() called"

    def log(self, message: str) -> None:
        """A line kept with this step (`steps.logs`)."""
        self._logs.append(str(message))

    def span(self, name: str, *, kind: str = "internal", attributes: Optional[dict[str, Any]] = None,
             start_ns: Optional[int] = None, end_ns: Optional[int] = None) -> None:
        """Telemetry for OpenTelemetry export only (never stored): e.g. `search_memory`."""
        self._rec.rows.append(("_span", {"name": name, "kind": kind, "attributes": dict(attributes or {}),
                                         "start_ns": start_ns, "end_ns": end_ns}))

    def emit(self, table: str, **row: Any) -> dict[str, Any]:
        """Record an extra row (e.g. `model_calls`, `prompt_sections`) tied to this step."""
        row = {"run_id": self.run_id, "step": self.step, **row}
        self._rec.rows.append((table, row))
        return row


EMPTY: Mapping[str, Any] = MappingProxyType({})

_PLAIN = (int, str, float, bool, type(None), bytes)


class ReadOnlyArgs(Mapping[str, Any]):
    """`ctx.args`: the run input. Each access to a container hands out a fresh copy, so
    mutating it can never reach the scope (or a later stage's args) unrecorded."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        if isinstance(value, _PLAIN):
            return value
        try:
            return copy.deepcopy(value)
        except Exception:  # an uncopyable value (a lock, a client) is shared, as env is
            return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ReadOnlyArgs({dict(self._data)!r})"
