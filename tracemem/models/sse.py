"""Server-sent events: split a byte stream into the data of each event.

The OpenAI-compatible servers stream a reply as ``data: {json}`` events separated by
blank lines and ended by ``data: [DONE]``. Bytes arrive cut anywhere (inside a line,
inside a UTF-8 character), so lines are decoded only once complete. A line longer
than the limit is refused rather than buffered without end, and a long line's bytes are
gathered in one growing buffer (linear in its length, however many blocks it comes in).
"""
from __future__ import annotations

from .transport import TransportTooLarge

DONE = "[DONE]"


class SSEDecoder:
    """Feed bytes as they arrive; get back the data of every event completed so far."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self._pending = bytearray()
        self._data: list[str] = []

    def feed(self, block: bytes) -> list[str]:
        self._pending += block  # amortized: no copy of what came before
        if len(self._pending) > self.max_line_bytes and b"\n" not in block:
            raise TransportTooLarge(self.max_line_bytes, len(self._pending))
        if b"\n" not in block:
            return []
        lines = bytes(self._pending).split(b"\n")
        self._pending = bytearray(lines.pop())
        if len(self._pending) > self.max_line_bytes or any(len(line) > self.max_line_bytes for line in lines):
            raise TransportTooLarge(self.max_line_bytes, max(len(self._pending), *map(len, lines)))
        events: list[str] = []
        for line in lines:
            self._line(line[:-1] if line.endswith(b"\r") else line, events)
        return events

    def close(self) -> list[str]:
        """At the end of the stream: an event whose lines all arrived counts even without its blank line;
        a line cut off mid-way does not."""
        events: list[str] = []
        if not self._pending:
            self._line(b"", events)
        self._pending, self._data = bytearray(), []
        return events

    @property
    def mid_line(self) -> bool:
        """True when the bytes so far end inside a line (a cut-off stream)."""
        return bool(self._pending)

    def _line(self, line: bytes, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(b":"):  # a comment, e.g. a keep-alive ": ping"
            return
        name, _, value = line.partition(b":")
        if name == b"data":
            self._data.append((value[1:] if value.startswith(b" ") else value).decode("utf-8", "replace"))
