"""The errors of defining and running tools, all under ``ToolError`` (a ``TracememError``).

When a model calls a tool, these never crash the run: ``ToolSet.run`` turns each
into a tool-result message that states the error to the model, and records it.
Raised directly, by ``Tool.validate``/``Tool.call``, they name the tool and the field.
"""
from __future__ import annotations

from typing import Optional

from tracemem.errors import TracememError


class ToolError(TracememError):
    """A tool could not be defined or run as asked."""

    def __init__(self, message: str, *, tool: Optional[str] = None) -> None:
        super().__init__(message)
        self.tool = tool


class ToolDefinitionError(ToolError, TypeError):
    """A function cannot become a tool (e.g. ``*args``, an unresolvable type hint, a bad name)."""


class ToolArgumentsError(ToolError, ValueError):
    """The arguments a model sent do not fit the tool: not a JSON object, or failing its schema.

    ``field`` is the first bad field (None when the arguments are not a JSON object at
    all); ``problems`` lists every ``(field, message)`` pydantic reported.
    """

    def __init__(self, message: str, *, tool: str, field: Optional[str] = None,
                 problems: Optional[list[tuple[str, str]]] = None, arguments_text: str = "") -> None:
        super().__init__(message, tool=tool)
        self.field = field
        self.problems = list(problems or [])
        self.arguments_text = arguments_text


class UnknownToolError(ToolError, LookupError):
    """The model called a tool name that is not in the tool set."""
