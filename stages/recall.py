"""`recall`: honest long-term memory recall for the run's subject, into the scope.

Uses `store.memory.search(subject, query, recall=True)`: flagged, sub-floor and
out-of-window records are never injected; each record seen is recorded in
`memory_uses` (injected, or excluded with the reason), and the receipt (mode,
reasons, counts) is written to the scope next to the records.
"""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Callable, Optional

from tracemem import StageContext, TracememError


def recall(*, query_from: str = "question", into: str = "memories", receipt_into: Optional[str] = "recall_receipt",
           limit: int = 8, semantic: bool = True, now: Optional[Callable[[], datetime]] = None
           ) -> Callable[[Any, StageContext], None]:
    """A stage recalling up to `limit` memories relevant to `scope.<query_from>`."""

    def recall_memories(scope: Any, ctx: StageContext) -> None:
        if ctx.store is None:
            raise TracememError("recall needs a store: flow.run(..., store=Store('agent.duckdb'))")
        if not ctx.subject:
            raise TracememError("recall needs the run's subject: flow.run(..., subject='user-42')")
        query = str(getattr(scope, query_from) or "").strip()
        if not query:
            setattr(scope, into, [])
            if receipt_into:
                setattr(scope, receipt_into, {"mode": "none", "reason": f"no query: '{query_from}' is empty"})
            return
        started = time.time_ns()
        result = ctx.store.memory.search(ctx.subject, query, semantic=semantic, recall=True, limit=limit,
                                         now=now() if now else None)
        ended = time.time_ns()
        kept = [r for r in result.records if not ctx.excluded("memory", r.memory_id)]
        for r in result.records:  # a counterfactual run acts as if these memories were gone (ctx.without)
            if ctx.excluded("memory", r.memory_id):
                ctx.emit("memory_uses", memory_id=r.memory_id, outcome="excluded",
                         reason="counterfactual: left out of this run", score=float(r.score))
        records = [{"memory_id": r.memory_id, "text": r.text, "confidence": r.confidence,
                    "review_state": r.review_state, "created_at": r.created_at.isoformat(),
                    "score": round(float(r.score), 4)} for r in kept]
        for rank, r in enumerate(kept, start=1):
            ctx.emit("memory_uses", memory_id=r.memory_id, outcome="injected", reason="recalled",
                     score=float(r.score), rank=rank)
        for ex in result.excluded:
            ctx.emit("memory_uses", memory_id=ex.memory_id, outcome="excluded", reason=f"{ex.reason}: {ex.detail}")
        setattr(scope, into, records)
        if receipt_into:
            setattr(scope, receipt_into, {
                "mode": result.mode, "requested_semantic": result.requested_semantic,
                "index_unavailable_reason": result.index_unavailable_reason, "caveat": result.caveat,
                "returned": len(records), "total_before_filter": result.total_before_filter,
                "excluded_flagged": result.excluded_flagged, "excluded_below_floor": result.excluded_below_floor,
                "excluded_out_of_window": result.excluded_out_of_window, "recall_floor": result.recall_floor,
                "no_match": result.no_match, "receipt": result.receipt(),
            })
        # a retrieval span: the query and each document's text go out only when the exporter captures content
        ctx.span("retrieval", attributes={
            "gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "memory", "gen_ai.request.top_k": limit,
            "gen_ai.retrieval.query.text": query,
            "gen_ai.retrieval.documents": [{"id": r["memory_id"], "score": r["score"], "content": r["text"]}
                                           for r in records],
            "tracemem.memory.records": len(records), "tracemem.memory.mode": result.mode,
            "tracemem.memory.excluded": result.excluded_total, "tracemem.memory.degraded": result.degraded},
            start_ns=started, end_ns=ended)

    recall_memories.__name__ = recall_memories.__qualname__ = "recall"
    return recall_memories
