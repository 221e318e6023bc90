"""`decide(scope, rules, default=...)`: a decider whose every rule leaves evidence.

    def route(scope):
        return decide(scope, [
            ("score below 500", lambda s: s.score < 500, "reject"),
            ("income over 100k", lambda s: s.income > 100_000, "approve"),
        ], default="review")

All rules are evaluated (so the evidence is complete); the first that matches
chooses the branch. The evidence records each rule's label, whether it matched
and the scope values it read; the runner stores it in `decisions.evidence`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import pydantic_core

from ..errors import TracememError
from ..scope.recorder import ScopeView, recorder_of

Rule = tuple[str, Callable[[Any], bool], str]


def decide(scope: Any, rules: Sequence[Rule], default: str | None = None) -> str:
    """Choose a branch by the first matching rule; the evidence of every rule is recorded."""
    if not isinstance(scope, ScopeView):
        raise TracememError("decide() must be called with the scope view a decider stage received")
    rec = recorder_of(scope)
    evidence: list[dict[str, Any]] = []
    chosen: str | None = None
    for rule in rules:
        if len(rule) != 3:
            raise TracememError(f"decide(): each rule is (label, predicate, branch), got {rule!r}")
        label, predicate, branch = rule
        rec.capture = []
        try:
            matched = bool(predicate(scope))
        finally:
            captured, rec.capture = rec.capture, None
        evidence.append({
            "rule": label,
            "branch": branch,
            "matched": matched,
            "read": {path: "<redacted>" if path in rec.state.schema.secret
                     else pydantic_core.to_jsonable_python(value, fallback=repr) for path, value in captured},
        })
        if matched and chosen is None:
            chosen = branch
    if chosen is None:
        if default is None:
            raise TracememError(
                f"decide() in stage '{rec.stage}': no rule matched and no default was given "
                f"(rules: {', '.join(e['rule'] for e in evidence)}); pass default='<branch>'"
            )
        chosen = default
    rec_evidence = {"rules": evidence, "default": default, "used_default": all(not e["matched"] for e in evidence)}
    rec.evidence = rec_evidence
    return chosen
