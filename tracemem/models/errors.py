"""The errors a model call can raise, in one place so every adapter raises the same ones.

A caller branches on ``ModelError.kind`` instead of parsing text; a stream cut off
mid-reply still hands back what arrived (``partial``) so nothing already paid for
is lost. Both derive from ``TracememError``, like every error tracemem raises.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from tracemem.errors import TracememError

ErrorKind = Literal["status", "timeout", "bad_reply", "connection", "script", "cut_off", "too_large", "redirect"]


class ModelError(TracememError):
    """A model call failed; the message says what failed and what to do about it.

    ``kind`` lets callers branch without parsing text:

    - "status": the server answered with an HTTP error status (or an error event mid-stream);
    - "timeout": the whole reply did not arrive within ``timeout`` seconds;
    - "bad_reply": the body is not an OpenAI-compatible reply (not JSON, no message);
    - "connection": the server could not be reached (retried with backoff);
    - "script": a ScriptedModel has no reply for this call (a test-setup problem);
    - "cut_off": a streamed reply ended before it was complete;
    - "too_large": the reply exceeded ``max_reply_bytes``;
    - "redirect": too many redirects, or a redirect without a usable Location.

    ``partial`` is the reply received so far when a stream broke (kinds "cut_off",
    "timeout", "too_large", "status" mid-stream), else None.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind,
        status: Optional[int] = None,
        url: Optional[str] = None,
        model: Optional[str] = None,
        attempts: int = 1,
        partial: Optional[Any] = None,  # a protocol.Reply (which imports this module through messages)
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.url = url
        self.model = model
        self.attempts = attempts
        self.partial = partial


class ModelConfigError(TracememError, ValueError):
    """A model or a call was set up wrongly (bad argument, unknown tool_choice, bad message)."""
