"""Ready-made stages built only on tracemem's public API."""
from .extract import extract_memories, install_extraction, reads_as_instruction
from .model_call import call_model
from .prompt import assemble_prompt
from .recall import recall
from .scope import AgentScope
from .snapshot import load_snapshot
from .tool_agent import tool_agent

__all__ = ["AgentScope", "recall", "assemble_prompt", "call_model", "extract_memories", "install_extraction",
           "load_snapshot", "reads_as_instruction", "tool_agent"]
