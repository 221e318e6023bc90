"""Reading back the exact request of recorded model calls: the messages each call sent, whole and in order.

A call names chains of content-addressed messages (tracemem/exchange.py says why). Reading one
walks each chain from its last link to its first. The links a thread's runs recorded are fetched
in one query (most of a call's chain was recorded by earlier turns of its own thread), then the
links recorded elsewhere (a prefix another thread recorded first) a round of lookups at a time,
and the messages and tool sets they name in one query each. Content that is not in the store (a
run lost before it was written) is named in `missing`, never silently dropped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

__all__ = ["Request", "requests_of"]


@dataclass(frozen=True)
class Request:
    """What one model call sent and got back: `system` (its leading system messages), `messages` (the rest),
    `tools` (OpenAI tool entries), `options` (the other options), `output` (the reply message), all in the
    OpenAI wire shape, secrets masked as recorded; `missing` names content ids the store does not hold."""

    call_id: str
    system: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: Optional[list[Any]] = None
    options: Optional[dict[str, Any]] = None
    output: Optional[dict[str, Any]] = None
    missing: tuple[str, ...] = ()

    @property
    def recorded(self) -> bool:
        """Whether the call's request was recorded (calls recorded before exact requests were have none)."""
        return bool(self.system or self.messages or self.missing)


def _in(column: str, ids: list[str]) -> tuple[str, list[Any]]:
    return f"{column} IN (SELECT unnest(?::VARCHAR[]))", [ids]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _links(con: Any, heads: set[str], runs: list[str]) -> dict[str, tuple[Optional[str], str]]:
    """chain id -> (parent id, message id) for every link on the chains ending at `heads`."""
    links: dict[str, tuple[Optional[str], str]] = {}
    if runs:
        where, params = _in("run_id", runs)
        for chain, parent, message in con.execute(
                f"SELECT chain_id, parent_id, message_id FROM message_chains WHERE {where}", params).fetchall():
            links[chain] = (parent, message)
    wanted = set(heads)
    while True:
        todo, seen = [], set()
        for head in wanted:
            at: Optional[str] = head
            while at is not None and at in links and at not in seen:
                seen.add(at)
                at = links[at][0]
            if at is not None and at not in links:
                todo.append(at)
        if not todo:
            return links
        where, params = _in("chain_id", sorted(set(todo)))
        found = con.execute(f"SELECT chain_id, parent_id, message_id FROM message_chains WHERE {where}",
                            params).fetchall()
        if not found:
            return links
        for chain, parent, message in found:
            links[chain] = (parent, message)


def _walk(head: Optional[str], links: dict[str, tuple[Optional[str], str]], missing: list[str]) -> list[str]:
    """The message ids of the chain ending at `head`, first to last."""
    ids: list[str] = []
    at = head
    while at is not None:
        link = links.get(at)
        if link is None:
            missing.append(at)
            break
        ids.append(link[1])
        at = link[0]
        if len(ids) > len(links):  # a cycle cannot be recorded; a damaged store is said to be one
            missing.append(at or "")
            break
    ids.reverse()
    return ids


def requests_of(con: Any, calls: Iterable[dict[str, Any]], runs: Iterable[str] = ()) -> dict[str, Request]:
    """The exact request of each `model_calls` row (by call id). `runs`: the runs whose links to fetch at once
    (the calls' thread); links recorded elsewhere are looked up after."""
    calls = list(calls)
    heads = {c[k] for c in calls for k in ("system_id", "input_id") if c.get(k)}
    links = _links(con, heads, list(runs)) if heads else {}
    chains: dict[str, tuple[list[str], list[str], list[str]]] = {}  # call id -> system, input, missing ids
    for call in calls:
        missing: list[str] = []
        chains[call["call_id"]] = (_walk(call.get("system_id"), links, missing),
                                   _walk(call.get("input_id"), links, missing), missing)
    wanted = sorted({m for system, rest, _ in chains.values() for m in system + rest}
                    | {c["output_id"] for c in calls if c.get("output_id")})
    messages: dict[str, Any] = {}
    if wanted:
        where, params = _in("message_id", wanted)
        messages = {m: _json(body) for m, body in con.execute(
            f"SELECT message_id, message FROM messages WHERE {where}", params).fetchall()}
    tool_ids = sorted({c["tools_id"] for c in calls if c.get("tools_id")})
    tool_sets: dict[str, Any] = {}
    if tool_ids:
        where, params = _in("tools_id", tool_ids)
        tool_sets = {t: _json(body) for t, body in con.execute(
            f"SELECT tools_id, tools FROM tool_sets WHERE {where}", params).fetchall()}
    out: dict[str, Request] = {}
    for call in calls:
        system, rest, missing = chains[call["call_id"]]
        missing += [m for m in system + rest if m not in messages]
        tools_id, output_id = call.get("tools_id"), call.get("output_id")
        if tools_id and tools_id not in tool_sets:
            missing.append(tools_id)
        if output_id and output_id not in messages:
            missing.append(output_id)
        out[call["call_id"]] = Request(
            call["call_id"], [messages[m] for m in system if m in messages], [messages[m] for m in rest if m in messages],
            tool_sets.get(tools_id) if tools_id else None, _json(call.get("options")),
            messages.get(output_id) if output_id else None, tuple(missing))
    return out
