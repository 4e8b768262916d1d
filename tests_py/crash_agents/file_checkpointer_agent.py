"""A user's own checkpointer written in Python, keeping each thread in JSON files, and the crash
kit's target that runs a charging agent on it (``build``). ``PYCP_DIR``: the files' directory;
``PYCP_EFFECTS``: where the tool appends one line per real charge."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.graph import ToolNode
from tenxgraph.core.state import ToolCallBlock
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo


def _write(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class FileCheckpointer(BaseCheckpointer[AgentState]):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _file(self, kind: str, config: dict[str, Any]) -> Path:
        return self.root / f"{kind}-{config['thread_id']}.json"

    async def asetup(self) -> bool:
        return True

    async def aput_state(self, config: dict[str, Any], state: AgentState) -> AgentState:
        _write(self._file("state", config), state.model_dump(mode="json"))
        return state

    async def aget_state(self, config: dict[str, Any]) -> AgentState | None:
        path = self._file("state", config)
        return self.state_type.model_validate_json(path.read_text()) if path.exists() else None

    async def aclear_state(self, config: dict[str, Any]) -> bool:
        self._file("state", config).unlink(missing_ok=True)
        return True

    async def aput_state_cache(self, config: dict[str, Any], state: AgentState) -> None:
        return None

    async def aget_state_cache(self, config: dict[str, Any]) -> AgentState | None:
        return None

    async def aput_messages(self, config: dict[str, Any], messages: list[Message], metadata: Any = None) -> None:
        return None  # the messages live in the state file (aput_state writes the whole context)

    async def aget_message(self, config: dict[str, Any], message_id: str | int) -> Message:
        state = await self.aget_state(config)
        for m in state.context if state else []:
            if m.message_id == message_id:
                return m
        raise IndexError(message_id)

    async def alist_messages(self, config: dict[str, Any], search: Any = None, offset: Any = None,
                             limit: Any = None) -> list[Message]:
        state = await self.aget_state(config)
        return list(state.context) if state else []

    async def adelete_message(self, config: dict[str, Any], message_id: str | int) -> None:
        return None

    async def aput_thread(self, config: dict[str, Any], thread_info: ThreadInfo) -> None:
        return None

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        return None

    async def alist_threads(self, config: dict[str, Any], search: Any = None, offset: Any = None,
                            limit: Any = None) -> list[ThreadInfo]:
        return []

    async def aclean_thread(self, config: dict[str, Any]) -> None:
        for kind in ("state", "ledger"):
            self._file(kind, config).unlink(missing_ok=True)

    async def arelease(self) -> None:
        return None

    # the tool ledger: required for a graph to run on this checkpointer
    def _ledger(self, config: dict[str, Any]) -> dict[str, Any]:
        path = self._file("ledger", config)
        return json.loads(path.read_text()) if path.exists() else {}

    async def aget_tool_result(self, config: dict[str, Any], tool_call_id: str) -> dict[str, Any] | None:
        return self._ledger(config).get(tool_call_id)

    async def aput_tool_result(self, config: dict[str, Any], tool_call_id: str, result: dict[str, Any]) -> bool:
        ledger = self._ledger(config)
        if tool_call_id in ledger:
            return False  # the first result recorded wins
        ledger[tool_call_id] = result
        _write(self._file("ledger", config), ledger)
        return True


def charge(amount: int) -> str:
    """Charge the customer's card."""
    with open(os.environ["PYCP_EFFECTS"], "a") as f:
        f.write(f"charge {amount}\n")
        f.flush()
        os.fsync(f.fileno())
    return f"charged {amount}"


def _model(state: AgentState) -> list[Message]:
    if state.context[-1].role == "tool":
        return [Message.text_message("done: " + state.context[-1].text(), role="assistant")]
    args = '{"amount": 42}'
    return [Message(role="assistant", content=[ToolCallBlock(id="call_1", name="charge", args={"amount": 42})],
                    tools_calls=[{"id": "call_1", "type": "function", "function": {"name": "charge", "arguments": args}}])]


def build_graph(cp: BaseCheckpointer[Any]) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", _model)
    g.add_node("tools", ToolNode([charge]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


def build(_checkpointer_the_kit_opened: Any) -> Any:
    """The crash kit's target: the graph on a FileCheckpointer in ``PYCP_DIR``."""
    return build_graph(FileCheckpointer(os.environ["PYCP_DIR"]))
