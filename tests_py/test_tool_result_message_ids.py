"""A tool's own result message under an id the thread (or a sibling call) has already
(helper red-team, session 30).

A tool that makes its result ``Message`` itself with an id of its choosing
(``f"order-{order_id}"``) gave two calls one id, or a later turn's call the id of an earlier
result: the context's merge kept the first message of an id and dropped the other, so a call
that ran was left unanswered (10xGraph 0.10 keeps both under the one id). The later result now
gets a new id, recorded with it, so a replay gives the same one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.state.message_block import ToolResultBlock

from .tool_graphs import call, tool_graph


def _lookup(fixed_id: Any = None) -> Any:
    async def lookup(order_id: str, tool_call_id: str, state: AgentState) -> Message:
        m = Message.tool_message([ToolResultBlock(call_id=tool_call_id, output=f"order {order_id}: shipped")])
        # The tool picks the id; the assistant message's own id is the worst one it could pick.
        m.message_id = fixed_id(state) if callable(fixed_id) else f"order-{order_id}"
        return m

    return lookup


def _answers(context: list[Message]) -> Counter[str]:
    return Counter(b.call_id for m in context if m.role == "tool" for b in m.content if isinstance(b, ToolResultBlock))


def _assert_whole(context: list[Message]) -> None:
    ids = [str(m.message_id) for m in context]
    assert len(ids) == len(set(ids)), ids
    asked = [c["id"] for m in context if m.tools_calls for c in m.tools_calls]
    assert _answers(context) == Counter(asked), (asked, _answers(context))


@pytest.mark.asyncio
async def test_parallel_calls_whose_results_have_one_id_are_each_answered(checkpointer: Any, make_thread: Any) -> None:
    turns = [[call("c1", "lookup", {"order_id": "7"}), call("c2", "lookup", {"order_id": "7"})], []]
    app = tool_graph(AgentState, [_lookup()], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("same-id")}
    await app.ainvoke({"messages": [Message.text_message("where are my orders?")]}, dict(cfg))
    _assert_whole((await checkpointer.aget_state(dict(cfg))).context)


@pytest.mark.asyncio
async def test_a_later_turns_result_under_an_earlier_results_id_is_kept(checkpointer: Any, make_thread: Any) -> None:
    turns = [[call("c1", "lookup", {"order_id": "7"})], [call("c9", "lookup", {"order_id": "7"})]]
    app = tool_graph(AgentState, [_lookup()], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("later")}
    await app.ainvoke({"messages": [Message.text_message("one")]}, dict(cfg))
    await app.ainvoke({"messages": [Message.text_message("two")]}, dict(cfg))
    _assert_whole((await checkpointer.aget_state(dict(cfg))).context)


@pytest.mark.asyncio
async def test_a_result_under_the_asking_messages_id_is_kept(checkpointer: Any, make_thread: Any) -> None:
    turns = [[call("c1", "lookup", {"order_id": "7"})], []]
    app = tool_graph(AgentState, [_lookup(lambda s: s.context[-1].message_id)], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("asking")}
    await app.ainvoke({"messages": [Message.text_message("one")]}, dict(cfg))
    _assert_whole((await checkpointer.aget_state(dict(cfg))).context)


@pytest.mark.asyncio
async def test_a_replayed_result_keeps_the_id_it_was_recorded_under(checkpointer: Any, make_thread: Any) -> None:
    runs: list[str] = []
    inner = _lookup()

    async def lookup(order_id: str, tool_call_id: str, state: AgentState) -> Message:
        runs.append(tool_call_id)
        return await inner(order_id, tool_call_id, state)

    turns = [[call("c1", "lookup", {"order_id": "7"}), call("c2", "lookup", {"order_id": "7"})], []]
    app = tool_graph(AgentState, [lookup], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("replayed")}
    with pytest.raises(Exception):
        await app.ainvoke({"messages": [Message.text_message("m")]}, dict(cfg, failpoints="in_step_tx:tools=raise"))
    state = await checkpointer.aget_state(dict(cfg))
    origin = state.context[1].message_id
    recorded = [(await checkpointer.aget_tool_result(dict(cfg), f"{origin}:{c}"))["value"]["message_id"]
                for c in ("c1", "c2")]
    assert len(set(recorded)) == 2, recorded
    await app.ainvoke({}, dict(cfg))
    assert sorted(runs) == ["c1", "c2"]  # replayed, not run again
    context = (await checkpointer.aget_state(dict(cfg))).context
    _assert_whole(context)
    assert sorted(str(m.message_id) for m in context if m.role == "tool") == sorted(map(str, recorded))


def _misaddressed(kind: str) -> Any:
    async def lookup(order_id: str, tool_call_id: str) -> Message:
        if kind == "assistant":  # a tool that "speaks": its call was never answered
            return Message.text_message(f"order {order_id}: shipped", role="assistant")
        if kind == "meta":  # another call's id in the metadata, no result block
            return Message.tool_message(f"order {order_id}: shipped", meta={"tool_call_id": "someone-else"})
        # a result block naming another call (a copy-paste of a sibling's answer)
        return Message.tool_message([ToolResultBlock(call_id="someone-else", output=f"order {order_id}: shipped")])

    return lookup


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["assistant", "meta", "block"])
async def test_a_tool_message_naming_another_call_answers_its_own_call(kind: str, checkpointer: Any,
                                                                       make_thread: Any) -> None:
    """(session 31) A tool's own ``Message`` of role ``assistant``, or naming another call's id,
    left its call unanswered (10xGraph the same): every provider refuses such a thread. It is now
    stored as the answer to the call that ran it, text kept."""
    turns = [[call("c1", "lookup", {"order_id": "7"}), call("c2", "lookup", {"order_id": "8"})], []]
    app = tool_graph(AgentState, [_misaddressed(kind)], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread(f"misaddressed-{kind}")}
    await app.ainvoke({"messages": [Message.text_message("where are my orders?")]}, dict(cfg))
    ctx = (await checkpointer.aget_state(dict(cfg))).context
    answers = {m.metadata.get("tool_call_id"): m for m in ctx if m.role == "tool"}
    assert set(answers) == {"c1", "c2"}, [(m.role, m.metadata) for m in ctx]
    assert answers["c1"].text() == "order 7: shipped" and answers["c2"].text() == "order 8: shipped"
    assert all(b.call_id == cid for cid, m in answers.items() for b in m.content if isinstance(b, ToolResultBlock))
    assert not [m for m in ctx if m.role == "assistant" and "shipped" in m.text()]
