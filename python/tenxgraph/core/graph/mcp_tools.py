"""The tools of an MCP server behind a ToolNode (``ToolNode(tools, client=fastmcp.Client(...))``).

The ToolNode lists the server's tools into the schema the model sees and sends a call to the
server. It never decides whether a call runs: the runtime's tool handler does, with the ledger,
exactly as for a local tool. So an MCP call that returned is answered from the ledger on replay
and never sent to the server again, and ``tool_timeout`` cancels a server that never answers.

Differences from 10xGraph 0.10, on purpose (see docs/mcp.md):
- no ``ping()`` before each listing and call: fastmcp 3+ servers answer it with "Method not
  found", and a server that is down fails the call itself with the same readable tool error;
- a call to an MCP tool this process has not listed yet (a resume in a fresh process goes
  straight to the tool node) lists the server's tools first instead of answering "not found";
- a server tool with the name of one of the ToolNode's own tools is an error (``MCP_001``), not
  a duplicate schema the provider would refuse;
- the call's idempotency key goes to the server in the request's ``_meta``
  (``idempotency_key``), so a server can recognise a call it has already done.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Callable
from typing import Any

from tenxgraph.core.exceptions import GraphError
from tenxgraph.core.graph.tool_outcome import ToolOutcome, returned
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import ErrorBlock, ToolResultBlock
from tenxgraph.logs import run_logger
from tenxgraph.utils.callbacks import CallbackContext, InvocationType

__all__ = ["McpToolNameClashError", "fastmcp_installed"]

_log = run_logger("tenxgraph.graph.tool_node")
_MCP = InvocationType.MCP
INSTALL_HINT = "MCP client functionality requires 'fastmcp' and 'mcp' packages. Install with: pip install 10xgraph[mcp]"


def fastmcp_installed() -> bool:
    """Whether ``fastmcp`` and ``mcp`` can be imported (checked without importing them, so
    ``import tenxgraph`` stays light)."""
    return all(importlib.util.find_spec(name) is not None for name in ("fastmcp", "mcp"))


class McpToolNameClashError(GraphError):
    """The MCP server lists a tool with the name of one of the ToolNode's own tools (code
    ``MCP_001``). Raised when the tools are listed for the model, before any request: two tools
    of one name would make the provider refuse the request, or run the wrong one."""

    default_code = "MCP_001"

    def __init__(self, message: str, error_code: str = "MCP_001", context: dict[str, Any] | None = None) -> None:
        super().__init__(message, error_code, context)


def _input_schema(tool: Any) -> Any:
    # fastmcp 2 (mcp 1.x) names it inputSchema, fastmcp 3+ (mcp 2.x) input_schema.
    schema = getattr(tool, "input_schema", None)
    if schema is None:
        schema = getattr(tool, "inputSchema", None)
    return schema if isinstance(schema, dict) else {"type": "object", "properties": {}}


def _tags(tool: Any) -> set[str]:
    meta = getattr(tool, "meta", None) or {}
    inner = meta.get("_fastmcp") or meta.get("fastmcp") or {}
    tags = inner.get("tags") if isinstance(inner, dict) else None
    return set(tags or ())


def _normalise_resource(dumped: Any) -> Any:
    if isinstance(dumped, dict) and dumped.get("type") == "resource":
        resource = dumped.get("resource")
        if isinstance(resource, dict) and "uri" in resource:
            resource["uri"] = str(resource["uri"])
    return dumped


def _item(obj: Any) -> dict[str, Any]:
    """One part of an MCP result as 10xGraph shows it: JSON data as it is (a non-dict wrapped as
    ``{"content": ...}``), a content block as its fields, anything else as its text."""
    try:
        json.dumps(obj)
        return obj if isinstance(obj, dict) else {"content": obj}
    except (TypeError, ValueError, OverflowError):
        pass
    if hasattr(obj, "model_dump"):
        try:
            return _normalise_resource(obj.model_dump(mode="json"))
        except Exception:  # noqa: BLE001 - its text form is still an answer
            pass
    return {"content": str(obj), "type": "fallback"}


def result_output(result: Any) -> list[dict[str, Any]]:
    """The ToolResultBlock output of a ``CallToolResult``: its content blocks, else its structured
    content, else its data, each part as :func:`_item` makes it (10xGraph's order and shapes)."""
    for source in (getattr(result, "content", None), getattr(result, "structured_content", None),
                   getattr(result, "data", None)):
        if source is None:
            continue
        return [_item(x) for x in source] if isinstance(source, list) else [_item(source)]
    return [{"content": str(result), "type": "fallback"}]


def _error_message(text: str, tool_call_id: str, meta: dict[str, Any]) -> Message:
    return Message.tool_message(
        [ToolResultBlock(call_id=tool_call_id, output=text, is_error=True, status="failed"), ErrorBlock(message=text)],
        meta=meta,
    )


class McpTools:
    """One ToolNode's MCP client: the names its server listed, listing and calling."""

    def __init__(self, client: Any, pass_user_info: bool) -> None:
        self.client = client
        self.pass_user_info = pass_user_info
        self.names: list[str] = []  # every name the server listed, in order, once each

    async def _fetch(self, timeout: float | None) -> list[Any]:
        async def listing() -> list[Any]:
            async with self.client:
                return list(await self.client.list_tools())

        return await asyncio.wait_for(listing(), timeout)

    async def list_tools(self, tags: set[str] | None, local_names: set[str],
                         timeout: float | None = None) -> list[dict[str, Any]]:
        """The server's tools in OpenAI form (those with one of ``tags``, when given). A server
        that cannot be reached, or does not answer within ``timeout`` seconds, gives none
        (logged), as in 10xGraph: the model then sees only the local tools. A name clash with a
        local tool raises :class:`McpToolNameClashError`."""
        try:
            listed = await self._fetch(timeout)
        except Exception as exc:  # noqa: BLE001 - a server that is down must not fail the model turn
            _log.warning("could not list the MCP server's tools: %r", exc, extra={"event": "mcp_list_failed"})
            return []
        clashes = sorted({t.name for t in listed} & local_names)
        if clashes:
            raise McpToolNameClashError(
                f"the MCP server has tools named like tools of this ToolNode: {clashes}; rename one of them",
                context={"tools": clashes},
            )
        tools: list[dict[str, Any]] = []
        for tool in listed:
            if tool.name not in self.names:
                self.names.append(tool.name)
            if tags and not (_tags(tool) & set(tags)):
                continue
            tools.append({"type": "function", "function": {
                "name": tool.name, "description": tool.description, "parameters": _input_schema(tool)}})
        return tools

    async def knows(self, name: str, local_names: set[str], timeout: float | None = None) -> bool:
        """Whether ``name`` is one of the server's tools; a name not listed yet in this process
        makes it list them. When the server cannot be listed the call is tried anyway, so the
        model gets the server's own error rather than "not found"."""
        if name in self.names:
            return True
        try:
            listed = await self._fetch(timeout)
        except Exception:  # noqa: BLE001 - the call itself reports the outage
            return True
        for tool in listed:
            if tool.name not in self.names and tool.name not in local_names:
                self.names.append(tool.name)
        return name in self.names

    async def call(self, name: str, args: dict[str, Any], tool_call_id: str, config: dict[str, Any],
                   idempotency_key: str | None, callback_manager: Any,
                   on_return: Callable[[Callable[[], ToolOutcome]], None] | None = None) -> Any:
        """Send one call to the server; its result, or a tool error the model can read (server
        down, the tool failed, bad arguments). 10xGraph's MCP callbacks wrap it: before_invoke
        sees (and may change) the arguments, after_invoke the result Message, on_error the
        exception, and a Message on_error returns is the result. Returns the Message (or what an
        after_invoke callback made of it)."""
        meta = {"function_name": name, "function_argument": args, "tool_call_id": tool_call_id}
        mgr = callback_manager if callback_manager is not None and callback_manager.wraps(_MCP) else None
        context = CallbackContext(
            invocation_type=_MCP, node_name="ToolNode", function_name=name,
            metadata={"tool_call_id": tool_call_id, "args": args, "config": config, "mcp_client": True},
        )
        input_data: dict[str, Any] = dict(args)
        try:
            if mgr is not None:
                input_data = await mgr.execute_before_invoke(context, input_data)
            sent = dict(input_data)
            if self.pass_user_info:
                user = config.get("user")
                if isinstance(user, dict) and user:
                    sent["user"] = user
                elif config.get("user_id"):
                    sent["user"] = {"user_id": config["user_id"]}
            request_meta = {"idempotency_key": idempotency_key} if idempotency_key else None
            async with self.client:
                raw = await self.client.call_tool(name, sent, meta=request_meta)
                result = Message.tool_message(
                    [ToolResultBlock(call_id=tool_call_id, output=result_output(raw), is_error=False,
                                     status="completed")],
                    meta=meta,
                )
                # The server ran the call: from here a run cut off (the client's exit, an
                # after_invoke callback, node_timeout, stop()) records it as returned, and a
                # replay never sends it again (red-team, session 35: it was sent twice).
                returned(on_return, result, tool_call_id, meta)
            if mgr is not None:
                result = await mgr.execute_after_invoke(context, input_data, result)
            return result
        except Exception as exc:  # noqa: BLE001 - a failed MCP call goes back to the model
            if mgr is not None:
                recovery = await mgr.execute_on_error(context, input_data, exc)
                if isinstance(recovery, Message):
                    return recovery
            _log.warning("MCP tool '%s' (call %s) failed: %r", name, tool_call_id, exc, extra={"tool": name})
            return _error_message(f"MCP execution error: {exc}", tool_call_id, meta)
