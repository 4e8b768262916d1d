"""Small behaviours found while documenting the public API (session 6), each pinned.

Each test fails on the code before its fix: a hook's malformed return escaped the "a hook never
fails the run" rule, ``set_interrupt`` half-applied a bad status, ``trim_context`` raised inside
a running loop, and a shut-down task manager still started tasks.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.context_manager import MessageContextManager
from tenxgraph.core.state.execution_state import ExecutionStatus
from tenxgraph.utils.background_task_manager import BackgroundTaskManager
from tenxgraph.utils.callbacks import CallbackManager, GraphLifecycleContext, GraphLifecycleHook


class _BadErrorHook(GraphLifecycleHook):
    async def on_graph_error(self, ctx, error, partial_state, messages, step, node_name):  # type: ignore[no-untyped-def]
        return partial_state  # a state where (state, message) is expected


class _BadCheckpointHook(GraphLifecycleHook):
    async def on_checkpoint(self, ctx, state, messages, is_context_trimmed):  # type: ignore[no-untyped-def]
        return (state, messages, "extra")


def test_malformed_hook_returns_are_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    mgr = CallbackManager()
    mgr.register_lifecycle_hook(_BadErrorHook())
    mgr.register_lifecycle_hook(_BadCheckpointHook())
    ctx, st = GraphLifecycleContext(config={}), AgentState()
    msgs = [Message.text_message("hi")]
    with caplog.at_level(logging.ERROR):
        state, message = asyncio.run(mgr.fire_on_graph_error(ctx, ValueError("boom"), st, [], 0, "n"))
        current, kept = asyncio.run(mgr.fire_on_checkpoint(ctx, st, msgs, False))
    assert state is st and message == "boom"
    assert current is st and kept is msgs
    text = caplog.text
    assert "on_graph_error returned AgentState" in text
    assert "on_checkpoint returned a tuple of 3" in text


def test_set_interrupt_with_a_bad_status_sets_nothing() -> None:
    state = AgentState()
    before = state.execution_meta.model_dump()
    with pytest.raises(ValueError):
        state.execution_meta.set_interrupt("tools", "why", "not-a-status")
    assert state.execution_meta.model_dump() == before
    state.execution_meta.set_interrupt("tools", "why", ExecutionStatus.INTERRUPTED_AFTER)
    assert state.execution_meta.interrupted_node == "tools"


def test_trim_context_works_inside_a_running_loop() -> None:
    state = AgentState(context=[Message.text_message(f"m{i}") for i in range(5)])

    async def inside_loop() -> int:
        return len(MessageContextManager(max_messages=2).trim_context(state).context)

    assert asyncio.run(inside_loop()) == 2


def test_task_manager_refuses_tasks_after_shutdown() -> None:
    ran: list[str] = []

    async def job() -> None:
        ran.append("ran")

    async def main() -> object:
        mgr = BackgroundTaskManager()
        await mgr.shutdown()
        coro = job()
        task = mgr.create_task(coro, name="late")
        await asyncio.sleep(0)
        return task, coro.cr_frame is None

    task, closed = asyncio.run(main())
    assert task is None and closed and ran == []


def test_checkpointer_config_and_missing_message_errors_are_typed(checkpointer) -> None:  # type: ignore[no-untyped-def]
    """A config that names no thread, and a message the thread does not hold, get coded errors
    (still the ValueError / TypeError / IndexError 10xGraph raised) and write nothing."""
    from tenxgraph.core.exceptions import InvalidConfigError, MessageNotFoundError

    for bad in ({}, {"thread_id": ""}, "t-1", None):
        with pytest.raises(InvalidConfigError) as info:
            checkpointer.get_state(bad)
        assert info.value.error_code == "STORAGE_CONFIG_001"
        assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    with pytest.raises(MessageNotFoundError) as missing:
        checkpointer.get_message({"thread_id": "t-none"}, "m-404")
    assert isinstance(missing.value, IndexError) and missing.value.error_code == "STORAGE_NOT_FOUND_001"
    assert missing.value.context == {"thread_id": "t-none", "message_id": "m-404"}
    with pytest.raises(MessageNotFoundError):
        checkpointer.delete_message({"thread_id": "t-none"}, "m-404")
    assert checkpointer.list_threads({}) == []
