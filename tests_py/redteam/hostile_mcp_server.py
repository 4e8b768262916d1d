"""An MCP server that answers with what a text-minded client does not expect, and one tool that
kills the server mid-call (``die``); it counts calls like tests_py/mcp_kit/server.py (MCP_CALLS).

    python -m tests_py.redteam.hostile_mcp_server PORT
"""

from __future__ import annotations

import base64
import os
import sys

from fastmcp import FastMCP
from fastmcp.utilities.types import Audio, Image
from mcp.types import EmbeddedResource, TextResourceContents

from tests_py.mcp_kit.server import _count

server = FastMCP("tenxgraph-hostile-server")
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


@server.tool
def picture() -> Image:
    """A 1x1 PNG."""
    _count("picture")
    return Image(data=PNG, format="png")


@server.tool
def sound() -> Audio:
    """A few bytes of WAV."""
    _count("sound")
    return Audio(data=b"RIFF\x00\x00\x00\x00WAVE", format="wav")


@server.tool
def mixed() -> list:
    """Text, an image and an embedded resource in one result."""
    _count("mixed")
    return ["caption", Image(data=PNG, format="png"),
            EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///x.txt", text="inside"))]


@server.tool
def nothing() -> list:
    """An empty result."""
    _count("nothing")
    return []


@server.tool
def die() -> str:
    """The server process exits in the middle of the call."""
    _count("die")
    os._exit(3)


if __name__ == "__main__":
    server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False, log_level="warning")
