"""The extras of the release wheel, checked from a clean virtualenv with no source tree (run by hand,
not by CI: it downloads the SDKs): each provider SDK and fastmcp import, and a ReactAgent
tool-calling turn runs on each provider's stand-in (no network, no key).

    python -m venv /tmp/x && /tmp/x/bin/pip install "dist/10xgraph-*.whl[openai,anthropic,google-genai,mcp]"
    cd /tmp && /tmp/x/bin/python -I /path/to/scripts/wheel_extras_smoke.py
"""
import asyncio, os
import fastmcp  # noqa: F401
from tenxgraph.core.graph.tool_node import HAS_FASTMCP, HAS_MCP
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.testing.providers import AnthropicStandIn, GoogleStandIn, OpenAIStandIn

assert HAS_FASTMCP and HAS_MCP


def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


for stand_in, model in ((OpenAIStandIn, "openai/gpt-4o-mini"), (AnthropicStandIn, "anthropic/claude-sonnet-4-5"),
                        (GoogleStandIn, "gemini/gemini-2.5-flash")):
    with stand_in() as server:
        os.environ.update(server.env)
        server.reply_tool_calls(("weather", {"city": "Paris"}, "call_1"))
        server.reply_text("It is sunny in Paris.")
        app = ReactAgent(model=model, system_prompt=[{"role": "system", "content": "Be brief."}],
                         tools=[weather], retry_config=False).compile(checkpointer=InMemoryCheckpointer())
        out = asyncio.run(app.ainvoke({"messages": [Message.text_message("Weather?")]}, {"thread_id": model}))
        roles = [m.role for m in out["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"], roles
        assert out["messages"][-1].text() == "It is sunny in Paris."
        print(f"{model}: {roles} -> {out['messages'][-1].text()!r}")
print("ok: openai, anthropic, google-genai and mcp extras work from the wheel")
