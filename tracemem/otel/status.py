"""What an error span says: a meaningful `error.type`, and a status that quotes content only when asked.

Error messages may quote a value, a reply or personal data, so without content capture a span's
status names only what failed and the error type. The type is read where tracemem writes one (a
message's start, or after "failed in run <id>: "), never from a word found elsewhere in a message,
which may be content; tracemem's own errors that record no type name (a loop over its limit, a stage
timing out, a bad scope write, a fork conflict, a replay miss) are told by their fixed wording.
"""
from __future__ import annotations

import re
from typing import Optional

__all__ = ["error_type", "described"]

_ERROR_TYPE = re.compile(r"(?:^|failed in run \w+: )([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Timeout))(?::|$)")
_OWN = (  # tracemem's errors recorded by their message alone (tracemem/errors.py words them)
    (re.compile(r"^loop '[^']*' back to '[^']*' in pipeline '.*' exceeded max_iterations=\d+"), "LoopLimitError"),
    (re.compile(r"^stage '[^']*' timed out after [\d.e+-]+ s \(\.then\(\.\.\., timeout="), "StageTimeout"),
    (re.compile(r"^stage '[^']*' wrote an invalid value to '"), "ScopeWriteError"),
    (re.compile(r"^fork branches '[^']*' and '[^']*' both wrote '"), "ForkConflictError"),
    (re.compile(r"^model '.*' was asked something the record never asked \(request "), "ReplayMissError"),
)


def error_type(message: Optional[str]) -> str:
    """The error type a recorded error message names, else `_OTHER` (the semantic conventions' fallback)."""
    text = message or ""
    match = _ERROR_TYPE.search(text)
    if match:
        return match.group(1)
    for pattern, name in _OWN:
        if pattern.search(text):
            return name
    return "_OTHER"


def described(error: Optional[str], what: str, capture_content: bool) -> str:
    """An error span's status description: the message only with content capture, else what failed and
    the error type (`stage 'x' failed: ValueError`)."""
    if capture_content and error:
        return error
    kind = error_type(error)
    return what + (f": {kind}" if kind != "_OTHER" else "")
