"""`extract_memories`: after a successful turn, a small model distills durable facts.

The model sees the latest user/assistant turn (and the subject's related stored
facts, with ids) and answers JSON `{"facts": [{"fact", "score", "tags", "supersedes"}]}`.
Defences, in order: pydantic validation of the reply; the threshold (facts
scored under it are dropped); a content filter, on by default, that rejects facts
reading as instructions to the assistant; exact and near duplicates are not
stored twice. A survivor that updates a stored fact supersedes it (the old one
becomes contradicted and linked, never deleted). Every failure — model error,
bad JSON, schema mismatch, store error — goes to `on_error`, is logged in the
step, marks the run degraded (`ctx.degrade`: `runs.degraded` says the run
succeeded without the memory it should have gained, and `tracemem runs` shows
it) with an OpenTelemetry error span, and the run still succeeds.

The reply schema sent to the model (`EXTRACTION_SCHEMA`) keeps to OpenAI's strict
structured-output subset: every object closes with `additionalProperties: false`
and requires all its properties (the optional one is a union with null), and no
keyword a strict server refuses (defaults, length or range bounds). The bounds
are checked here instead, by pydantic.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from pydantic import BaseModel, Field, ValidationError

from tracemem import StageContext, TracememError
from tracemem.models import ChatModel, Message

from .instruction_filter import INSTRUCTION_PATTERNS, reads_as_instruction

__all__ = ["EXTRACTION_PROMPT", "EXTRACTION_SCHEMA", "INSTRUCTION_PATTERNS", "ExtractedFact",
           "ExtractedFacts", "extract_memories", "install_extraction", "reads_as_instruction"]

EXTRACTION_PROMPT = """You extract durable facts about the user from one conversation turn.
Return JSON: {"facts": [{"fact": "User ...", "score": 0.0-1.0, "tags": ["..."], "supersedes": null}]}.
- Only facts the user states about themselves that will still matter later; third person ("User ...").
- score: how sure you are the fact is true and durable.
- If a fact updates or contradicts one of the known facts below, set "supersedes" to that fact's id.
- No facts: {"facts": []}."""


class ExtractedFact(BaseModel):
    fact: str = Field(min_length=1, max_length=500)
    score: float = Field(ge=0, le=1)
    tags: list[str] = []
    supersedes: Optional[str] = None


class ExtractedFacts(BaseModel):
    facts: list[ExtractedFact]


EXTRACTION_SCHEMA: dict[str, Any] = {
    "title": "extracted_facts",
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "description": "Durable facts about the user from this turn; empty when there are none.",
            "items": {
                "type": "object",
                "properties": {
                    "fact": {"type": "string", "description": "One fact in the third person: 'User ...'."},
                    "score": {"type": "number", "description": "0.0-1.0: how sure the fact is true and durable."},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "supersedes": {"type": ["string", "null"],
                                   "description": "The id of a known fact this one updates, else null."},
                },
                "required": ["fact", "score", "tags", "supersedes"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["facts"],
    "additionalProperties": False,
}
"""`ExtractedFacts` as a JSON schema valid under OpenAI's strict mode (pydantic's own has defaults and bounds)."""

def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))


def extract_memories(model: Union[ChatModel, str] = "extractor", *, threshold: float = 0.7,
                     on_extracted: Optional[Callable[[list[dict[str, Any]]], None]] = None,
                     on_error: Optional[Callable[[BaseException], None]] = None, tags: Sequence[str] = (),
                     content_filter: bool = True, skip_continuations: bool = True, near_duplicate: float = 0.92,
                     question_from: str = "question", answer_from: str = "answer", turn_from: Optional[str] = "turn_id",
                     into: Optional[str] = None, related: int = 5) -> Callable[[Any, StageContext], None]:
    """A stage remembering facts from the latest turn for the run's subject."""
    return MemoryExtractor(model=model, threshold=threshold, on_extracted=on_extracted, on_error=on_error,
                           tags=tuple(tags), content_filter=content_filter, skip_continuations=skip_continuations,
                           near_duplicate=near_duplicate, question_from=question_from, answer_from=answer_from,
                           turn_from=turn_from, into=into, related=related).extract_memories


@dataclass(frozen=True)
class MemoryExtractor:
    """What `extract_memories` was given, and the stage itself as the method of that name (a step is named
    after its function); `extract` does the work, `ask` the model call, `remember` one fact."""

    model: Union[ChatModel, str]
    threshold: float
    on_extracted: Optional[Callable[[list[dict[str, Any]]], None]]
    on_error: Optional[Callable[[BaseException], None]]
    tags: tuple[str, ...]
    content_filter: bool
    skip_continuations: bool
    near_duplicate: float
    question_from: str
    answer_from: str
    turn_from: Optional[str]
    into: Optional[str]
    related: int

    def extract_memories(self, scope: Any, ctx: StageContext) -> None:
        """Extract and store the turn's facts, reporting each one's fate; a failure never breaks the run: it
        goes to `on_error`, is logged in the step and marks the run degraded."""
        report: dict[str, Any] = {"stored": [], "dropped": [], "rejected": [], "duplicates": [], "error": None}
        try:
            skipped = self.skipped(scope, ctx)
            if skipped is not None:
                report["skipped"] = skipped
                return
            self.extract(scope, ctx, report)
        except Exception as err:
            report["error"] = f"{type(err).__name__}: {err}"
            report["degraded"] = _degraded(ctx, err, report["error"])
            ctx.log(f"extract_memories failed: {report['error']}")
            if self.on_error is not None:
                self.on_error(err)
        finally:
            if self.into:
                setattr(scope, self.into, report)
            if report["stored"] and self.on_extracted is not None:
                self.on_extracted(report["stored"])

    def skipped(self, scope: Any, ctx: StageContext) -> Optional[str]:
        """Why this step learns nothing (logged): a continuation call of a tool loop, or a what-if
        re-execution (trace.counterfactual), which must never teach the memory anything."""
        if self.skip_continuations and _is_continuation(scope, ctx):
            ctx.log("extract_memories: continuation call, skipped")
            return "continuation"
        if ctx.without:
            ctx.log("extract_memories: a counterfactual run stores no memories, skipped")
            return "counterfactual"
        return None

    def extract(self, scope: Any, ctx: StageContext, report: dict[str, Any]) -> None:
        """Ask the model for the turn's facts, then keep each one that passes the threshold, the content
        filter and the duplicate checks; an update of a stored fact supersedes it."""
        store, subject = ctx.store, ctx.subject
        if store is None or not subject:
            raise TracememError("extract_memories needs a store and a subject: flow.run(..., store=..., subject=...)")
        chat = ctx.env[self.model] if isinstance(self.model, str) and self.model in ctx.env else self.model
        if isinstance(chat, str):
            raise TracememError(f"extract_memories needs a model in env['{self.model}']")
        question, answer = str(getattr(scope, self.question_from) or ""), str(getattr(scope, self.answer_from) or "")
        if not question.strip():
            ctx.log("extract_memories: no user message this turn")
            return
        known = store.memory.search(subject, question, recall=True, limit=self.related) if self.related else None
        known_ids = {r.memory_id: r for r in known.records} if known else {}
        parsed = self.ask(ctx, chat, question, answer, known_ids.values())
        live = store.memory.records(subject)
        by_norm = {_norm(r.text): r for r in live if not r.flagged}  # a contradicted record is no duplicate
        turn = str(getattr(scope, self.turn_from) or "") if self.turn_from else ""
        for fact in parsed.facts:
            if fact.score < self.threshold:
                report["dropped"].append({"fact": fact.fact, "score": fact.score, "why": f"score < {self.threshold}"})
                continue
            rule = reads_as_instruction(fact.fact) if self.content_filter else None
            if rule:
                report["rejected"].append({"fact": fact.fact, "score": fact.score,
                                           "why": f"reads as an instruction ({rule})"})
                continue
            # an update of a stored attribute is never its near duplicate ("diet is vegan" vs "... vegetarian")
            old = fact.supersedes if fact.supersedes in known_ids else _same_attribute(live, fact.fact)
            duplicate = by_norm.get(_norm(fact.fact)) or (
                None if old is not None else _near(store, subject, fact.fact, self.near_duplicate))
            if duplicate is not None:
                report["duplicates"].append({"fact": fact.fact, "memory_id": duplicate.memory_id})
                continue
            record = self.remember(ctx, fact, old, turn, report)
            by_norm[_norm(record.text)] = record
        ctx.log(f"extract_memories: stored {len(report['stored'])}, dropped {len(report['dropped'])}, "
                f"rejected {len(report['rejected'])}, duplicates {len(report['duplicates'])}")

    def ask(self, ctx: StageContext, chat: ChatModel, question: str, answer: str,
            known: Iterable[Any]) -> ExtractedFacts:
        """The model's facts for the turn, told the subject's related stored facts by id; a reply that is not
        JSON or does not match the schema raises a TracememError saying which."""
        known_text = "\n".join(f"- {r.memory_id}: {r.text}" for r in known) or "(none)"
        messages = [Message(role="system", content=EXTRACTION_PROMPT + "\nKnown facts:\n" + known_text),
                    Message(role="user", content=f"User: {question}\nAssistant: {answer}")]
        reply = ctx.complete(chat, messages, schema=EXTRACTION_SCHEMA)  # recorded as a model_calls row
        try:
            return ExtractedFacts.model_validate(json.loads(reply.text))
        except json.JSONDecodeError as err:
            raise TracememError(f"extraction model replied with invalid JSON ({err.msg}): {reply.text[:120]!r}") from None
        except ValidationError as err:
            raise TracememError(f"extraction reply does not match the schema: {err.errors()[0]['msg']} "
                                f"at {err.errors()[0]['loc']}") from None

    def remember(self, ctx: StageContext, fact: ExtractedFact, old: Optional[str], turn: str,
                 report: dict[str, Any]) -> Any:
        """Store one fact with its provenance (run, step, turn), superseding `old` when it updates it; report it
        and mark it with an OpenTelemetry span."""
        store, subject = ctx.store, ctx.subject
        record = store.memory.remember(subject, fact.fact, tags=list(self.tags) + fact.tags,
                                       confidence=round(fact.score * 100, 1), source_run_id=ctx.run_id,
                                       source_step=ctx.step, source_ref=turn or None, run_id=ctx.run_id)
        entry = {"memory_id": record.memory_id, "text": record.text, "score": fact.score,
                 "confidence": record.confidence, "tags": list(record.tags), "supersedes": None}
        if old is not None:
            store.memory.supersede(old, record.memory_id, run_id=ctx.run_id,
                                   reason=f"updated by turn {turn or ctx.run_id}")
            entry["supersedes"] = old
        report["stored"].append(entry)
        ctx.span("update_memory", attributes={"gen_ai.operation.name": "update_memory",
                                              "tracemem.memory.id": record.memory_id,
                                              "tracemem.memory.supersedes": old or ""})
        return record


def _degraded(ctx: StageContext, err: BaseException, error: str) -> dict[str, Any]:
    """Mark the run as degraded while it goes on (`ctx.degrade`: `runs.degraded`), with an error span for
    OpenTelemetry; returns what the extraction report keeps: {stage, reason, error_type, http_status}."""
    status = getattr(err, "status", None)
    marker = {"stage": ctx.stage, "reason": f"memory extraction failed: {error}", "error_type": type(err).__name__,
              "http_status": status if isinstance(status, int) else None}
    ctx.degrade(marker["reason"])
    ctx.span("extract_memories failed", attributes={"error.type": marker["error_type"], "tracemem.degraded": True,
                                                    "tracemem.degraded.reason": marker["reason"][:500],
                                                    "http.response.status_code": marker["http_status"]})
    return marker


def _is_continuation(scope: Any, ctx: StageContext) -> bool:
    """A tool-loop iteration: this stage ran before in the run, or the last message (a Message or a
    dict) is a tool result."""
    if ctx.iteration > 0:
        return True
    messages = getattr(scope, "messages", None) if hasattr(type(scope), "messages") else None
    return bool(messages) and messages[-1].get("role") == "tool"


def _near(store: Any, subject: str, text: str, threshold: float) -> Any:
    hits = store.memory.search(subject, text, semantic=True, limit=5)
    for record in hits.records:  # a flagged (contradicted, stale) record is not a duplicate of a current fact
        if not record.flagged and record.similarity is not None and record.similarity >= threshold:
            return record
    return None


_POSSESSIVE = re.compile(r"^(.*?(?:'s|\bmy|\btheir|\bher|\bhis)\s+[\w\s]+?)\s+(?:is|are|was|were)\s+", re.IGNORECASE)


def _same_attribute(live: Sequence[Any], text: str) -> Optional[str]:
    """A stored fact giving another value to the same attribute ("User's diet is X" vs "... is Y")."""
    m = _POSSESSIVE.match(text)
    if not m:
        return None
    key = _norm(m.group(1))
    for record in live:
        other = _POSSESSIVE.match(record.text)
        if other and _norm(other.group(1)) == key and _norm(record.text) != _norm(text) and not record.flagged:
            return record.memory_id
    return None


def install_extraction(pipeline: Any, model: Union[ChatModel, str] = "extractor", **options: Any) -> Any:
    """Append extraction to a pipeline, skipping continuation calls (the auto-installed form)."""
    options.setdefault("skip_continuations", True)
    return pipeline.then(extract_memories(model, **options))
