"""Replaying recorded model replies: the exact-request hash, a book of recorded replies, `ReplayModel`.

Every call `ctx.complete` makes is recorded with `request_hash`: a SHA-256 of the
canonical JSON of the model's name, the messages and every option it was given
(tools, schema, temperature, ...; a pydantic schema by its JSON schema, a function by
its qualified name; `on_token`, which only watches the reply stream, is left out).
So any recorded run can later be replayed: a `ReplayBook` holds a run's recorded
replies by hash, and a call whose exact request was recorded gets the recorded
reply instead of reaching the model — which makes forks and re-runs cheap and
deterministic. Identical requests recorded several times are answered in recorded
order, one each. A request never recorded goes to the live model, or fails with
`ReplayMissError` when there is none. Calls are recorded `replayed` true or false.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from pydantic import BaseModel

from ..errors import TracememError
from ..models import Message, Reply, ToolCall, Usage

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["ReplayBook", "ReplayMissError", "ReplayModel", "ReplayedReply", "request_hash"]

UNHASHED_OPTIONS = frozenset({"on_token"})
"""Options that do not change what is asked (a streaming callback), left out of the hash."""


class ReplayMissError(TracememError):
    """A replayed call asked something the record never asked, and no live model was given."""


@dataclasses.dataclass(frozen=True)
class ReplayedReply(Reply):
    """A reply taken from the record instead of the model (`replayed` is what tells them apart)."""

    replayed: bool = True
    request_hash: Optional[str] = None


def _canonical(value: Any) -> Any:
    """A JSON-able form of an option that is stable across processes."""
    if isinstance(value, type) and issubclass(value, BaseModel):
        return {"$schema": value.model_json_schema()}
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if callable(value):
        return {"$callable": f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}"}
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


def request_hash(model: Optional[str], messages: Any, options: Mapping[str, Any]) -> str:
    """The hash of one exact request: model name, messages and every option (canonical JSON)."""
    if isinstance(messages, list):  # each Message dumped here: what `_canonical` gives it, without json's detour
        messages = [m.wire() if isinstance(m, Message) else m.model_dump(mode="json") if isinstance(m, BaseModel)
                    else m for m in messages]
    body = {"model": model, "messages": messages,
            "options": {k: v for k, v in options.items() if k not in UNHASHED_OPTIONS}}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_canonical)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _reply(row: Mapping[str, Any]) -> ReplayedReply:
    """A recorded `model_calls` row as the reply it was."""
    calls = row.get("tool_calls") or []  # [{"id", "name", "arguments": the raw text}] (JSON text when loaded)
    calls = json.loads(calls) if isinstance(calls, str) else calls
    return ReplayedReply(text=row.get("response") or "", model=row.get("model") or "",
                         usage=Usage(row.get("input_tokens") or 0, row.get("output_tokens") or 0),
                         tool_calls=tuple(ToolCall(id=c.get("id") or "", name=c["name"],
                                                   arguments_text=c.get("arguments") or "") for c in calls),
                         finish_reason="tool_calls" if calls else None, request_hash=row.get("request_hash"))


class ReplayBook:
    """Recorded replies by request hash, each handed out once, in recorded order (thread-safe)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self._replies: dict[str, deque[Mapping[str, Any]]] = {}
        self._lock = threading.Lock()
        self.models: list[str] = []
        for row in rows:
            self.add(row)

    def __len__(self) -> int:
        return sum(len(q) for q in self._replies.values())

    def __repr__(self) -> str:
        return f"<ReplayBook {len(self)} replies>"

    def add(self, row: Mapping[str, Any]) -> None:
        """One recorded call (a `model_calls` row); calls that failed or predate request hashes are skipped."""
        h = row.get("request_hash")
        if not h or row.get("error") or row.get("response") is None:
            return
        self._replies.setdefault(h, deque()).append(row)
        if row.get("model") and row["model"] not in self.models:
            self.models.append(row["model"])

    def take(self, h: str) -> Optional[ReplayedReply]:
        """The next recorded reply to request `h` (None: not recorded, or every one handed out)."""
        with self._lock:
            queue = self._replies.get(h)
            if not queue:
                return None
            return _reply(queue.popleft())

    @classmethod
    def of_run(cls, run: "Run", after_step: int = 0, consumed: Iterable[Mapping[str, Any]] = ()) -> "ReplayBook":
        """The calls `run` made (its subflows' too) in steps after `after_step`, in the order they were made, less
        the `consumed` ones (`model_calls` rows a run replaying this one answered from it already)."""
        rows = [r for r in run.rows.get("model_calls", ()) if (r.get("step") or 0) > after_step]
        for child in run.children:
            if (child.parent_step or 0) > after_step:
                rows.extend(child_row for child_row in cls.rows_of(child))
        rows.sort(key=lambda r: _started(r.get("started_at")))
        book = cls(rows)
        for row in consumed:
            if row.get("replayed") and row.get("request_hash"):
                book.take(row["request_hash"])
        return book

    @staticmethod
    def rows_of(run: "Run") -> list[Mapping[str, Any]]:
        """Every `model_calls` row of a run and its subflows."""
        rows = list(run.rows.get("model_calls", ()))
        for child in run.children:
            rows.extend(ReplayBook.rows_of(child))
        return rows


def _started(at: Any) -> float:
    if isinstance(at, (int, float)):
        return float(at)
    return at.timestamp() * 1e9 if hasattr(at, "timestamp") else 0.0


class ReplayModel:
    """A chat model that answers from a recorded run: a call whose exact request was recorded gets the
    recorded reply; any other goes to `live` (or fails with `ReplayMissError` when `live` is None).

        model = ReplayModel(store.run(run_id), live=real_model)
        flow.run(inputs, env={"model": model}, store=store)

    `ctx.complete` records each call with `replayed` true or false. `name` is the recorded model's name
    (the request hash includes it): by default `live`'s, else the one the record holds."""

    def __init__(self, source: Any, live: Any = None, *, name: Optional[str] = None) -> None:
        self.book = source if isinstance(source, ReplayBook) else ReplayBook.of_run(source)
        self.live = live
        self.name = name or getattr(live, "name", None) or (self.book.models[0] if self.book.models else "replay")
        self.provider = getattr(live, "provider", None) or "replay"
        self.replayed = 0
        self.live_calls = 0

    def __repr__(self) -> str:
        return f"ReplayModel({self.book!r}, live={self.live!r})"

    def answer(self, h: str, messages: Any, options: Mapping[str, Any]) -> Reply:
        """The recorded reply to request `h`, else the live model's."""
        reply = self.book.take(h)
        if reply is not None:
            self.replayed += 1
            return reply
        if self.live is None:
            raise ReplayMissError(
                f"model '{self.name}' was asked something the record never asked (request {h}) and no live model "
                f"was given; pass live=<model> to ReplayModel (or replay=True with the model in env) to call it")
        self.live_calls += 1
        return self.live.complete(messages, **options)

    def complete(self, messages: Any, **options: Any) -> Reply:
        """One chat completion, from the record when this exact request was recorded."""
        return self.answer(request_hash(self.name, messages, options), messages, options)

    async def acomplete(self, messages: Any, **options: Any) -> Reply:
        """Async variant (a recorded reply is instant; a live call uses the live model's `acomplete`)."""
        h = request_hash(self.name, messages, options)
        reply = self.book.take(h)
        if reply is not None:
            self.replayed += 1
            return reply
        if self.live is None:
            return self.answer(h, messages, options)  # raises ReplayMissError
        self.live_calls += 1
        return await self.live.acomplete(messages, **options)
