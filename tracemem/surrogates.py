"""Text UTF-8 cannot encode, made storable: each lone surrogate becomes the six characters `\\udXXX`.

Python strings may hold lone surrogates (`json.loads('"\\\\ud83d"')` makes one from a
truncated emoji escape), which neither DuckDB, Arrow, pydantic's JSON nor UTF-8
can hold. Wherever tracemem stores text it escapes them (backslashreplace) and says
so (a note on the run or a line in the step's logs), so one such string never stops
a value, a step or a run from being recorded. PostgreSQL text cannot hold a NUL
character either (DuckDB can): there each becomes the six characters `\\u0000`, noted
the same way (`nul=True`).
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel

__all__ = ["ESCAPED", "NUL_ESCAPED", "storable_text", "storable", "escape_surrogates"]

ESCAPED = "lone surrogates (text that is not valid Unicode) escaped as \\uXXXX"
NUL_ESCAPED = "NUL characters (which PostgreSQL text cannot hold) escaped as \\u0000"


def storable_text(text: str) -> Optional[str]:
    """`text` with each lone surrogate escaped as `\\udXXX`; None when it is storable as it is."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def storable(text: str, nul: bool = False) -> tuple[Optional[str], Optional[str]]:
    """`text` made storable, and what was changed (`ESCAPED`, and with `nul=True` `NUL_ESCAPED`); (None, None)
    when it is storable as it is."""
    fixed = storable_text(text)
    if nul and "\x00" in text:
        return (fixed or text).replace("\x00", "\\u0000"), f"{ESCAPED}; {NUL_ESCAPED}" if fixed else NUL_ESCAPED
    return fixed, None if fixed is None else ESCAPED


def escape_surrogates(value: Any) -> Any:
    """A copy of `value` (str, dict, list, tuple, set, pydantic model) with every string, keys included,
    made storable; other values are kept as they are."""
    if isinstance(value, str):
        fixed = storable_text(value)
        return value if fixed is None else fixed
    if isinstance(value, BaseModel):
        return escape_surrogates(value.model_dump())
    if isinstance(value, dict):
        return {escape_surrogates(k): escape_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [escape_surrogates(v) for v in value]
    return value
