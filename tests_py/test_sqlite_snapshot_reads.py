"""A state read on SQLite sees one committed step: the state row and the thread's messages come
from the same snapshot, even while another connection (here: another checkpointer on the same
file, as another process would be) commits steps between them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.storage.checkpointer import SqliteCheckpointer


class Counted(AgentState):
    # Written in the same step as the messages: equal to their number in every committed step.
    n: int = 0


@pytest.mark.asyncio
async def test_a_state_read_never_mixes_one_steps_row_with_anothers_messages(tmp_path: Path) -> None:
    path = tmp_path / "snap.db"
    writer, reader = SqliteCheckpointer(path), SqliteCheckpointer(path)
    writer.bind_state_type(Counted)
    reader.bind_state_type(Counted)
    config = {"thread_id": "snap"}
    await writer.aput_state(config, Counted(context=[], n=0))
    done = asyncio.Event()
    torn: list[tuple[int, int]] = []
    reads = 0

    async def write() -> None:
        context: list[Message] = []
        try:
            for k in range(1, 120):
                context.append(Message.text_message(f"m{k}", message_id=f"m{k}"))
                await writer.aput_state(config, Counted(context=list(context), n=k))
        finally:
            done.set()

    async def read() -> None:
        nonlocal reads
        while not done.is_set():
            s = await reader.aget_state(config)
            assert s is not None
            reads += 1
            if s.n != len(s.context):
                torn.append((s.n, len(s.context)))

    await asyncio.gather(write(), read(), read())
    await writer.arelease()
    await reader.arelease()
    assert reads > 50  # the readers ran beside the writes, not after them
    assert not torn, f"{len(torn)} of {reads} reads mixed two steps, e.g. (n, messages) = {torn[:5]}"
