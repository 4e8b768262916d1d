"""A real fastmcp server for tests_py/test_mcp_tools.py, in a child process of its own on a
loopback HTTP port. It counts on the server side: every tool call appends one JSON line to the
file named by ``MCP_CALLS`` (flushed and fsynced before the tool answers), so a test can count
what reached the server across killed client processes.

    python -m tests_py.mcp_kit.server PORT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from fastmcp import Context, FastMCP

CALLS = os.environ["MCP_CALLS"]
server = FastMCP("tenxgraph-test-server")


def _count(tool: str, **fields: object) -> None:
    with open(CALLS, "a") as f:
        f.write(json.dumps({"tool": tool, "pid": os.getpid(), **fields}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _idempotency_key(ctx: Context) -> object:
    # The request's _meta: a dict on fastmcp 3+, an object with attributes on fastmcp 2.
    meta = ctx.request_context.meta
    return meta.get("idempotency_key") if isinstance(meta, dict) else getattr(meta, "idempotency_key", None)


@server.tool
def charge_card(amount: int, ctx: Context) -> str:
    """Charge the customer's card."""
    _count("charge_card", amount=amount, idempotency_key=_idempotency_key(ctx))
    return f"charged {amount}"


@server.tool
def get_weather(city: str) -> dict:
    """The weather in a city."""
    _count("get_weather", city=city)
    return {"city": city, "temp_c": 21}


@server.tool
async def hang(seconds: int = 0) -> str:
    """Never answers."""
    _count("hang")
    await asyncio.Event().wait()
    return "unreachable"


if __name__ == "__main__":
    server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False, log_level="warning")
