"""`why(run, path)`: the sources a value rests on, ranked, one line each — optionally verified.

A backtrack holds the whole haystack: on a tool agent, message-list appends, pending-call
lists and the loop's deciders outnumber the sources many times over. `why` answers with
the sources only (`causes.find_causes`): memories (with the run and turn they were learned
in and the user's words they came from), tool results, human inputs, run inputs, past runs
loaded as snapshots, prompt sections and earlier turns of the thread, each with its shortest
path to the value, the bookkeeping on it folded (`via`; `run.backtrack(path).explain()` has
the whole graph).

Ranking, without a model, uses what the record shows: whether the source was in the
answering model call's own request or reached it through earlier steps, and how many of
the value's words it shares. It is a lead, not a verdict, and the answer says so. With
`verify=k` and a model, the answering call is re-asked without each of the top k testable
sources (`verify`), and each is marked decisive (the reply changed) or not; decisive
sources come first, the one whose removal changed the answer most at the top.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Union

from ..errors import UsageError
from ..text import clip
from .causes import Cause, find_causes, landmarks
from .trace import Trace
from .verify import choose_model, similarity, verify as verify_causes

__all__ = ["BASIS_RECORD", "BASIS_VERIFIED", "Why", "why"]

BASIS_RECORD = ("ranked by the record (how directly each source reached the answering model call, and the words it "
                "shares with the value), not verified: verify=k re-asks that call without each of k sources")
BASIS_VERIFIED = ("verified: the answering model call re-asked without each of {k} source(s), all else as recorded, "
                  "no tool or side effect run; decisive first")
_KIND_ORDER = {"memory": 0, "tool": 1, "human_input": 2, "snapshot": 3, "input": 4, "turn": 5, "prompt": 6}


@dataclass
class Why:
    """The answer to "why is `path` what it is in run `run_id`": its sources, ranked (see the module doc)."""

    run_id: str
    path: str
    value: Any
    causes: list[Cause]
    basis: str
    trace: Trace = field(repr=False)
    answering: Optional[str] = None  # the answering model call's node on the trace
    calls: int = 0  # model calls verify made
    limit: int = 8  # how many causes str() shows
    hint: str = "why(..., limit=N); the whole graph: run.backtrack(path).explain()"  # what the "more" line says

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self, limit: Optional[int] = None) -> list[str]:
        """The answer as text: a heading, one line per source (at most `limit`), and what was left out."""
        limit = self.limit if limit is None else limit
        head = f"why {self.path} = {clip(_text(self.value), 60)!r} (run {self.run_id[:8]})"
        if self.trace.missing:
            return [f"{head}: never written in this run (its value is the run input or the default)"]
        if not self.causes:
            return [f"{head}: no source on its trace (a value the code set on its own)"]
        out = [f"{head}: {len(self.causes)} source(s)"]
        g = self.trace.graph
        for i, cause in enumerate(self.causes[:limit], start=1):
            out.append(f"{i:>2}. {cause.label}{_learned(cause)} · via {_via(g, cause)}{_verdict(cause)}")
        if len(self.causes) > limit:
            out.append(f"… {len(self.causes) - limit} more: {self.hint}")
        out.append(self.basis)
        return out

    def via(self, cause: Cause) -> str:
        """A cause's path to the value, folded: the model calls, tools and prompt lines on it."""
        return _via(self.trace.graph, cause)

    def to_json(self) -> dict[str, Any]:
        """The answer as a JSON-able dict (each cause with its path as node ids)."""
        return {"run_id": self.run_id, "path": self.path, "value": self.value, "basis": self.basis,
                "answering": self.answering, "calls": self.calls, "missing": self.trace.missing,
                "causes": [{**asdict(c), "rank": i} for i, c in enumerate(self.causes, start=1)]}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _learned(cause: Cause) -> str:
    learned = cause.learned
    if not learned:
        return ""
    turn = f" turn {learned['turn']}" if learned.get("turn") else f" step {learned.get('step')}"
    words = f" from {clip(learned['words'], 48)!r}" if learned.get("words") else ""
    return f" · learned in run {str(learned['run_id'])[:8]}{turn}{words}"


def _via(g: Any, cause: Cause) -> str:
    """The folded path, value side last: the landmarks on it and how many bookkeeping nodes were folded."""
    marks = landmarks(g, cause.via)
    named = []
    for n in reversed(marks):
        d = g.nodes[n]
        kind = d.get("kind")
        if kind == "model_call":
            named.append(f"model call step {d['step']}")
        elif kind == "tool_call":
            named.append(f"tool {d['name']} step {d['step']}")
        elif kind == "prompt_section":
            named.append("[Memory] line " + str(d["line"]) if d["section"] == "memory" else f"[{d['section']}]")
        else:
            named.append(kind.replace("_", " "))
    folded = len(cause.via) - 2 - len(marks)
    return (" → ".join(named) or "directly") + (f" (+{folded} folded)" if folded > 0 else "")


def _verdict(cause: Cause) -> str:
    if cause.decisive is True:
        return f" · DECISIVE: without it {clip(cause.changed_to or '', 50)!r}"
    if cause.decisive is False:
        return " · not decisive (same reply without it)"
    return f" · not verified: {cause.note}" if cause.note else ""


def _rank(causes: list[Cause], value: Any) -> list[Cause]:
    """Order by the record: word overlap with the value, and whether the source was in the answering call's
    own request; ties by kind, then by how near the value it was met."""
    wanted = _text(value)
    for cause in causes:
        cause.lexical = round(similarity(wanted, cause.text), 4) if cause.text.strip() else 0.0
        cause.score = round(0.7 * cause.lexical + (0.3 if cause.direct else 0.1), 4)
    order = {id(c): i for i, c in enumerate(causes)}
    return sorted(causes, key=lambda c: (-c.score, _KIND_ORDER.get(c.kind, 9), order[id(c)]))


def _verified_order(causes: list[Cause]) -> list[Cause]:
    """Decisive first (the biggest change at the top), then the untested, then those shown not decisive."""
    group = {True: 0, None: 1, False: 2}
    return sorted(causes, key=lambda c: (group[c.decisive], -(c.change or 0.0)))  # stable: record order within


def why(target: Union[Trace, Any], path: str = "answer", *, limit: int = 8, verify: int = 0, model: Any = None,
        env: Optional[Mapping[str, Any]] = None, store: Any = None, max_nodes: int = 2000) -> Why:
    """Why `path` of `target` (a Run, or a Trace from `run.backtrack(path)`) is what it is: its sources, ranked.
    `verify=k` re-asks the answering model call without each of the top k testable sources (k model calls,
    each recorded as a `tracemem.why` run in `store`, default the run's own) with `model` (or `env`'s)."""
    if not isinstance(limit, int) or limit < 1:
        raise UsageError(f"why(limit=...) takes a whole number of at least 1, got {limit!r}")
    if not isinstance(verify, int) or verify < 0:
        raise UsageError(f"why(verify=...) takes how many sources to test (0: none), got {verify!r}")
    trace = target if isinstance(target, Trace) else target.backtrack(path, max_nodes=max_nodes)
    found = find_causes(trace)
    root = trace.graph.nodes[trace.root] if trace.root is not None and trace.root in trace.graph else {}
    value = json.loads(root["value"]) if root.get("kind") == "write" and root.get("value") else root.get("value")
    causes = _rank(found.causes, value)
    answer = Why(trace.run_id, trace.path, value, causes, BASIS_RECORD, trace, found.answering, limit=limit)
    if verify and causes:
        chat = choose_model(model, env)
        answer.calls = verify_causes(causes, verify, trace=trace, answering=found.answering, model=chat,
                                     store=store or trace.run.store)
        answer.causes = _verified_order(causes)
        answer.basis = BASIS_VERIFIED.format(k=answer.calls)
    return answer
