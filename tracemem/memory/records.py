"""Memory records and events as pydantic models, with the input rules.

A record is one remembered fact about one subject. Its validation lives here so
that every path (remember, update, bulk insert) applies the same rules and
raises the same clear `MemoryInputError`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..surrogates import storable_text
from ..times import utc_naive
from .errors import MemoryInputError

__all__ = [
    "REVIEW_STATES",
    "FLAGGED_STATES",
    "ReviewState",
    "MemoryRecord",
    "MemoryEvent",
    "UPDATABLE_FIELDS",
    "to_utc_naive",
    "check_fields",
]

ReviewState = Literal["fresh", "reviewed", "stale", "contradicted"]
REVIEW_STATES: tuple[str, ...] = ("fresh", "reviewed", "stale", "contradicted")
# Flagged records are never injected by recall: someone said they are wrong or old.
FLAGGED_STATES: frozenset[str] = frozenset({"stale", "contradicted"})
# What `update(id, **changes)` may change; identity, provenance and audit fields may not.
UPDATABLE_FIELDS: tuple[str, ...] = ("text", "tags", "confidence", "review_state", "valid_from", "valid_until", "source_ref")


class MemoryRecord(BaseModel):
    """One remembered fact. Column names match the `memories` table."""

    model_config = ConfigDict(frozen=True)

    memory_id: str
    subject: str
    text: str
    tags: tuple[str, ...] = ()
    confidence: float = Field(60.0, ge=0, le=100)
    review_state: ReviewState = "fresh"
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    source_run_id: str | None = None
    source_step: int | None = None
    source_ref: str | None = None
    embedder_id: str | None = None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None
    superseded_by: str | None = None

    @property
    def flagged(self) -> bool:
        """Stale or contradicted: excluded from recall."""
        return self.review_state in FLAGGED_STATES

    @property
    def forgotten(self) -> bool:
        """Soft-deleted with forget(): kept for history, never returned by search."""
        return self.deleted_at is not None

    def valid_at(self, now: datetime) -> bool:
        """Inside the half-open window [valid_from, valid_until) at `now`."""
        return (self.valid_from is None or self.valid_from <= now) and (self.valid_until is None or now < self.valid_until)

    def audit_view(self) -> dict[str, Any]:
        """The JSON-able fields logged in memory_events (no embedding)."""
        return self.model_dump(mode="json")  # same data as json.loads(model_dump_json()), 3x cheaper


class MemoryEvent(BaseModel):
    """One change to a memory, as stored in `memory_events`."""

    model_config = ConfigDict(frozen=True)

    event_id: int
    memory_id: str
    event: str
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None
    run_id: str | None = None
    at: datetime
    reason: str | None = None


def to_utc_naive(value: datetime | None, field: str) -> datetime | None:
    """DuckDB TIMESTAMP is naive; we store UTC. Aware datetimes are converted."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise MemoryInputError(f"{field} must be a datetime or None, got {type(value).__name__} {value!r}")
    return utc_naive(value)


def _check_text(text: Any) -> str:
    if not isinstance(text, str):
        raise MemoryInputError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise MemoryInputError("text is empty: a memory needs some content to remember")
    return check_unicode(text, "text")


def check_unicode(text: str, what: str) -> str:
    """`text` when it is valid Unicode; a lone surrogate (half an emoji, as `json.loads` makes from a truncated
    `\\ud83d` escape) can be neither embedded nor stored, so it is refused with what to do."""
    if storable_text(text) is not None:
        raise MemoryInputError(
            f"{what} {text[:60]!r} holds a lone surrogate (text that is not valid Unicode), which no store can "
            f"hold; escape it first (tracemem.surrogates.escape_surrogates(text) gives '\\udXXX' in its place) "
            f"or drop the broken characters")
    return text


def _check_confidence(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MemoryInputError(f"confidence must be a number in 0..100, got {value!r}")
    if not (0 <= value <= 100):  # also rejects NaN
        raise MemoryInputError(
            f"confidence {value!r} is out of range: use 0..100 (the recall floor is 60 by default)"
        )
    return float(value)


def _check_tags(tags: Any) -> tuple[str, ...]:
    if isinstance(tags, str):
        raise MemoryInputError(f"tags must be a list of strings, not the string {tags!r} (wrap it: [{tags!r}])")
    try:
        out = tuple(tags)
    except TypeError:
        raise MemoryInputError(f"tags must be a list of strings, got {tags!r}") from None
    for t in out:
        if not isinstance(t, str) or not t.strip():
            raise MemoryInputError(f"every tag must be a non-empty string, got {t!r} in {list(out)!r}")
        check_unicode(t, "tag")
    return out


def check_fields(values: dict[str, Any]) -> dict[str, Any]:
    """Validate and normalize the user-settable fields present in `values`."""
    out = dict(values)
    if "text" in out:
        out["text"] = _check_text(out["text"])
    if "confidence" in out:
        out["confidence"] = _check_confidence(out["confidence"])
    if "tags" in out:
        out["tags"] = _check_tags(out["tags"])
    if "review_state" in out and out["review_state"] not in REVIEW_STATES:
        raise MemoryInputError(f"review_state {out['review_state']!r} is not one of {', '.join(REVIEW_STATES)}")
    for f in ("valid_from", "valid_until"):
        if f in out:
            out[f] = to_utc_naive(out[f], f)
    for f in ("source_ref", "source_run_id"):
        if out.get(f) is not None and not isinstance(out[f], str):
            raise MemoryInputError(f"{f} must be a string or None, got {out[f]!r}")
    if out.get("source_step") is not None and (isinstance(out["source_step"], bool) or not isinstance(out["source_step"], int)):
        raise MemoryInputError(f"source_step must be an integer or None, got {out['source_step']!r}")
    return out


def check_window(valid_from: datetime | None, valid_until: datetime | None) -> None:
    """The window [valid_from, valid_until) must not be empty or reversed."""
    if valid_from is not None and valid_until is not None and valid_until <= valid_from:
        raise MemoryInputError(
            f"validity window ends before it starts: valid_until {valid_until.isoformat()} <= "
            f"valid_from {valid_from.isoformat()}; leave either end as None for an open window"
        )


def check_subject(subject: Any) -> str:
    if not isinstance(subject, str) or not subject.strip():
        raise MemoryInputError(f"subject must be a non-empty string (whose memory this is), got {subject!r}")
    return check_unicode(subject, "subject")


def as_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    return () if tags is None else _check_tags(tags)
