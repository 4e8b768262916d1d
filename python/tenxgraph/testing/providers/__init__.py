"""Local stand-ins for model providers: real SDKs, fake servers on 127.0.0.1.

- :mod:`tenxgraph.testing.providers.openai_server`: :class:`OpenAIStandIn`, OpenAI chat
  completions (plain and streamed), scripted per test.
"""

from tenxgraph.testing.providers.openai_server import OpenAIStandIn, Reply

__all__ = ["OpenAIStandIn", "Reply"]
