"""A thread deleted (or pruned) and then sent the same user message again, in the process that
ran it: the message is the new thread's first, under the id the client sent.

On PostgreSQL the run first merges the input into the state this process kept from the thread's
last turn, and commits the input on that head in one statement; the head is gone, the commit is
refused, and the input is merged again into what a read gives. The first merge had found the
message's id in the kept state and renamed it (a resent message is added under a new id), and the
second merge kept the new name: the client's id was lost (helper red-team, 4 of 4)."""

from __future__ import annotations

import asyncio

import pytest

from tenxgraph import Message

from tests_py.one_tool_graph import tool_calls_graph


@pytest.mark.asyncio
@pytest.mark.parametrize("delete", ["aclean_thread", "aprune"])
async def test_a_message_resent_to_a_deleted_thread_keeps_its_id(checkpointer, make_thread, delete: str) -> None:
    async def pay(amount: int) -> str:
        """Pay an amount."""
        return "paid"

    app = tool_calls_graph(checkpointer, [pay], [("pay", {"amount": 5})])
    config = {"thread_id": make_thread("resent")}
    await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config)
    if delete == "aclean_thread":
        await checkpointer.aclean_thread(config)
    else:
        await asyncio.sleep(0.05)
        report = await checkpointer.aprune(finished_older_than=0)
        assert report["threads"] == 1, report
    assert await checkpointer.aget_state(config) is None

    result = await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config)
    assert result["messages"][0].message_id == "u-1"
    stored = (await checkpointer.aget_state(config)).context
    assert [m.message_id for m in stored][:2] == ["u-1", "a-u-1"], [m.message_id for m in stored]
