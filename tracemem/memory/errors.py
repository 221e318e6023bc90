"""Memory errors. Named so they never shadow Python's builtin MemoryError.

Each message says what was wrong, with which value, and what to do instead.
"""

from __future__ import annotations

from ..errors import TracememError

__all__ = [
    "MemoryStoreError",
    "MemoryInputError",
    "MemoryNotFoundError",
    "EmbedderMismatchError",
    "EmbedderUnavailableError",
]


class MemoryStoreError(TracememError):
    """Base class of every error raised by tracemem.memory (a TracememError like every other)."""


class MemoryInputError(MemoryStoreError, ValueError):
    """A caller passed a bad value (confidence out of range, empty text, bad window, ...)."""


class MemoryNotFoundError(MemoryStoreError, KeyError):
    """No memory with that id (or it was purged)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "memory not found"


class EmbedderMismatchError(MemoryStoreError, ValueError):
    """A vector or embedder does not match the one the store was built with."""


class EmbedderUnavailableError(MemoryStoreError, ImportError):
    """An optional embedder's packages or weights are not installed."""
