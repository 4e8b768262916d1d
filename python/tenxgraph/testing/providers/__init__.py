"""Local stand-ins for model providers: real SDKs, fake servers on 127.0.0.1, scripted per test.

- :class:`OpenAIStandIn`: OpenAI chat completions and the Responses API (plain and streamed).
- :class:`AnthropicStandIn`: Anthropic's Messages API (plain and streamed).
- :class:`GoogleStandIn`: the Gemini API's generateContent / streamGenerateContent.

All three share one scripting model (:mod:`tenxgraph.testing.providers.scripted_server`):
``reply_text``, ``reply_tool_calls``, ``reply_json``, ``reply_error``, ``reply_hang``, and the
recorded ``requests``.
"""

from tenxgraph.testing.providers.anthropic_server import AnthropicStandIn
from tenxgraph.testing.providers.google_server import GoogleStandIn
from tenxgraph.testing.providers.openai_server import OpenAIStandIn
from tenxgraph.testing.providers.scripted_server import RecordedRequest, Reply, ScriptedStandIn

__all__ = ["AnthropicStandIn", "GoogleStandIn", "OpenAIStandIn", "RecordedRequest", "Reply", "ScriptedStandIn"]
