"""Ready-made stages built only on tracemem's public API."""
from .model_call import call_model
from .prompt import assemble_prompt
from .recall import recall
from .scope import AgentScope

__all__ = ["AgentScope", "recall", "assemble_prompt", "call_model"]
