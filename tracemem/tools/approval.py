"""A person's decision on tool calls a model asked for: approve, reject (with a message), or edit.

A tool declared `needs_approval=True` makes a tool agent pause before running it;
the run's `pending` lists the calls waiting (`ask_payload`), and the answer is a
`ToolApprovals`: one decision per call id,

    {"call_1": true,                                        # approve
     "call_2": {"approved": false, "message": "over 50 EUR"},  # reject: the model reads the message
     "call_3": {"approved": true, "arguments": {"amount": 20}}}  # approve with edited arguments

checked when the run is resumed, before anything is committed (every call asked about
decided, no other call named, edited arguments naming only the tool's parameters and
all it requires): a bad answer leaves the run paused.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, RootModel, ValidationInfo, model_validator

from tracemem.models import ToolCall

from .tool import Tool

__all__ = ["ToolDecision", "ToolApprovals", "ask_payload", "REJECTED"]

REJECTED = "Rejected by a person: {message}. Do not call this tool again for the same request."
"""The tool result a rejected call sends the model."""


class ToolDecision(BaseModel):
    """A person's decision on one tool call (`true`/`false` is short for approved/rejected)."""

    approved: bool
    message: str = ""  # a rejected call: what the model reads as the call's result
    arguments: Optional[dict[str, Any]] = None  # an approved call: the arguments to run it with instead

    @model_validator(mode="before")
    @classmethod
    def _short(cls, data: Any) -> Any:
        return {"approved": data} if isinstance(data, bool) else data


class ToolApprovals(RootModel[dict[str, ToolDecision]]):
    """The answer to a tool approval pause: a decision per call id (see the module doc)."""

    @model_validator(mode="after")
    def _fits(self, info: ValidationInfo) -> "ToolApprovals":
        asked = ((info.context or {}).get("asked") or {}).get("tool_calls") or []
        wanted = {c["id"]: c for c in asked}
        missing = [i for i in wanted if i not in self.root]
        unknown = [i for i in self.root if i not in wanted]
        if missing or unknown:
            raise ValueError(f"decide every call asked about, and only those: missing {missing}, not asked {unknown} "
                             f"(asked: {', '.join(wanted)})")
        for call_id, decision in self.root.items():
            schema = wanted[call_id].get("parameters") or {}
            if decision.arguments is not None:
                extra = set(decision.arguments) - set(schema.get("properties") or {})
                lacking = set(schema.get("required") or ()) - set(decision.arguments)
                if extra or lacking:
                    raise ValueError(f"the edited arguments of {call_id} ({wanted[call_id]['name']}) do not fit the "
                                     f"tool: unknown {sorted(extra)}, missing {sorted(lacking)}")
        return self

    def decision(self, call_id: str) -> Optional[ToolDecision]:
        return self.root.get(call_id)


def ask_payload(calls: list[ToolCall], tools: dict[str, Tool]) -> dict[str, Any]:
    """What a tool approval pause asks: each call waiting, with its arguments and the tool's parameters."""
    return {"tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments, "arguments_text": c.arguments_text,
                            "description": tools[c.name].description, "parameters": tools[c.name].parameters}
                           for c in calls]}
