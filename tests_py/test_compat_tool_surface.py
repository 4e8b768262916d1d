"""ToolNode's remaining public surface (issue 14 item 7): ``ToolNode.stream``, the ``tool_node``
package's names, ``tenxgraph.utils.decorators`` and ``@tool(parameters=...)`` checking, compared
with 10xGraph 0.10.0 where it behaves deterministically."""

from __future__ import annotations

import asyncio

import pytest

from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import CallbackManager, InvocationType, tool

DECORATORS = """
from tenxgraph.utils import tool, get_tool_metadata, has_tool_decorator
import tenxgraph.utils.decorators as d

def norm(m):
    # only 10xGraph's keys: tenxgraph adds side_effects / on_unknown
    keys = ["name", "description", "tags", "provider", "capabilities", "metadata", "parameters"]
    return {k: (sorted(m[k]) if isinstance(m[k], set) else m[k]) for k in keys}

def plain(x: int) -> int:
    '''Plain doc.'''
    return x

@tool
def bare(x: int) -> int:
    '''Bare doc.'''
    return x

@tool(name="n", description="desc", tags=["a", "b"], provider="p", capabilities=["c"], metadata={"k": 1},
      parameters={"type": "object", "properties": {"x": {"type": "integer"}}})
def full(x: int) -> int:
    return x

@d.tool
def nodoc(x: int):
    return x

out = {f.__name__: [has_tool_decorator(f), d.has_tool_decorator(f), norm(d.get_tool_metadata(f))]
       for f in (plain, bare, full, nodoc)}
out["same_functions"] = [d.tool is tool, d.get_tool_metadata is get_tool_metadata]
for bad in ("a schema", ["x"], 3):
    try:
        tool(parameters=bad)(plain)
        out[f"parameters={bad!r}"] = "accepted"
    except ValueError as e:
        out[f"parameters={bad!r}"] = str(e)
try:
    tool(42)
    out["not callable"] = "accepted"
except ValueError as e:
    out["not callable"] = "ValueError"
emit(out)
"""


def test_decorators_module_and_tool_metadata_match_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(DECORATORS)
    assert ours == theirs
    assert ours["plain"] == [False, False, {"name": None, "description": None, "tags": [], "provider": None,
                                            "capabilities": None, "metadata": None, "parameters": None}]
    assert ours["nodoc"][2]["description"] == "No description provided."
    assert ours["parameters='a schema'"] == "@tool(parameters=...) must be a JSON Schema dict, got <class 'str'>"


def test_a_single_string_tag_is_one_tag() -> None:
    """A difference on purpose: 10xGraph turns ``tags="math"`` into {"m", "a", "t", "h"}."""
    from tenxgraph.utils.decorators import get_tool_metadata

    @tool(tags="math")
    def f() -> None: ...

    assert get_tool_metadata(f)["tags"] == {"math"}


def test_a_bad_parameters_schema_is_refused_when_decorating_not_when_the_model_calls() -> None:
    with pytest.raises(ValueError, match="must be a JSON Schema dict"):

        @tool(parameters="{}")  # type: ignore[arg-type]
        def f(x: int) -> int:
            return x


STREAM = """
import asyncio
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import AgentState
from tenxgraph.utils import CallbackManager, InvocationType
from tenxgraph.core.state.tool_result import ToolResult

def add(a: int, b: int) -> int:
    return a + b

def remember(note: str, state: AgentState) -> ToolResult:
    return ToolResult(message=f"noted {note}", state={"note": note})

def fails(x: int) -> int:
    raise RuntimeError("boom")

class S(AgentState):
    note: str = ""

async def main():
    node = ToolNode([add, remember, fails])
    out = {}
    items = [m async for m in node.stream("add", {"a": 2, "b": 3}, "c1", {"thread_id": "t"}, S())]
    out["add"] = [[type(m).__name__, m.role, [getattr(b, "output", None) for b in m.content]] for m in items]
    state = S()
    items = [m async for m in node.stream("remember", {"note": "x"}, "c2", {"thread_id": "t"}, state)]
    out["remember"] = [sorted(items[0]), items[0]["messages"].content[0].output, state.note]
    items = [m async for m in node.stream("missing", {}, "c3", {"thread_id": "t"}, S())]
    out["missing"] = [[getattr(b, "output", None) or getattr(b, "message", None) for b in m.content] for m in items]
    items = [m async for m in node.stream("fails", {"x": 1}, "c4", {"thread_id": "t"}, S())]
    out["fails"] = [[getattr(b, "output", None) for b in m.content if type(b).__name__ == "ToolResultBlock"] for m in items]
    mgr = CallbackManager()
    mgr.register_after_invoke(InvocationType.TOOL, lambda c, i, o: o * 10)
    items = [m async for m in node.stream("add", {"a": 2, "b": 3}, "c5", {"thread_id": "t"}, S(), callback_manager=mgr)]
    out["with_callbacks"] = [b.output for b in items[0].content]
    emit(out)

asyncio.run(main())
"""


def test_tool_node_stream_yields_what_invoke_returns_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(STREAM)
    assert ours == theirs
    assert ours["add"] == [["Message", "tool", ["5"]]]
    assert ours["remember"] == [["messages", "state"], "noted x", "x"]
    assert ours["with_callbacks"] == ["50"]


PACKAGE = """
import tenxgraph.core.graph.tool_node as tn
from tenxgraph.core.graph.tool_node import HAS_FASTMCP, HAS_MCP, ToolNode, ToolResult, UnsupportedToolParameterError
from tenxgraph.core.state.tool_result import ToolResult as TR
emit({"all": sorted(n for n in tn.__all__ if n != "ToolOutcome"), "tool_result_same": ToolResult is TR,
      "flags": [type(HAS_MCP).__name__, type(HAS_FASTMCP).__name__],
      "error_base": [c.__name__ for c in UnsupportedToolParameterError.__mro__[1:3]],
      "methods": sorted(m for m in ("invoke", "stream", "all_tools", "all_tools_sync", "get_local_tool")
                        if callable(getattr(ToolNode, m, None)))})
"""


def test_tool_node_package_public_names_match_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(PACKAGE)
    assert ours == theirs
    assert ours["methods"] == ["all_tools", "all_tools_sync", "get_local_tool", "invoke", "stream"]


def test_stream_with_a_tool_that_takes_emit_gets_the_emitter() -> None:
    seen: list[object] = []

    def progress(step: int, emit: object = None) -> str:
        seen.append(emit)
        return f"step {step}"

    marker = object()

    async def main() -> list[Message]:
        node = ToolNode([progress])
        return [m async for m in node.stream("progress", {"step": 1}, "c1", {}, AgentState(), emit=marker)]

    items = asyncio.run(main())
    assert seen == [marker]
    assert items[0].content[0].output == "step 1"


def test_invoke_without_a_manager_runs_no_callbacks_and_with_one_runs_its_tool_callbacks() -> None:
    """Outside a graph 10xGraph injects the last compiled graph's manager; here a direct
    ``invoke``/``stream`` uses the manager it is given, or none."""
    calls: list[str] = []

    def add(a: int, b: int) -> int:
        return a + b

    mgr = CallbackManager()
    mgr.register_before_invoke(InvocationType.TOOL, lambda c, d: (calls.append(c.function_name), d)[1])
    node = ToolNode([add])
    plain = asyncio.run(node.invoke("add", {"a": 1, "b": 2}, "c1", {}, AgentState()))
    assert calls == [] and plain.content[0].output == "3"
    asyncio.run(node.invoke("add", {"a": 1, "b": 2}, "c2", {}, AgentState(), callback_manager=mgr))
    assert calls == ["add"]
