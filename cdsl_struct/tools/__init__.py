"""Function calling, as a translation at the two edges of decoding.

Tools in OpenAI format (or Python functions) become one constraint for the row
(``ToolCallsGrammar``) and a system prompt that describes them; the finished text (or the
stream of it) is read back into content and ``ToolCall``s (``parse_tool_output``,
``CallStream``). Between the two edges a tool request decodes like any other.
"""

from .definitions import (
    CALL_MARKER,
    RESULT_CLOSE,
    RESULT_OPEN,
    ToolCall,
    new_call_id,
    normalise_tools,
    tool_from_function,
)
from .grammar import ToolCallsGrammar
from .parsing import CallDelta, CallStream, InvalidToolCall, ToolOutput, parse_tool_output
from .request import ToolPrompt, ToolRequest, tool_request

__all__ = [
    "CALL_MARKER", "RESULT_CLOSE", "RESULT_OPEN", "CallDelta", "CallStream", "InvalidToolCall", "ToolCall",
    "ToolCallsGrammar", "ToolOutput", "ToolPrompt", "ToolRequest", "new_call_id", "normalise_tools",
    "parse_tool_output", "tool_from_function", "tool_request",
]
