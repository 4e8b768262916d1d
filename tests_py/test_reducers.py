"""Reducer semantics (spec §3.7): add_messages, tombstones, append_items, remove_tool_messages."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from tenxgraph.core.state import (
    REMOVE_ALL_MESSAGES,
    AgentState,
    Message,
    MessageContextManager,
    RemoveMessage,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    add_messages,
    append_items,
    remove_tool_messages,
    replace_messages,
    replace_value,
)
from tenxgraph import utils


def msg(mid: str | int, role: str = "user", text: str = "", **kw: object) -> Message:
    return Message(message_id=mid, role=role, content=[TextBlock(text=text or str(mid))], **kw)


def ids(messages: list[Message]) -> list[str | int]:
    return [m.message_id for m in messages]


def assistant_call(mid: str, call_id: str = "c1") -> Message:
    return Message(
        message_id=mid,
        role="assistant",
        content=[],
        tools_calls=[
            {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    )


def tool_reply(mid: str, call_id: str = "c1") -> Message:
    return Message.tool_message([ToolResultBlock(call_id=call_id, output="ok")], message_id=mid)


# add_messages ---------------------------------------------------------------


def test_add_messages_appends_new_in_order_without_mutating_inputs() -> None:
    left = [msg("a"), msg("b")]
    right = [msg("c"), msg("d")]
    out = add_messages(left, right)
    assert ids(out) == ["a", "b", "c", "d"]
    assert ids(left) == ["a", "b"]
    assert out is not left


def test_add_messages_dedupes_by_id_against_left_and_within_right() -> None:
    left = [msg("a", text="original")]
    out = add_messages(left, [msg("a", text="replayed"), msg("b"), msg("b", text="dup")])
    assert ids(out) == ["a", "b"]
    assert out[0].text() == "original"
    assert out[1].text() == "b"


def test_add_messages_skips_deltas() -> None:
    out = add_messages([msg("a")], [msg("partial", role="assistant", delta=True), msg("final")])
    assert ids(out) == ["a", "final"]


def test_add_messages_accepts_single_message_and_none() -> None:
    assert ids(add_messages(None, msg("x"))) == ["x"]
    assert ids(add_messages([msg("x")], None)) == ["x"]


def test_add_messages_int_and_str_ids_are_distinct() -> None:
    out = add_messages([msg(1)], [msg("1")])
    assert ids(out) == [1, "1"]


def test_remove_message_tombstone_deletes_by_id() -> None:
    out = add_messages([msg("a"), msg("b"), msg("c")], [RemoveMessage(message_id="b")])
    assert ids(out) == ["a", "c"]
    assert not any(isinstance(m, RemoveMessage) for m in out)


def test_remove_message_unknown_id_is_ignored() -> None:
    out = add_messages([msg("a")], [RemoveMessage(message_id="zzz"), msg("b")])
    assert ids(out) == ["a", "b"]


def test_tombstone_applies_in_order_within_right() -> None:
    # Removing then re-adding an id brings the new message back.
    update = [RemoveMessage(message_id="a"), msg("a", text="new")]
    out = add_messages([msg("a", text="old")], update)
    assert ids(out) == ["a"]
    assert out[0].text() == "new"


def test_remove_all_clears_everything_before_it_only() -> None:
    out = add_messages(
        [msg("a"), msg("b")],
        [msg("c"), RemoveMessage(message_id=REMOVE_ALL_MESSAGES), msg("d"), msg("a")],
    )
    assert ids(out) == ["d", "a"]


def test_tombstones_left_in_a_context_are_filtered_out() -> None:
    out = add_messages([msg("a"), RemoveMessage(message_id="a")], [])
    assert ids(out) == ["a"]
    assert type(out[0]) is Message


def test_remove_message_requires_an_id() -> None:
    with pytest.raises(ValueError):
        RemoveMessage()  # type: ignore[call-arg]


def test_agent_state_context_carries_add_messages_reducer() -> None:
    metadata = AgentState.model_fields["context"].metadata
    assert add_messages in metadata
    reducer = next(m for m in metadata if callable(m))
    assert reducer is add_messages


# replace / append -------------------------------------------------------------


def test_replace_messages_and_replace_value_return_right() -> None:
    right = [msg("z")]
    assert replace_messages([msg("a")], right) is right
    assert replace_value(1, 2) == 2
    assert replace_value({"a": 1}, None) is None


@dataclass
class Item:
    id: str | None
    value: int


def test_append_items_dedupes_by_id() -> None:
    left = [Item("a", 1), Item("b", 2)]
    out = append_items(left, [Item("b", 99), Item("c", 3), Item("c", 4)])
    assert [(i.id, i.value) for i in out] == [("a", 1), ("b", 2), ("c", 3)]
    assert len(left) == 2


def test_append_items_handles_dicts_and_missing_ids() -> None:
    out = append_items([{"id": 1}], [{"id": 1}, {"id": 2}, {"x": 0}, {"x": 0}])
    assert out == [{"id": 1}, {"id": 2}, {"x": 0}, {"x": 0}]
    assert [i.value for i in append_items([], [Item(None, 1), Item(None, 2)])] == [1, 2]


def test_utils_reexports_reducers() -> None:
    assert utils.add_messages is add_messages
    assert utils.append_items is append_items
    assert utils.replace_messages is replace_messages
    assert utils.replace_value is replace_value


# remove_tool_messages ---------------------------------------------------------


def test_completed_exchange_is_dropped_keeping_final_reply() -> None:
    history = [
        msg("u1"),
        assistant_call("a1", "c1"),
        tool_reply("t1", "c1"),
        msg("r1", role="assistant", text="the answer"),
        msg("u2"),
    ]
    out = remove_tool_messages(history)
    assert ids(out) == ["u1", "r1", "u2"]
    assert out[1].text() == "the answer"
    assert len(history) == 5


def test_exchange_awaiting_final_reply_is_kept() -> None:
    history = [msg("u1"), assistant_call("a1"), tool_reply("t1")]
    assert ids(remove_tool_messages(history)) == ["u1", "a1", "t1"]


def test_calls_without_results_are_kept() -> None:
    history = [msg("u1"), assistant_call("a1"), msg("r1", role="assistant")]
    assert ids(remove_tool_messages(history)) == ["u1", "a1", "r1"]


def test_chained_exchange_collapses_to_final_reply() -> None:
    history = [
        msg("u1"),
        assistant_call("a1", "c1"),
        tool_reply("t1", "c1"),
        assistant_call("a2", "c2"),
        tool_reply("t2", "c2"),
        tool_reply("t3", "c2"),
        msg("r", role="assistant"),
    ]
    assert ids(remove_tool_messages(history)) == ["u1", "r"]


def test_tool_call_blocks_count_as_tool_calls() -> None:
    call = Message(
        message_id="a1",
        role="assistant",
        content=[ToolCallBlock(id="c1", name="f", args={"x": 1})],
    )
    history = [msg("u"), call, tool_reply("t1"), msg("r", role="assistant")]
    assert ids(remove_tool_messages(history)) == ["u", "r"]


def test_exchange_interrupted_by_user_is_kept() -> None:
    history = [assistant_call("a1"), tool_reply("t1"), msg("u2"), msg("r", role="assistant")]
    assert ids(remove_tool_messages(history)) == ["a1", "t1", "u2", "r"]


def test_plain_conversation_is_untouched() -> None:
    history = [msg("s", role="system"), msg("u"), msg("a", role="assistant")]
    assert ids(remove_tool_messages(history)) == ["s", "u", "a"]


# MessageContextManager ----------------------------------------------------------


def test_message_context_manager_keeps_system_and_last_n() -> None:
    state = AgentState(
        context=[msg("sys", role="system")] + [msg(f"m{i}") for i in range(6)]
    )
    trimmed = asyncio.run(MessageContextManager(max_messages=3).atrim_context(state))
    assert ids(trimmed.context) == ["sys", "m3", "m4", "m5"]


def test_message_context_manager_counts_user_turns_and_never_cuts_one() -> None:
    # 10xGraph's rule: the last max_messages user messages and everything after them, so a
    # tool exchange is kept whole with the turn that asked for it (no orphan tool result).
    history = [msg("u"), assistant_call("a1"), tool_reply("t1"), msg("r", role="assistant"), msg("u2")]
    assert ids(MessageContextManager(max_messages=2).trim_context(AgentState(context=list(history))).context) == \
        ["u", "a1", "t1", "r", "u2"]
    assert ids(MessageContextManager(max_messages=1).trim_context(AgentState(context=list(history))).context) == \
        ["u2"]
    assert ids(MessageContextManager(max_messages=0).trim_context(AgentState(context=list(history))).context) == []


def test_message_context_manager_can_collapse_tool_exchanges() -> None:
    state = AgentState(
        context=[msg("u"), assistant_call("a1"), tool_reply("t1"), msg("r", role="assistant")]
    )
    manager = MessageContextManager(max_messages=10, remove_tool_msgs=True)
    assert ids(manager.trim_context(state).context) == ["u", "r"]


def test_tool_message_output_stays_json_serialisable() -> None:
    m = tool_reply("t1")
    assert json.loads(m.model_dump_json())["content"][0]["output"] == "ok"
