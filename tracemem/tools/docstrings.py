"""Read a function's description and its parameters' descriptions from its docstring.

A tool's JSON schema tells the model what each argument means, and the best place
for that is where the author already wrote it. Google (``Args:``), NumPy
(``Parameters`` + dashes) and Sphinx (``:param x:``) styles are understood; anything
else is left in the description, never guessed at.
"""
from __future__ import annotations

import inspect
import re
from typing import Optional

ARG_HEADERS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters"}
OTHER_HEADERS = {"returns", "return", "yields", "yield", "raises", "raise", "examples", "example", "notes", "note",
                 "see also", "references", "attributes", "warnings", "warning", "todo"}
SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?\*{0,2}(?P<name>\w+)\s*:\s*(?P<desc>.*)$")
GOOGLE_ENTRY = re.compile(r"^\*{0,2}(?P<name>\w+)\s*(?:\([^)]*\))?\s*:\s*(?P<desc>.*)$")
NUMPY_ENTRY = re.compile(r"^\*{0,2}(?P<name>\w+)\s*(?::.*)?$")


def parse_docstring(doc: Optional[str]) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` from a docstring; ``("", {})`` for none."""
    if not doc or not doc.strip():
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section, style, current, entry_indent = "summary", "google", None, None
    i = 0
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        indent = len(line) - len(line.lstrip())
        header = stripped.rstrip(":").strip().lower()
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if indent == 0 and stripped and following and set(following) == {"-"}:  # NumPy section header
            section = "args" if header in ARG_HEADERS else "other"
            style, current, entry_indent = "numpy", None, None
            i += 2
            continue
        if indent == 0 and stripped.endswith(":") and (header in ARG_HEADERS or header in OTHER_HEADERS):
            section = "args" if header in ARG_HEADERS else "other"
            style, current, entry_indent = "google", None, None
            i += 1
            continue
        sphinx = SPHINX_PARAM.match(stripped)
        if sphinx:
            section, current = "sphinx", sphinx["name"]
            params[current] = sphinx["desc"].strip()
        elif re.match(r"^:\w+", stripped) and section in ("summary", "sphinx"):
            section, current = "other", None  # :returns:, :raises: ...
        elif section == "summary":
            summary.append(line)
        elif section == "args" and stripped and (entry_indent is None or indent <= entry_indent):
            entry = (NUMPY_ENTRY if style == "numpy" else GOOGLE_ENTRY).match(stripped)
            if entry:
                current, entry_indent = entry["name"], indent
                params[current] = "" if style == "numpy" else entry["desc"].strip()
        elif section in ("args", "sphinx") and stripped and current is not None:
            params[current] = f"{params[current]} {stripped}".strip()
        i += 1
    return "\n".join(summary).strip(), {k: v for k, v in params.items() if v}
