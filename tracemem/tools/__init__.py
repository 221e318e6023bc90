"""Tools a model may call: schemas derived from Python functions, arguments validated, outcomes recorded.

``@tool`` (or ``Tool.from_function``) turns a function into a tool whose JSON schema
comes from its type hints and docstring through pydantic. ``ToolSet.run(call)`` runs
one ``ToolCall`` from a model's reply and always returns a ``ToolOutcome``: a tool
that raises, arguments that are not JSON or do not fit, and an unknown tool name each
become a tool-result message stating the error, so the model can correct itself and
the run goes on. A tool has side effects unless declared ``pure=True`` (made once, replayed
after that), and may need a person's approval (``needs_approval=True``). Modules: ``tool``
(Tool), ``toolset`` (ToolSet, ToolOutcome), ``approval`` (ToolApprovals), ``docstrings``,
``errors``.
"""
from .approval import REJECTED, ToolApprovals, ToolDecision, ask_payload
from .docstrings import parse_docstring
from .errors import ToolArgumentsError, ToolDefinitionError, ToolError, UnknownToolError
from .tool import Arguments, Tool, tool
from .toolset import MAX_ERROR_CHARS, MAX_RESULT_CHARS, OutcomeError, ToolOutcome, ToolSet, cap_text, render_result

__all__ = sorted([
    "Arguments", "MAX_ERROR_CHARS", "MAX_RESULT_CHARS", "OutcomeError", "REJECTED", "Tool", "ToolApprovals",
    "ToolArgumentsError", "ToolDecision", "ToolDefinitionError", "ToolError", "ToolOutcome", "ToolSet",
    "UnknownToolError", "ask_payload", "cap_text", "parse_docstring", "render_result", "tool",
])
