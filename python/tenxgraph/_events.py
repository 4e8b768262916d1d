"""The events of one run, built at the points 10xGraph publishes them and handed to the graph's
publisher outbox (never awaited here: see tenxgraph.runtime.publisher.publish).

A run without a publisher has no ``RunEvents`` at all, so the points cost one ``None`` check.
Each event is a new object that is never changed after it is queued (10xGraph mutated and
re-published one object, so a publisher could see a later phase than the one published).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tenxgraph.runtime.publisher.events import ContentType, Event, EventModel, EventType
from tenxgraph.runtime.publisher.publish import EventOutbox
from tenxgraph.utils.constants import START

if TYPE_CHECKING:
    from tenxgraph.core.state.agent_state import AgentState
    from tenxgraph.core.state.message import Message

__all__ = ["RunEvents"]


def _dump(m: Message) -> dict[str, Any]:
    return m.model_dump(mode="json")


class RunEvents:
    def __init__(self, outbox: EventOutbox, loop: asyncio.AbstractEventLoop, config: dict[str, Any]) -> None:
        self.outbox = outbox
        self.loop = loop
        self.config = config
        self._tools_ended: set[tuple[str, int]] = set()

    def _send(self, event: Event, phase: EventType, node: str, content: list[ContentType],
              data: dict[str, Any] | None = None, is_error: bool = False, **extra: Any) -> None:
        ev = EventModel.default(self.config, data or {}, content, event, phase, node, extra or None)
        ev.is_error = is_error
        self.outbox.submit(ev, self.loop)

    # -- graph ------------------------------------------------------------------------------

    def graph_start(self) -> None:
        self._send(Event.GRAPH_EXECUTION, EventType.START, START, [ContentType.STATE],
                   status="Graph execution started")

    def start_node_ran(self, step: int) -> None:
        """A run from the entry point: 10xGraph ran START as an identity node, and said so."""
        self._send(Event.NODE_EXECUTION, EventType.START, START, [ContentType.STATE], {"step": step})
        self._send(Event.NODE_EXECUTION, EventType.END, START, [ContentType.MESSAGE],
                   {"step": step, "messages": []}, status="Function execution completed")

    def progress(self, node: str, step: int) -> None:
        self._send(Event.GRAPH_EXECUTION, EventType.PROGRESS, START, [ContentType.STATE],
                   current_node=node, step=step)

    def graph_end(self, state: AgentState | None, messages: list[Message], outcome: dict[str, Any]) -> None:
        exec_meta = outcome.get("exec", {})
        status = exec_meta.get("status")
        data = {"state": state.model_dump(mode="json") if state is not None else None,
                "messages": [_dump(m) for m in messages]}
        common = {"current_node": exec_meta.get("current_node"), "step": exec_meta.get("step")}
        if outcome.get("stopped") or status in ("interrupted_before", "interrupted_after"):
            reason = exec_meta.get("interrupt_reason")
            self._send(Event.GRAPH_EXECUTION, EventType.INTERRUPTED, START, [ContentType.STATE, ContentType.MESSAGE],
                       {**data, "interrupted": status, "interrupt": _pause_data(exec_meta.get("interrupt_data"))},
                       interrupt_reason=reason, interrupted_node=exec_meta.get("interrupted_node"),
                       status=f"Graph execution interrupted ({reason})", **common)
        self._send(Event.GRAPH_EXECUTION, EventType.END, START, [ContentType.STATE, ContentType.MESSAGE], data,
                   status="Graph execution completed", **common)

    def graph_error(self, state: AgentState | None, exc: BaseException) -> None:
        code = getattr(exc, "error_code", None)
        text = f"[{code}] {exc}" if code else str(exc)
        em = state.execution_meta if state is not None else None
        self._send(Event.GRAPH_EXECUTION, EventType.ERROR, START, [ContentType.ERROR, ContentType.STATE],
                   {"error": text, "state": state.model_dump(mode="json") if state is not None else None},
                   is_error=True, error_code=code, status=f"Graph execution failed: {text}",
                   current_node=em.current_node if em else None, step=em.step if em else None)

    # -- nodes ------------------------------------------------------------------------------

    def node_start(self, node: str, step: int) -> None:
        self.progress(node, step)
        self._send(Event.NODE_EXECUTION, EventType.START, node, [ContentType.STATE], {"step": step})

    def node_end(self, node: str, step: int, messages: list[Message], goto: str | None) -> None:
        self._send(Event.NODE_EXECUTION, EventType.END, node, [ContentType.MESSAGE],
                   {"step": step, "messages": [_dump(m) for m in messages], "next_node": goto},
                   status="Function execution completed")

    def node_error(self, node: str, step: int, exc: BaseException) -> None:
        text = str(exc) or type(exc).__name__
        self._send(Event.NODE_EXECUTION, EventType.ERROR, node, [ContentType.ERROR, ContentType.STATE],
                   {"step": step, "error": text}, is_error=True, error_type=type(exc).__name__,
                   status=f"Function execution failed: {text}")

    # -- tool calls -------------------------------------------------------------------------

    def tool_start(self, node: str, index: int, call_id: str | None, name: str, args: Any, from_ledger: bool) -> None:
        self._send(Event.TOOL_EXECUTION, EventType.START, name, [ContentType.TOOL_CALL],
                   {"tool_call_id": call_id, "function_name": name, "args": args},
                   is_mcp=False, tool_node=node, call_index=index, from_ledger=from_ledger)

    def tool_end(self, node: str, index: int, call_id: str | None, name: str, args: Any, message: Message | None,
                 from_ledger: bool, error: str | None = None) -> None:
        key = (node, index)
        if key in self._tools_ended:
            return
        self._tools_ended.add(key)
        data: dict[str, Any] = {"tool_call_id": call_id, "function_name": name, "args": args}
        if message is not None:
            data["message"] = _dump(message)
        content = [ContentType.TOOL_RESULT, ContentType.MESSAGE]
        if error is not None:
            data["error"] = error
            content = [ContentType.TOOL_RESULT, ContentType.ERROR]
        self._send(Event.TOOL_EXECUTION, EventType.END, name, content, data, is_error=error is not None,
                   is_mcp=False, tool_node=node, call_index=index, from_ledger=from_ledger)

    def tools_begun(self, node: str) -> None:
        """A new tool-node execution: its calls' end events are its own."""
        self._tools_ended = {k for k in self._tools_ended if k[0] != node}


def _pause_data(data: Any) -> Any:
    """What a pause carries for its consumer: ``interrupt_data`` without the routing the core
    keeps there (a handoff's goto beside a client's tool call, see ``ROUTING_GOTO_KEY``), which
    is the loop's, not a question's."""
    if isinstance(data, dict) and "goto" in data:
        data = {k: v for k, v in data.items() if k != "goto"} or None
    return data
