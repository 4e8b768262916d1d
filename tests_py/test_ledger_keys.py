"""Ledger keys are injective: distinct (thread, message id, call id, position of a repeated id) never
share a row, and neither do the idempotency keys handed to tools. A call without a usable key is
never run twice when it is at_most_once. Rows in 10xGraph 0.10's "<mid>:<cid>" form are still read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import FailpointError, InvalidConfigError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.utils.tool_decorator import tool
from tests_py.tool_graphs import call, route


def user(text: str) -> Message:
    return Message.text_message(text)


def graph(tools: list[Any], turns: Sequence[tuple[Any, list[dict[str, Any]]]], checkpointer: Any) -> Any:
    """Turn i: an assistant message with id ``turns[i][0]`` asking for ``turns[i][1]``."""

    async def model(state: AgentState) -> Message:
        if state.context[-1].role != "user":
            return Message.text_message("done", role="assistant")
        n = sum(1 for m in state.context if m.role == "user") - 1
        message_id, calls = turns[n]
        msg = Message.text_message(f"turn {n + 1}", role="assistant")
        msg.message_id = message_id
        msg.tools_calls = calls
        return msg

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


def tool_outputs(state: AgentState) -> list[Any]:
    return [b.output for m in state.context if m.role == "tool" for b in m.content if b.type == "tool_result"]


def echo_tool(effects: str, ran: list[Any], keys: list[str | None] | None = None) -> Any:
    @tool(side_effects=effects)
    async def echo(text: str, idempotency_key: str | None = None) -> str:
        ran.append(text)
        if keys is not None:
            keys.append(idempotency_key)
        return f"echo {text}"

    return echo


@pytest.mark.asyncio
@pytest.mark.parametrize(("first", "second"), [
    (("msg-1:a", "b"), ("msg-1", "a:b")),   # the ':' moves from the message id to the call id
    # An int message id and its string in one thread are refused before any ledger key is made
    # (one id as stored): test_redteam_hostile_inputs.py, the int-and-str id twin tests.
])
async def test_ids_that_print_alike_get_their_own_ledger_rows(checkpointer, make_thread, first, second) -> None:
    ran: list[Any] = []
    turns = [(first[0], [{**call("x", "echo", {"text": "one"}), "id": first[1]}]),
             (second[0], [{**call("x", "echo", {"text": "two"}), "id": second[1]}])]
    app = graph([echo_tool("at_most_once", ran)], turns, checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("first")]}, dict(cfg))
    await app.ainvoke({"messages": [user("second")]}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert ran == ["one", "two"], "the second call was answered with the first one's row"
    assert tool_outputs(state) == ["echo one", "echo two"]


@pytest.mark.asyncio
async def test_an_int_call_id_and_its_string_in_one_message_are_two_calls(checkpointer, make_thread) -> None:
    ran: list[Any] = []
    turn = [("m-int", [{**call("x", "echo", {"text": "int"}), "id": 7}, {**call("x", "echo", {"text": "str"}), "id": "7"}])]
    app = graph([echo_tool("at_most_once", ran)], turn, checkpointer)
    cfg = {"thread_id": make_thread()}
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [user("go")]}, dict(cfg, failpoints="after_record:echo@2=raise"))
    await app.ainvoke({}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert sorted(ran) == ["int", "str"]
    assert tool_outputs(state) == ["echo int", "echo str"]


@pytest.mark.asyncio
@pytest.mark.parametrize("effects", ["at_most_once", "idempotent"])
async def test_a_call_id_repeated_in_one_message_keeps_both_results_after_a_replay(checkpointer, make_thread,
                                                                                    effects) -> None:
    ran: list[Any] = []
    keys: list[str | None] = []
    turn = [("m-dup", [{**call("dup", "echo", {"text": "a"})}, {**call("dup", "echo", {"text": "b"})}])]
    app = graph([echo_tool(effects, ran, keys)], turn, checkpointer)
    cfg = {"thread_id": make_thread()}
    # Both calls return and are recorded; the node dies before its step commits.
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [user("go")]}, dict(cfg, failpoints="after_record:echo@2=raise"))
    assert sorted(ran) == ["a", "b"]
    assert len(set(keys)) == 2 and None not in keys, f"the two calls share an idempotency key: {keys}"
    await app.ainvoke({}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert sorted(ran) == ["a", "b"], "a recorded call ran again"
    assert tool_outputs(state) == ["echo a", "echo b"], "one call got the other's result, or lost its message"


@pytest.mark.asyncio
@pytest.mark.parametrize("missing", ["", None, "absent"])
async def test_an_at_most_once_call_without_an_id_never_runs_twice(checkpointer, make_thread, missing) -> None:
    ran: list[Any] = []
    c = call("x", "echo", {"text": "pay"})
    if missing == "absent":
        del c["id"]
    else:
        c["id"] = missing
    app = graph([echo_tool("at_most_once", ran)], [("m-noid", [c])], checkpointer)
    cfg = {"thread_id": make_thread()}
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [user("go")]}, dict(cfg, failpoints="after_record:echo=raise"))
    await app.ainvoke({}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert ran == ["pay"], "the call without an id ran again on replay"
    assert tool_outputs(state) == ["echo pay"]


@pytest.mark.asyncio
async def test_an_at_most_once_call_of_a_message_without_an_id_is_refused_with_a_readable_error(
        checkpointer, make_thread) -> None:
    ran: list[Any] = []
    app = graph([echo_tool("at_most_once", ran)], [("", [call("c1", "echo", {"text": "pay"})])], checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("go")]}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert ran == []
    [out] = tool_outputs(state)
    assert "TOOL_CALL_UNKEYED" in out and "at most once" in out


@pytest.mark.asyncio
async def test_rows_in_the_old_key_form_are_replayed_and_today_keys_are_found_by_it(checkpointer, make_thread) -> None:
    """A 10xGraph 0.10 database holds "<mid>:<cid>" rows: a node it left mid-way replays them;
    and aget_tool_result with the old form finds a row recorded under today's key."""
    ran: list[Any] = []
    app = graph([echo_tool("at_most_once", ran)],
                [("m-old", [call("c1", "echo", {"text": "old"}), call("c2", "echo", {"text": "new"})])], checkpointer)
    cfg = {"thread_id": make_thread()}
    # c1 "was recorded by 10xGraph" (old form), then the node died before its step committed.
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [user("go")]}, dict(cfg, failpoints="before_tool:echo=raise"))
    recorded = {"__kind__": "message", "value": Message.tool_message(
        [{"type": "tool_result", "call_id": "c1", "output": "echo old (by 10xGraph)", "status": "completed"}],
        meta={"function_name": "echo", "tool_call_id": "c1"}).model_dump(mode="json")}
    assert await checkpointer.aput_tool_result(cfg, "m-old:c1", recorded)
    await app.ainvoke({}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert ran == ["new"], "the call 10xGraph recorded ran again"
    assert tool_outputs(state) == ["echo old (by 10xGraph)", "echo new"]
    row = await checkpointer.aget_tool_result(cfg, "m-old:c2")
    assert row is not None and row["value"]["content"][0]["output"] == "echo new"
    assert await checkpointer.aget_tool_result(cfg, json.dumps(["m-old", "c2"], separators=(",", ":"))) == row


@pytest.mark.asyncio
async def test_an_old_form_key_that_names_two_recorded_calls_is_refused(checkpointer, make_thread) -> None:
    """"m:x:y" in 10xGraph's "<message id>:<call id>" form names message "m", call "x:y" and
    message "m:x", call "y". With both recorded, the first found was returned, whichever it was
    (red-team, session 26); now the read says so and names the keys as stored."""
    cfg = {"thread_id": make_thread("colons")}
    a, b = json.dumps(["m", "x:y"], separators=(",", ":")), json.dumps(["m:x", "y"], separators=(",", ":"))
    assert await checkpointer.aput_tool_result(cfg, a, {"who": "call x:y of m"})
    assert await checkpointer.aget_tool_result(cfg, "m:x:y") == {"who": "call x:y of m"}  # one call: found
    assert await checkpointer.aput_tool_result(cfg, b, {"who": "call y of m:x"})
    for read in (checkpointer.aget_tool_result, checkpointer.aget_tool_status):
        with pytest.raises(InvalidConfigError) as ambiguous:
            await read(cfg, "m:x:y")
        assert ambiguous.value.error_code == "STORAGE_CONFIG_002"
        assert set(ambiguous.value.context["candidates"]) == {a, b}
    assert await checkpointer.aget_tool_result(cfg, a) == {"who": "call x:y of m"}
    assert await checkpointer.aget_tool_result(cfg, b) == {"who": "call y of m:x"}
    # Stored literally under the old form, the key names that row alone.
    assert await checkpointer.aput_tool_result(cfg, "m:x:y", {"who": "literal"})
    assert await checkpointer.aget_tool_result(cfg, "m:x:y") == {"who": "literal"}


@pytest.mark.asyncio
async def test_a_stored_form_key_written_another_way_finds_its_row(checkpointer, make_thread) -> None:
    """``json.dumps([message_id, call_id])`` (", " between them, "\\u00e9" for "é") is the stored
    key written another way: it read "not recorded" (red-team, session 26)."""
    cfg = {"thread_id": make_thread("key-forms")}
    for mid, cid in (("m-1", "c-1"), ("mé", "c\u2028🙂")):
        stored = json.dumps([mid, cid], separators=(",", ":"), ensure_ascii=False)
        assert await checkpointer.aput_tool_result(cfg, stored, {"who": cid})
        for other in (json.dumps([mid, cid]), json.dumps([mid, cid], separators=(",", ":"))):
            assert await checkpointer.aget_tool_result(cfg, other) == {"who": cid}, other
            assert await checkpointer.aget_tool_status(cfg, other) == "completed", other
    assert await checkpointer.aget_tool_result(cfg, json.dumps(["m-1", "c-2"])) is None
