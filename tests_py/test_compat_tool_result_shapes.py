"""What a ToolNode makes of a tool's plain return value (what the model reads through
``Message.text()``, and ``ToolResultBlock.is_error`` / ``status``), run on 10xGraph 0.10.0 and on
tenxgraph. A differential fuzzer found every non-string shape different (session 19): dicts were
kept bare, ``{"success": False}`` was a success, lists were not wrapped, None was ""."""

from __future__ import annotations

SCRIPT = """
import dataclasses
from tenxgraph import END, AgentState, Message, StateGraph, ToolNode
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

@dataclasses.dataclass
class Point:
    x: int = 2
    status: str = "failed"

VALUES = {
    "str": "plain", "int": 7, "none": None, "tuple": (1, 2), "empty_list": [],
    "dict": {"n": 1}, "dict_success_false": {"success": False, "v": 1},
    "dict_success_ok": {"success": "ok", "v": 1}, "dict_status_failed": {"status": "failed", "v": 1},
    "dict_is_error_yes": {"is_error": "yes"}, "dict_error_word": {"error": "error", "v": 2},
    "dict_error_text": {"error": "not found"}, "list_mixed": ["a", {"k": 1}, 3], "dataclass": Point(),
}
cp = InMemoryCheckpointer()
out = {}
for key, val in VALUES.items():
    def tool(v=val):
        "returns a value"
        return v
    tool.__name__ = "t_" + key

    def agent(state, name=tool.__name__):
        if state.context[-1].role == "tool":
            return Message.text_message("done", role="assistant")
        m = Message.text_message("call", role="assistant")
        m.tools_calls = [{"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}]
        return m

    g = StateGraph(AgentState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([tool]))
    g.set_entry_point("agent")
    g.add_conditional_edges("agent", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "agent")
    r = g.compile(checkpointer=cp).invoke({"messages": [Message.text_message("hi")]}, config={"thread_id": key})
    tm = [m for m in r["messages"] if m.role == "tool"][0]
    b = tm.content[0]
    out[key] = {"output": b.output, "is_error": b.is_error, "status": b.status}
emit(out)
"""

# 10xGraph deletes these keys from the dict it hands the model; tenxgraph keeps them (the one
# deliberate difference: {"error": "not found"} reached the model as {}).
_VERDICT_KEYS = ("status", "is_error", "error", "success")


def test_plain_tool_results_are_shaped_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(SCRIPT)
    # 10xGraph 0.10.0 as observed, so the comparison below cannot pass on two wrong sides.
    assert theirs["dict"]["output"] == [{"n": 1}] and theirs["none"]["output"] == "None"
    assert theirs["dict_success_false"] == {"output": [{"v": 1}], "is_error": True, "status": "failed"}
    assert theirs["list_mixed"]["output"] == [{"content": "a"}, {"k": 1}, {"content": 3}]
    assert theirs["dict_error_text"]["output"] == [{}]
    for key, mine in ours.items():
        ref = theirs[key]
        assert (mine["is_error"], mine["status"]) == (ref["is_error"], ref["status"]), (key, ref, mine)
        out = mine["output"]
        if isinstance(out, list) and len(out) == 1 and isinstance(out[0], dict) and set(out[0]) & set(_VERDICT_KEYS):
            out = [{k: v for k, v in out[0].items() if k not in _VERDICT_KEYS}]
        assert out == ref["output"], (key, ref, mine)
    assert ours["dict_error_text"]["output"] == [{"error": "not found"}]  # what the model can read


RAISES = """
from tenxgraph import END, AgentState, Message, StateGraph, ToolNode

def boom(text: str) -> str:
    "raises"
    raise RuntimeError("boom " + text)

def agent(state):
    if state.context[-1].role == "tool":
        return Message.text_message("done", role="assistant")
    m = Message.text_message("call", role="assistant")
    m.tools_calls = [{"id": "c1", "type": "function", "function": {"name": "boom", "arguments": '{"text": "x"}'}},
                     {"id": "c2", "type": "function", "function": {"name": "boom", "arguments": '{}'}}]
    return m

g = StateGraph(AgentState)
g.add_node("agent", agent)
g.add_node("tools", ToolNode([boom]))
g.set_entry_point("agent")
g.add_conditional_edges("agent", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
g.add_edge("tools", "agent")
r = g.compile().invoke({"messages": [Message.text_message("hi")]}, config={"thread_id": "e"})
emit([[b.model_dump(mode="json", exclude={"call_id"}) for b in m.content] for m in r["messages"] if m.role == "tool"])
"""


def test_a_raising_tool_answers_the_model_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(RAISES)
    assert theirs[0][1] == {"type": "error", "message": "Internal execution error: boom x", "code": None,
                            "data": None}, theirs
    assert len(ours) == len(theirs) == 2
    for mine, ref in zip(ours, theirs, strict=True):
        assert mine[0] == ref[0]  # the result block: the text the model reads
        # The error block's text too; its code (the exception's class) is tenxgraph's addition.
        assert {**mine[1], "code": None} == ref[1] and mine[1]["code"] in ("RuntimeError", "TypeError")
