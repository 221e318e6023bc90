"""Backtracking beyond the scope: model calls, tool calls, prompt sections, memories, past runs.

For any step on a trace, the rows that step emitted (`model_calls`, `tool_calls`,
`human_inputs`, `memory_uses`, `snapshot_uses`) become nodes. A model call leads to
its prompt sections and to what its step read (the conversation it was sent: a tool
result there leads on to the tool step, and through it to the model call that asked
for the tool). From a memory the walk continues, through its provenance, into the
run and step that extracted it — following there only what explains the memory: the
extraction's model call and the reads that carried the user's turn (the question,
the turn id), not the values a model wrote (the assistant's reply), which the
extraction also read. The walker calls `step_sources` for every write and step it
expands.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Optional, Protocol

import networkx as nx

from ..memory.errors import MemoryNotFoundError
from ..record import Read
from .index import RunIndex
from .walked_runs import WalkedRuns


class Walker(Protocol):
    """What these expansions ask of the walk (`walk.Walker`, which calls them: so they name it this way,
    without importing it back)."""

    g: nx.DiGraph
    runs: WalkedRuns  # the runs the walk enters, and the store it reads the others from
    provenance: str  # under a memory: "turn" (the user's words and the extractor's reply) or "step" (all it read)

    def add(self, node: str, depth: int, idx: Optional[RunIndex], item: Any, **attrs: Any) -> bool: ...

    def link(self, parent: str, child: str, kind: str) -> None: ...

    def pruned_run(self, run_id: str, depth: int, via: str) -> str: ...

    def step_node(self, idx: RunIndex, step: int, depth: int, turn_only: bool = False) -> str: ...

    def read_sources(self, node: str, idx: RunIndex, reads: Iterable[Read], depth: int) -> None: ...


def _json(value: Any) -> Any:
    """A JSON column as Python: live rows hold the object, rows loaded back hold its text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def step_sources(w: "Walker", idx: RunIndex, step: int, node: str, depth: int, turn_only: bool = False) -> None:
    """The nodes beyond the scope of one step (`turn_only`: the step that extracted a memory, see above)."""
    run_id = idx.run.run_id
    for call in idx.rows("model_calls", step):
        child = f"mc:{run_id}:{call['call_id']}"
        if w.add(child, depth + 1, idx, (_expand_call, call, turn_only), kind="model_call", run_id=run_id, step=step,
                 model=call["model"], prompt_id=call["prompt_id"], response=call["response"],
                 error=call.get("error"), input_tokens=call.get("input_tokens"),
                 output_tokens=call.get("output_tokens"), tool_calls=_json(call.get("tool_calls"))):
            w.link(node, child, "source")
    for tool in idx.rows("tool_calls", step):
        child = f"tc:{run_id}:{step}:{tool['call_id']}"
        if w.add(child, depth + 1, None, None, kind="tool_call", run_id=run_id, step=step, call_id=tool["call_id"],
                 name=tool["name"], arguments=_json(tool.get("arguments")), arguments_text=tool.get("arguments_text"),
                 result=tool.get("result"), error=tool.get("error"), error_kind=tool.get("error_kind"),
                 truncated=tool.get("truncated"), duration_ms=tool.get("duration_ms")):
            w.link(node, child, "source")
    for answer in idx.rows("human_inputs", step):
        child = f"hi:{run_id}:{answer['input_id']}"
        if w.add(child, depth + 1, idx, None, kind="human_input", run_id=run_id, step=step,
                 input_id=answer["input_id"], by=answer.get("answered_by"), answer=_json(answer.get("answer")),
                 asked=_json(answer.get("payload")), asked_step=answer.get("asked_step"),
                 answered_at=answer.get("answered_at")):
            w.link(node, child, "source")
    for use in idx.rows("memory_uses", step):
        if use["outcome"] == "injected":
            memory_node(w, node, use["memory_id"], depth, "source")
    uses = idx.rows("snapshot_uses", step)
    suspect = w.runs.store.suspect([u["source_run_id"] for u in uses]) if uses and w.runs.store is not None else {}
    for use in uses:
        child = f"run:{use['source_run_id']}"
        if w.add(child, depth + 1, idx, (_expand_past_run, use["source_run_id"]), kind="run",
                 run_id=use["source_run_id"], score=use["score"], projection=use["projection"],
                 query=use.get("query"), via="load_snapshot", suspect=suspect.get(use["source_run_id"])):
            w.link(node, child, "source")


def _expand_call(w: "Walker", node: str, depth: int, idx: RunIndex, call: dict[str, Any],
                 turn_only: bool = False) -> None:
    if call.get("prompt_id"):
        _prompt_sections(w, node, depth, idx, call["prompt_id"])
    reads = idx.reads.get(call["step"], ())  # what the call was sent was read by its step
    w.read_sources(node, idx, [r for r in reads if not idx.model_output(r)] if turn_only else reads, depth)


def _prompt_sections(w: "Walker", node: str, depth: int, idx: RunIndex, prompt_id: str) -> None:
    counters: dict[str, int] = {}
    for s in idx.sections(prompt_id):
        counters[s["kind"]] = counters.get(s["kind"], 0) + 1
        child = f"ps:{s['prompt_id']}:{s['idx']}"
        if w.add(child, depth + 1, idx, (_expand_section, s), kind="prompt_section", run_id=idx.run.run_id,
                 prompt_id=s["prompt_id"], position=s["idx"], section=s["kind"], line=counters[s["kind"]],
                 text=s["text"], source_kind=s["source_kind"], source_id=s["source_id"],
                 start_char=s["start_char"], end_char=s["end_char"]):
            w.link(node, child, "source")


def _expand_section(w: "Walker", node: str, depth: int, idx: RunIndex, section: dict[str, Any]) -> None:
    if section["source_kind"] == "memory" and section["source_id"]:
        memory_node(w, node, section["source_id"], depth, "source")


def memory_node(w: "Walker", parent: str, memory_id: str, depth: int, kind: str) -> None:
    child = f"m:{memory_id}"
    attrs: dict[str, Any] = {"kind": "memory", "memory_id": memory_id}
    record = None
    if w.runs.store is not None:
        try:
            record = w.runs.store.memory.get(memory_id)
        except MemoryNotFoundError:
            record = None
    if record is not None:
        attrs.update(text=record.text, confidence=record.confidence, review_state=record.review_state,
                     source_run_id=record.source_run_id, source_step=record.source_step,
                     source_ref=record.source_ref, subject=record.subject, superseded_by=record.superseded_by,
                     forgotten=record.deleted_at is not None)
    else:
        attrs.update(missing="not in the store (purged, or no store at hand)")
    if w.add(child, depth + 1, None, (_expand_memory, record) if record is not None else None, **attrs):
        w.link(parent, child, kind)


def _expand_memory(w: "Walker", node: str, depth: int, idx: Optional[RunIndex], record: Any) -> None:
    if not record.source_run_id:
        return
    origin = w.runs.index(record.source_run_id)
    if origin is None and not w.runs.cross_runs:
        return  # backtrack(..., cross_runs=False): the memory's source_run_id says where, the walk stops here
    if origin is None:
        w.link(node, w.pruned_run(record.source_run_id, depth + 1, "provenance"), "provenance")
        return
    if record.source_step is None:
        return
    child = w.step_node(origin, record.source_step, depth + 1, turn_only=w.provenance == "turn")
    w.g.nodes[child]["source_ref"] = record.source_ref
    w.g.nodes[child]["extracted"] = record.memory_id
    w.link(node, child, "provenance")


def _expand_past_run(w: "Walker", node: str, depth: int, idx: RunIndex, run_id: str) -> None:
    past = w.runs.index(run_id)
    if past is None and not w.runs.cross_runs:
        return
    if past is None:
        w.g.nodes[node]["missing"] = w.runs.gone(run_id)
        return
    for d in past.run.decisions:
        child = f"d:{run_id}:{d.step}"
        stage = past.steps[d.step].stage if d.step in past.steps else "?"
        if w.add(child, depth + 1, past, ("decision", d.step), kind="decision", run_id=run_id, step=d.step,
                 stage=stage, chosen=d.chosen, evidence=d.evidence):
            w.link(node, child, "source")
