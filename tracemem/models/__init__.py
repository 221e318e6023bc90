"""Chat models behind one small protocol, with tool calls and streaming.

Pipelines talk to a ``ChatModel`` and never to a vendor SDK, so a run is recorded the
same way whether it used OpenAI, a local vLLM/Ollama/llama.cpp server, or the
deterministic ``ScriptedModel`` that tests and the demo use. Nothing here touches the
network until an ``OpenAICompatibleModel`` is built *and* called.

Modules, each one idea: ``protocol`` (ChatModel, Reply, Usage, stream events),
``messages`` (Message, ToolCall, ToolSpec), ``errors``, ``openai`` (the HTTP adapter),
``openai_wire`` (its JSON), ``sse`` (event streams), ``transport`` (HTTP with a whole-reply
deadline), ``scripted`` (ScriptedModel).
"""
from .errors import ErrorKind, ModelConfigError, ModelError
from .messages import Message, MessageLike, Role, ToolCall, ToolSpec, parse_arguments, wire_messages
from .openai import MAX_REPLY_BYTES, RETRY_AFTER_CAP, OpenAICompatibleModel
from .protocol import (ChatModel, Reply, Schema, StreamEvent, TextDelta, TokenCallback, ToolCallDelta, ToolChoice,
                       Usage, astream_reply, count_tokens_estimate, stream_reply, usage_count)
from .scripted import ScriptedCall, ScriptedModel

__all__ = sorted([
    "ChatModel", "ErrorKind", "MAX_REPLY_BYTES", "Message", "MessageLike", "ModelConfigError", "ModelError",
    "OpenAICompatibleModel", "RETRY_AFTER_CAP", "Reply", "Role", "Schema", "ScriptedCall", "ScriptedModel",
    "StreamEvent", "TextDelta", "TokenCallback", "ToolCall", "ToolCallDelta", "ToolChoice", "ToolSpec", "Usage",
    "astream_reply", "count_tokens_estimate", "parse_arguments", "stream_reply", "usage_count", "wire_messages",
])
