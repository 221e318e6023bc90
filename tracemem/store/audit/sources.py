"""Sources: the things an answer can depend on, named the same way by affected, blame and suspect runs.

A source is a memory, a past run, a prompt-section source (what a prompt line was
built from, e.g. `user:plan`), a model, a stage of one pipeline version, a tool, or
the whole pipeline version. On the command line it is written `kind:id`
(`memory:m_12ab`, `run:3f9c…`, `model:gpt-4o`, `section:user:plan`, `pipeline:9a1b…`);
a bare id is looked up as a memory, then as a run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from ...dbmeta import first_row
from ...errors import UsageError

SourceKind = Literal["memory", "run", "section", "model", "stage", "tool", "pipeline"]
KINDS: tuple[str, ...] = get_args(SourceKind)


@dataclass(frozen=True)
class Source:
    """One source: its kind and its id (for a section, `source_kind:source_id`; for a stage,
    `stage@pipeline_hash`)."""

    kind: str
    id: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


def parse_source(text: Any, con: Any = None) -> Source:
    """A Source from `kind:id` text (or a Source); a bare id is looked up as a memory, then a run."""
    if isinstance(text, Source):
        return text
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"a source is 'kind:id' (kinds: {', '.join(KINDS)}), got {text!r}")
    kind, sep, rest = text.partition(":")
    if sep and kind in KINDS and rest:
        return Source(kind, rest)
    if con is not None:
        if first_row(con.execute("SELECT 1 FROM memories WHERE memory_id = ?", [text])):
            return Source("memory", text)
        if first_row(con.execute("SELECT 1 FROM runs WHERE run_id = ?", [text])):
            return Source("run", text)
    raise UsageError(f"'{text}' is neither a memory id nor a run id in this store; name the source as kind:id "
                     f"(kinds: {', '.join(KINDS)}), e.g. model:gpt-4o or section:user:plan")
