"""ToolNode: the registry of a graph's tools and the executor of one tool call.

Differences from 10xGraph 0.10, on purpose:
- tools are keyed by their advertised name (``@tool(name=...)``), so a renamed tool can
  be called by the name the model was shown;
- ``execute`` returns a :class:`ToolOutcome` and never touches the state, so the node
  handler decides how parallel branches merge; ``invoke`` keeps 10xGraph's return shape;
- a tool may take ``idempotency_key``, injected by the runtime and never shown to the model.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping
from typing import Any

from tenxgraph.core.graph.mcp_tools import INSTALL_HINT, McpTools, fastmcp_installed
from tenxgraph.core.graph.tool_schema import (
    INJECTABLE_PARAMS,
    UnsupportedToolParameterError,
    function_schema,
    tool_name,
)
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import (
    ErrorBlock,
    RemoteToolCallBlock,
    ToolResultBlock,
)
# MAX_RESULT_DEPTH is read from here by callers that knew it here.
from tenxgraph.core.graph.tool_output import MAX_RESULT_DEPTH  # noqa: F401
from tenxgraph.core.graph.tool_params import _EMPTY, _Param, _plan, model_value
from tenxgraph.core.graph.tool_outcome import ToolOutcome, failure, map_result, returned
from tenxgraph.core.graph._sync_tools import SyncCall, run_sync, run_sync_raw, with_changes
from tenxgraph.core.state.tool_result import ToolResult
from tenxgraph.logs import run_logger
from tenxgraph.utils.callbacks import CallbackContext, InvocationType
from tenxgraph.utils.tool_decorator import SIDE_EFFECTS

__all__ = [
    "HAS_FASTMCP",
    "HAS_MCP",
    "ToolNode",
    "ToolOutcome",
    "ToolResult",
    "UnsupportedToolParameterError",
]

# Whether ToolNode(client=...) can work here; read when a ToolNode gets a client.
HAS_MCP = HAS_FASTMCP = fastmcp_installed()

_log = run_logger("tenxgraph.graph.tool_node")
_TOOL = InvocationType.TOOL

def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _remote_schema_name(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    function = schema.get("function")
    name = function.get("name") if isinstance(function, dict) else schema.get("name")
    return name if isinstance(name, str) and name else None


def _to_openai(schema: dict[str, Any]) -> dict[str, Any]:
    """A per-run tool in OpenAI form; a flat {name, description, parameters} is wrapped."""
    if isinstance(schema.get("function"), dict):
        return {"type": "function", "function": dict(schema["function"])}
    return {
        "type": "function",
        "function": {
            "name": schema["name"],
            "description": schema.get("description") or "No description provided.",
            "parameters": schema.get("parameters") or {"type": "object", "properties": {}},
        },
    }


def _mcp_effects(spec: str | Mapping[str, str] | None) -> tuple[str, dict[str, str]]:
    """``(default class, class by tool name)`` from ``ToolNode(mcp_side_effects=...)``."""
    if spec is None:
        return "idempotent", {}
    if isinstance(spec, str):
        default, by_name = spec, {}
    elif isinstance(spec, Mapping):
        default, by_name = "idempotent", dict(spec)
    else:
        raise ValueError(f"mcp_side_effects must be a side-effect class or a dict by tool name, got {type(spec).__name__}")
    for name, cls in [("*", default), *by_name.items()]:
        if not isinstance(name, str) or cls not in SIDE_EFFECTS:
            raise ValueError(f"mcp_side_effects: {name!r} -> {cls!r}: a class must be one of {sorted(SIDE_EFFECTS)}")
    return default, by_name


class ToolNode:
    """The tools of a graph: their schemas for the model, and their execution.

    ``client``: a ``fastmcp.Client``; its server's tools are listed with the local ones and
    called through the same replay-safe handler (see docs/mcp.md). It needs ``10xgraph[mcp]``:
    without fastmcp the constructor raises ImportError. ``pass_user_info_to_mcp``: each MCP call
    gets a ``user`` argument, the run config's ``user`` dict or ``{"user_id": ...}``.
    ``mcp_side_effects``: the ledger class of the server's tools, one class for all
    (``"at_most_once"``) or a dict by tool name (others ``"idempotent"``, 10xGraph's behaviour).
    It is configuration, not something the server says, so every process classifies a call the
    same way: an ``at_most_once`` MCP call cut off by a crash before it returned is not sent again
    on resume (the model gets a tool error), an idempotent one is. ValueError for an unknown class."""

    def __init__(
        self,
        tools: Iterable[Callable[..., Any]],
        client: Any = None,
        pass_user_info_to_mcp: bool = False,
        mcp_side_effects: str | Mapping[str, str] | None = None,
    ) -> None:
        if client is not None and not (HAS_FASTMCP and HAS_MCP):
            raise ImportError(INSTALL_HINT)
        self._mcp_effects = _mcp_effects(mcp_side_effects)
        self.pass_user_info_to_mcp = pass_user_info_to_mcp
        self._mcp = McpTools(client, pass_user_info_to_mcp) if client is not None else None
        self.remote_tools: list[dict[str, Any]] = []
        self.remote_tool_names: list[str] = []
        self._funcs: dict[str, Callable[..., Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        self._plans: dict[str, list[_Param]] = {}
        # Decided once, at registration: asked per call by the run and by _execute.
        self._sync: set[str] = set()
        for fn in tools:
            self.add_tool(fn)

    # ------------------------------------------------------------------ registry

    def add_tool(self, fn: Callable[..., Any]) -> None:
        """Register ``fn`` under its advertised name; its schema is built now, so an
        unsupported parameter fails here rather than mid-run."""
        if not callable(fn):
            raise TypeError(f"ToolNode tools must be callable, got {type(fn).__name__}")
        name = tool_name(fn)
        if name in self._funcs:
            raise ValueError(f"Duplicate tool name '{name}' in ToolNode")
        schema = function_schema(fn)
        self._plans[name] = _plan(fn)
        self._schemas[name] = schema
        self._funcs[name] = fn
        if not _is_async(fn):
            self._sync.add(name)

    def set_remote_tool(self, schemas: list[dict[str, Any]]) -> None:
        """Sets the tools the client runs (OpenAI or flat ``{name, description, parameters}``
        schemas), replacing any set before, as 10xGraph does: a call to one pauses the run after
        this node (see ``CompiledGraph.attach_remote_tools``). Checked whole before anything
        changes: a schema without a name, or with a local tool's name, raises ``ValueError``."""
        tools: list[dict[str, Any]] = []
        names: list[str] = []
        for schema in schemas:
            name = _remote_schema_name(schema)
            if name is None:
                raise ValueError(f"remote tool schema without a name: {schema!r}")
            if name in self._funcs:
                raise ValueError(f"remote tool '{name}' has the name of a local tool of this ToolNode")
            if name in names:
                raise ValueError(f"Duplicate remote tool name '{name}'")
            names.append(name)
            tools.append(_to_openai(schema))
        self.remote_tools, self.remote_tool_names = tools, names

    @property
    def tool_names(self) -> list[str]:
        """The names of the local tools, in registration order."""
        return list(self._funcs)

    @property
    def mcp_tools(self) -> list[str]:
        """The names of the MCP server's tools this ToolNode has listed so far (10xGraph's
        attribute; empty without a client, or before the first listing)."""
        return list(self._mcp.names) if self._mcp is not None else []

    def get_tool(self, name: str) -> Callable[..., Any] | None:
        """The local tool function named ``name``, or None."""
        return self._funcs.get(name)

    def takes_state(self, name: str) -> bool:
        """Whether the tool declares a ``state`` parameter (only those can change the state)."""
        return any(p.name == "state" and p.source == "supplied" for p in self._plans.get(name, ()))

    def side_effects(self, name: str) -> str:
        """``"idempotent"``, ``"at_most_once"`` or ``"pure"``: a local tool's own class, else (an
        MCP tool, or a name no tool has) the ``mcp_side_effects`` class, else idempotent."""
        fn = self._funcs.get(name)
        if fn is not None:
            return getattr(fn, "_py_tool_side_effects", None) or "idempotent"
        if self._mcp is None:
            return "idempotent"
        default, by_name = self._mcp_effects
        return by_name.get(name, default)

    def on_unknown(self, name: str) -> str:
        """What an at-most-once tool's unknown outcome becomes: ``"error"`` (a tool error message
        for the model) or ``"interrupt"`` (the run pauses for a human)."""
        return getattr(self._funcs.get(name), "_py_tool_on_unknown", None) or "error"

    def get_local_tool(self, tags: set[str] | None = None) -> list[dict[str, Any]]:
        """The OpenAI-style schemas of the local tools (deep copies: callers may edit them); with
        ``tags``, only tools with one of them (untagged tools always)."""
        tools: list[dict[str, Any]] = []
        for name, fn in self._funcs.items():
            tool_tags = getattr(fn, "_py_tool_tags", None)
            if tags and tool_tags and set(tags).isdisjoint(tool_tags):
                continue
            tools.append(copy.deepcopy(self._schemas[name]))  # callers may edit their copy
        return tools

    def all_tools_sync(
        self, tags: set[str] | None = None, config: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """:meth:`all_tools` without a loop of your own; inside a running event loop the MCP
        server is listed on a worker thread (10xGraph's ``asyncio.run`` would fail there)."""
        if self._mcp is not None:
            return _run_coroutine(self.all_tools(tags, config))
        return self._merge(self.get_local_tool(tags), config)

    def _merge(self, tools: list[dict[str, Any]], config: dict[str, Any] | None) -> list[dict[str, Any]]:
        seen = {t["function"]["name"] for t in tools}
        per_run = (config or {}).get("remote_tools") or []
        for schema in [*self.remote_tools, *per_run]:
            name = _remote_schema_name(schema)
            if name is None:
                _log.warning("ignoring a remote tool schema without a name: %r", schema)
                continue
            if name in seen:
                _log.warning("remote tool '%s' would shadow an existing tool; skipped", name)
                continue
            seen.add(name)
            tools.append(_to_openai(schema))
        return tools

    async def all_tools(
        self, tags: set[str] | None = None, config: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Local tools, then the MCP server's (with a client), then attached remote tools, then
        the run's ``config["remote_tools"]``, in OpenAI form. A server tool named like a local
        one raises ``McpToolNameClashError`` (``MCP_001``); a server that is down, or does not
        answer within the config's ``tool_timeout``, lists none."""
        if self._mcp is None:
            return self.all_tools_sync(tags, config)
        listed = await self._mcp.list_tools(tags, set(self._funcs), _listing_timeout(config))
        return self._merge(self.get_local_tool(tags) + listed, config)

    def _is_remote(self, name: str, config: dict[str, Any] | None) -> bool:
        per_run = (config or {}).get("remote_tools") or []
        names = {_remote_schema_name(s) for s in [*self.remote_tools, *per_run]}
        return name in names or name in self.remote_tool_names

    # ----------------------------------------------------------------- execution

    async def execute(
        self,
        name: str,
        args: dict[str, Any],
        tool_call_id: str,
        config: dict[str, Any],
        state: Any,
        idempotency_key: str | None = None,
        flight_key: Hashable | None = None,
        late_record: Callable[[ToolOutcome], Any] | None = None,
        callback_manager: Any = None,
        on_return: Callable[[Callable[[], ToolOutcome]], None] | None = None,
    ) -> ToolOutcome:
        """Run one call. Tool failures become error messages; BaseExceptions that are not
        Exceptions (cancellation, GraphInterrupt) propagate.

        A sync tool runs in a thread of its own, which no deadline can stop. With a
        ``flight_key`` (see tenxgraph._sync_calls) a call already running under that key is
        waited for instead of started again, and a result that arrives after every attempt
        stopped waiting goes to ``late_record`` (on the worker thread). ``on_return`` is called
        the moment the tool returns, with a function that makes the tool's own outcome: the side
        effect happened, so a caller cut off after that (a cancel or a Ctrl-C while callbacks
        run or the value is turned into its message) can still record it."""
        outcome, _ = await self._execute(
            name, args, tool_call_id, config, state, idempotency_key, flight_key, late_record, callback_manager,
            on_return=on_return,
        )
        return outcome

    def is_sync(self, name: str) -> bool:
        """Whether the tool is a plain function (run in a thread, which cannot be cancelled)."""
        return name in self._sync

    async def invoke(
        self,
        name: str,
        args: dict[str, Any],
        tool_call_id: str,
        config: dict[str, Any],
        state: Any,
        callback_manager: Any = None,
    ) -> dict[str, Any] | Message:
        """10xGraph's shape: the Message, or ``{"state", "messages"}`` for a ToolResult,
        whose state keys the state has are set on it. ``callback_manager``: its TOOL callbacks
        wrap the call (10xGraph injects the graph's; outside a graph pass one or none)."""
        return await self._invoke(name, args, tool_call_id, config, state, callback_manager, None)

    async def stream(
        self,
        name: str,
        args: dict[str, Any],
        tool_call_id: str,
        config: dict[str, Any],
        state: Any,
        emit: Any = None,
        callback_manager: Any = None,
    ) -> AsyncIterator[dict[str, Any] | Message]:
        """10xGraph's streaming form of :meth:`invoke`: an async iterator that yields the one
        result ``invoke`` returns (tools return whole results). ``emit`` is handed to a tool that
        takes an ``emit`` parameter. Like ``invoke`` it runs the tool directly: no ledger; inside
        a graph the runtime's tool handler runs tools, with the ledger."""
        yield await self._invoke(name, args, tool_call_id, config, state, callback_manager, emit)

    async def _invoke(
        self,
        name: str,
        args: dict[str, Any],
        tool_call_id: str,
        config: dict[str, Any],
        state: Any,
        callback_manager: Any,
        emit: Any,
    ) -> dict[str, Any] | Message:
        outcome, from_tool_result = await self._execute(
            name, args, tool_call_id, config, state, None, callback_manager=callback_manager, emit=emit
        )
        if not from_tool_result:
            return outcome.message
        for key, value in (outcome.state_update or {}).items():
            if hasattr(state, key):
                setattr(state, key, value)
        return {"state": state, "messages": outcome.message}

    async def _execute(
        self,
        name: str,
        args: dict[str, Any],
        tool_call_id: str,
        config: dict[str, Any],
        state: Any,
        idempotency_key: str | None,
        flight_key: Hashable | None = None,
        late_record: Callable[[ToolOutcome], Any] | None = None,
        callback_manager: Any = None,
        emit: Any = None,
        on_return: Callable[[Callable[[], ToolOutcome]], None] | None = None,
    ) -> tuple[ToolOutcome, bool]:
        meta = {"function_name": name, "function_argument": args, "tool_call_id": tool_call_id}
        fn = self._funcs.get(name)
        if fn is None:
            if self._is_remote(name, config):
                # The client runs it; the graph pauses. A placeholder must not be recorded.
                placeholder = Message(
                    role="tool",
                    content=[RemoteToolCallBlock(id=tool_call_id, name=name, args=args or {})],
                    metadata={"is_remote": True},
                )
                return ToolOutcome(placeholder, None, recordable=False), False
            if self._mcp is not None and await self._mcp.knows(name, set(self._funcs), _listing_timeout(config)):
                # The result is what any tool's is: the handler records it in the ledger.
                result = await self._mcp.call(name, args or {}, tool_call_id, config or {}, idempotency_key,
                                              callback_manager, on_return)
                return map_result(result, tool_call_id, meta)
            text = f"Tool '{name}' not found."
            missing = Message.tool_message(
                [
                    ErrorBlock(message=text),
                    ToolResultBlock(
                        call_id=tool_call_id, output=text, is_error=True, status="failed"
                    ),
                ],
                meta=meta,
            )
            return ToolOutcome(missing), False
        injected = {
            "tool_call_id": tool_call_id,
            "state": state,
            "config": config,
            # A caller's own emit (ToolNode.stream), else the run's stream emitter (None under invoke).
            "emit": emit if emit is not None else _stream_emitter(config, name, tool_call_id),
            "idempotency_key": idempotency_key,
        }
        if callback_manager is not None and callback_manager.wraps(_TOOL):
            return await self._execute_with_callbacks(
                callback_manager, fn, name, args, injected, meta, flight_key, late_record, on_return
            )
        try:
            call_args, call_kwargs = self._bind(name, args or {}, injected)
            if name in self._sync:
                return await run_sync(SyncCall(fn, call_args, call_kwargs, name, tool_call_id, meta, flight_key,
                                               late_record), on_return)
            result = await fn(*call_args, **call_kwargs)
            returned(on_return, result, tool_call_id, meta)
            return map_result(result, tool_call_id, meta)
        except Exception as exc:  # noqa: BLE001 - a tool error goes back to the model
            return failure(name, tool_call_id, meta, exc), False

    async def _execute_with_callbacks(
        self,
        mgr: Any,
        fn: Callable[..., Any],
        name: str,
        args: dict[str, Any],
        injected: dict[str, Any],
        meta: dict[str, Any],
        flight_key: Hashable | None,
        late_record: Callable[[ToolOutcome], Any] | None,
        on_return: Callable[[Callable[[], ToolOutcome]], None] | None = None,
    ) -> tuple[ToolOutcome, bool]:
        """10xGraph's TOOL callbacks around one call: before_invoke sees (and may change) the
        tool's keyword arguments, injected ones included; after_invoke the tool's raw return
        value; on_error any failure, and a Message it returns is the call's result."""
        tool_call_id = injected["tool_call_id"]
        context = CallbackContext(
            invocation_type=_TOOL,
            node_name="ToolNode",
            function_name=name,
            metadata={"tool_call_id": tool_call_id, "args": args, "config": injected["config"]},
        )
        # Until the arguments bind, the model's raw arguments are what an error callback gets.
        input_data: dict[str, Any] = dict(args or {})
        measured: dict[str, Any] = {}  # a sync tool's changes in place (run_sync_raw)
        try:
            positional, input_data = self._bind(name, args or {}, injected)
            input_data = await mgr.execute_before_invoke(context, input_data)
            if name not in self._sync:
                raw = await fn(*positional, **input_data)
            else:
                raw = await run_sync_raw(SyncCall(fn, positional, input_data, name, tool_call_id, meta,
                                                  flight_key, late_record, measured))
            # Cut off from here on, the call is recorded as the tool returned it (no after_invoke
            # ran to completion for it).
            returned(on_return, raw, tool_call_id, meta)
            raw = await mgr.execute_after_invoke(context, input_data, raw)
            outcome, ok = map_result(raw, tool_call_id, meta)
            return with_changes(outcome, measured.get("changes")), ok
        except Exception as exc:  # noqa: BLE001 - a tool error goes back to the model
            recovery = await mgr.execute_on_error(context, input_data, exc)
            if isinstance(recovery, Message):
                outcome, ok = map_result(recovery, tool_call_id, meta)
                return with_changes(outcome, measured.get("changes")), ok
            return with_changes(failure(name, tool_call_id, meta, exc), measured.get("changes")), False

    def _bind(
        self, name: str, args: dict[str, Any], injected: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        used: set[str] = set()
        var_keyword = False
        for p in self._plans[name]:
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                var_keyword = True
                continue
            if p.source == "supplied":
                value = injected[p.name]
            elif p.source == "skipped":
                if p.default is _EMPTY:
                    raise TypeError(
                        f"tool '{name}' requires '{p.name}', which this runtime does not "
                        "inject; give it a default"
                    )
                value = p.default
            elif p.name in args:
                used.add(p.name)
                raw = args[p.name]
                value = model_value(p, raw, name)
            elif p.default is _EMPTY:
                raise TypeError(f"Missing required parameter '{p.name}' for function '{name}'")  # 10xGraph's text
            else:
                continue  # let Python apply the default
            if p.kind is inspect.Parameter.POSITIONAL_ONLY:
                positional.append(value)
            else:
                keywords[p.name] = value
        extra = {k: v for k, v in args.items() if k not in used}
        # The model never sees the injectable names, so it may not set them either.
        if var_keyword:
            extra_ok = {k: v for k, v in extra.items() if k not in INJECTABLE_PARAMS}
            keywords.update(extra_ok)
            extra = {k: v for k, v in extra.items() if k in INJECTABLE_PARAMS}
        if extra:
            _log.warning("tool '%s': ignoring unexpected arguments %s", name, sorted(extra))
        return positional, keywords

def _listing_timeout(config: dict[str, Any] | None) -> float | None:
    """A listing of the MCP server is bounded like a tool call: by the run's ``tool_timeout``."""
    from tenxgraph.core.graph.compiled_graph import resolve_timeout
    from tenxgraph.utils.constants import DEFAULT_TOOL_TIMEOUT_SECONDS

    return resolve_timeout(dict(config or {}), "tool_timeout", DEFAULT_TOOL_TIMEOUT_SECONDS)


def _run_coroutine(coro: Any) -> Any:
    """``asyncio.run(coro)``, on a worker thread when this thread already runs a loop."""
    from tenxgraph._sync import run_sync

    return run_sync(coro)


def _stream_emitter(config: dict[str, Any] | None, tool: str, tool_call_id: str) -> Any:
    """The tool's ``emit``: a StreamEmitter on a streamed run, None under invoke."""
    stream = (config or {}).get("_tenx_stream")
    if stream is None:
        return None
    from tenxgraph.core.state.stream_emitter import StreamEmitter

    queue, loop = stream
    return StreamEmitter(tool_name=tool, tool_call_id=str(tool_call_id), node_name=str(config.get("_node_name", "")),
                         thread_id=config.get("thread_id"), run_id=config.get("run_id"), queue=queue, loop=loop)
