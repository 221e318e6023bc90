"""The exact request of a model call, recorded content-addressed: each message stored once, a call names them.

A model call sends system instructions, the conversation so far (tool calls and their results
included), tool definitions and options, and gets a reply. Stored whole with every call, a thread
of n turns would hold its history n times over: storage growing with the square of the turns.
Here each message is stored once under the hash of its wire form (`messages`); a sequence of
messages is a chain of links, each naming the sequence before it and one message
(`message_chains`, as a git commit names its parent); and a call names two chains -- its leading
system messages (`model_calls.system_id`) and everything after them (`input_id`) -- its tool
definitions (`tool_sets`, `tools_id`), its other options (`options`) and the message it got back
(`output_id`, which the next turn's history then names again). Turn n+1 of a thread extends
turn n's chain by the reply and the new question: two links and two messages, however long the
thread. The system instructions have a chain of their own because assembled prompts change
every turn; at the head of the conversation chain they would make every turn a new chain.

A call emits rows only for content its store does not have yet: `KnownContent` remembers what
each store was handed (bounded; a forgotten id costs one duplicate row, which the store drops when
it inserts). Masking of a run's secrets is applied before anything is hashed, so an id never
encodes a secret; the reader side (`Request`, `requests_of`) lives in store/read/requests.py.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import orjson

__all__ = ["KnownContent", "Exchange", "exchange_of", "output_row", "message_row", "content_id", "link_id",
           "canonical_json", "SYSTEM_ROLES"]

SYSTEM_ROLES = frozenset({"system", "developer"})
"""Roles whose leading messages are a call's system instructions (`gen_ai.system_instructions`)."""


def _plain(value: Any) -> Any:
    """A JSON-able form of what json cannot dump (a pydantic model, a dataclass, a class, a function)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    schema = getattr(value, "model_json_schema", None)
    if isinstance(value, type) and callable(schema):
        return {"$schema": schema()}
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        import dataclasses

        return dataclasses.asdict(value)
    if callable(value):
        return {"$callable": f"{getattr(value, '__module__', '')}."
                             f"{getattr(value, '__qualname__', type(value).__name__)}"}
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal content, equal text, in any process (orjson; text it cannot
    encode, such as a lone surrogate, through the standard library the same way)."""
    try:
        return orjson.dumps(value, option=_SORTED, default=_plain).decode()
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)


def content_id(text: str) -> str:
    """The id of a piece of content: the first 128 bits of its SHA-256, as hex."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def link_id(parent: Optional[str], message_id: str) -> str:
    """The id of the sequence `parent` (a chain id, None: empty) followed by one message."""
    return content_id(f"{parent or ''}/{message_id}")


class KnownContent:
    """The content ids a store has been handed already, so that a call emits only what is new.

    Bounded (`limit` ids): past it the older half is forgotten, and content seen again is emitted
    again, which the store drops as a duplicate when it inserts. Thread-safe."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._ids: dict[str, None] = {}
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._ids.update(dict.fromkeys(keys))
            if len(self._ids) > self.limit:
                for key in list(self._ids)[: len(self._ids) // 2]:
                    del self._ids[key]

    def forget(self) -> None:
        """Forget everything (after a prune removed content, it must be written again when used)."""
        with self._lock:
            self._ids.clear()


@dataclass
class Exchange:
    """One call's exact request as content-addressed rows: the `model_calls` columns naming it, the rows
    of content its store does not have yet, and the request itself (wire messages), for telemetry."""

    columns: dict[str, Any]
    rows: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    system: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: Optional[list[Any]] = None
    options: Optional[dict[str, Any]] = None


def _chain(wire: Sequence[dict[str, Any]], run_id: str, known: KnownContent,
           rows: list[tuple[str, dict[str, Any]]], fresh: dict[str, None]) -> Optional[str]:
    """The chain id of `wire` (None when empty), adding the rows of links and messages not yet known."""
    parent: Optional[str] = None
    for depth, message in enumerate(wire, start=1):
        mid = message_row(message, run_id, known, rows, fresh)
        chain = link_id(parent, mid)
        if chain not in known and chain not in fresh:
            rows.append(("message_chains", {"chain_id": chain, "parent_id": parent, "message_id": mid,
                                            "depth": depth, "run_id": run_id}))
            fresh[chain] = None
        parent = chain
    return parent


def message_row(message: dict[str, Any], run_id: str, known: KnownContent,
                rows: list[tuple[str, dict[str, Any]]], fresh: dict[str, None]) -> str:
    """The id of one wire message, adding its `messages` row unless known."""
    text = canonical_json(message)
    mid = content_id(text)
    if mid not in known and mid not in fresh:
        role = message.get("role") if isinstance(message, Mapping) else None
        rows.append(("messages", {"message_id": mid, "role": role if isinstance(role, str) else None,
                                  "message": text, "run_id": run_id}))
        fresh[mid] = None
    return mid


def exchange_of(wire: Sequence[dict[str, Any]], options: Mapping[str, Any], run_id: str,
                known: Optional[KnownContent], mask: Callable[[Any], Any] = lambda v: v,
                hidden: frozenset[str] = frozenset({"on_token"})) -> Exchange:
    """The rows recording one call's request: `wire` (its messages in the wire shape), `options` (tools
    and the rest; `hidden` ones are left out: a streaming callback asks nothing). `mask` masks secrets
    before anything is hashed; `known` (None: nothing known) is told what the rows add."""
    known = known if known is not None else KnownContent()
    wire = [mask(m) for m in wire]
    lead = 0
    while lead < len(wire) and isinstance(wire[lead], Mapping) and wire[lead].get("role") in SYSTEM_ROLES:
        lead += 1
    rows: list[tuple[str, dict[str, Any]]] = []
    fresh: dict[str, None] = {}
    system_id = _chain(wire[:lead], run_id, known, rows, fresh)
    input_id = _chain(wire[lead:], run_id, known, rows, fresh)
    tools = options.get("tools")
    tool_list = [_tool_wire(t) for t in tools] if tools else None
    tools_id = None
    if tool_list:
        text = canonical_json(mask(tool_list))
        tools_id = content_id(text)
        if tools_id not in known:
            rows.append(("tool_sets", {"tools_id": tools_id, "tools": text, "run_id": run_id}))
            fresh[tools_id] = None
    rest = {k: v for k, v in options.items() if k != "tools" and k not in hidden and v is not None}
    rest_json = json.loads(canonical_json(mask(rest))) if rest else None
    known.add(list(fresh))
    return Exchange({"system_id": system_id, "input_id": input_id, "tools_id": tools_id,
                     "options": canonical_json(rest_json) if rest_json else None},
                    rows, wire[:lead], wire[lead:], mask(tool_list) if tool_list else None, rest_json)


def _tool_wire(tool: Any) -> Any:
    """A tool as the OpenAI `tools` entry its adapter sends (a ToolSpec, a Tool, or a dict as given)."""
    to_openai = getattr(tool, "to_openai", None)
    if callable(to_openai):
        return to_openai()
    spec = getattr(tool, "spec", None)
    if spec is not None and callable(getattr(spec, "to_openai", None)):
        return spec.to_openai()
    return tool


def output_row(reply_message: Optional[dict[str, Any]], run_id: str, known: Optional[KnownContent],
               mask: Callable[[Any], Any] = lambda v: v) -> tuple[Optional[str], list[tuple[str, dict[str, Any]]]]:
    """The reply as a `messages` row (its id for `model_calls.output_id`), unless known."""
    if reply_message is None:
        return None, []
    known = known if known is not None else KnownContent()
    rows: list[tuple[str, dict[str, Any]]] = []
    fresh: dict[str, None] = {}
    mid = message_row(mask(reply_message), run_id, known, rows, fresh)
    known.add(list(fresh))
    return mid, rows
