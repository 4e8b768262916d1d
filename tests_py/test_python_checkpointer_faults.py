"""A checkpointer written in Python, and an event publisher, that misbehave (helper red-team,
session 30).

1. A second turn sent to a thread whose run was in flight (refused with ``on_busy="reject"``,
   or queued with ``"wait"``) read the thread from Python again and reset the working copy's
   version under the running turn, which then failed with ``STORAGE_CONFLICT_001`` after its
   tool ran.
2. A method that never returned (``aget_state`` at the run's start, ``aput_checkpoint`` at a
   step) held the run for ever: now ``TransientStorageError`` ``STORAGE_TRANSIENT_001`` after the
   checkpointer's ``call_timeout`` (30 s by default).
3. A publisher whose ``publish`` swallows its cancellation made a sync ``invoke()`` never return
   (the loop's close waited for it; 10xGraph 0.10 the same).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import InvalidConfigError, ThreadBusyError, TransientStorageError

from .test_checkpointer_compat import DictCheckpointer as _Dict
from .tool_graphs import one_reply_graph


class DictCheckpointer(_Dict):
    """The compat tests' dict checkpointer, with the tool ledger a graph's checkpointer needs."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger: dict[str, dict[str, Any]] = {}

    async def aget_tool_result(self, config: dict[str, Any], tool_call_id: str) -> dict[str, Any] | None:
        return self.ledger.get(f"{config['thread_id']}:{tool_call_id}")

    async def aput_tool_result(self, config: dict[str, Any], tool_call_id: str, result: dict[str, Any]) -> Any:
        self.ledger.setdefault(f"{config['thread_id']}:{tool_call_id}", result)


def _held(checkpointer: Any, entered: asyncio.Event, release: asyncio.Event) -> Any:
    async def model(state: AgentState) -> Message:
        if state.context[-1].text() == "A":
            entered.set()
            await release.wait()
        return Message.text_message("reply to " + state.context[-1].text(), role="assistant")

    async def plan(state: AgentState) -> AgentState:
        return state

    g = StateGraph(AgentState)
    g.add_node("plan", plan)  # a commit before the held node: the run is past its first version
    g.add_node("model", model)
    g.add_edge(START, "plan")
    g.add_edge("plan", "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
@pytest.mark.parametrize("on_busy", ["reject", "wait"])
async def test_a_second_turn_does_not_break_the_running_one(on_busy: str) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    cp = DictCheckpointer()
    app = _held(cp, entered, release)
    cfg = {"thread_id": "busy", "on_busy": on_busy, "busy_timeout": 60.0}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("A")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 60)
    second = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("B")]}, dict(cfg)))
    if on_busy == "reject":
        with pytest.raises(ThreadBusyError) as e:
            await second
        assert e.value.error_code == "STORAGE_BUSY_002"
    release.set()
    await asyncio.wait_for(first, 60)
    if on_busy == "wait":
        await asyncio.wait_for(second, 60)
    texts = [m.text() for m in cp.states["busy"].context]
    expected = ["A", "reply to A"] + (["B", "reply to B"] if on_busy == "wait" else [])
    assert texts == expected


class _Hanging(DictCheckpointer):
    call_timeout = 0.5

    def __init__(self, hang: str) -> None:
        super().__init__()
        self.hang = hang

    async def aget_state(self, config: dict[str, Any]) -> AgentState | None:
        if self.hang == "aget_state":
            await asyncio.Event().wait()
        return await super().aget_state(config)

    async def aput_state(self, config: dict[str, Any], state: AgentState) -> AgentState:
        if self.hang == "aput_state":
            await asyncio.Event().wait()
        return await super().aput_state(config, state)


@pytest.mark.asyncio
@pytest.mark.parametrize("hang", ["aget_state", "aput_state"])
async def test_a_method_that_never_returns_is_a_transient_error_after_call_timeout(hang: str) -> None:
    app = _held(_Hanging(hang), asyncio.Event(), asyncio.Event())
    started = time.monotonic()
    with pytest.raises(TransientStorageError) as e:
        # The guard against a hang is the test's, far past call_timeout (0.5 s).
        await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": hang}), 60)
    assert e.value.error_code == "STORAGE_TRANSIENT_001"
    assert "call_timeout" in str(e.value)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "5", True])
def test_a_bad_call_timeout_is_refused(bad: Any) -> None:
    class Bad(DictCheckpointer):
        call_timeout = bad

    with pytest.raises(InvalidConfigError) as e:
        _held(Bad(), asyncio.Event(), asyncio.Event())
    assert e.value.error_code == "STORAGE_CONFIG_002"


_STUBBORN = textwrap.dedent("""
    import asyncio, sys
    from tenxgraph import END, AgentState, Message, StateGraph
    from tenxgraph.runtime.publisher import BasePublisher
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    class Stubborn(BasePublisher):
        def __init__(self):
            super().__init__({})

        async def publish(self, event):
            while True:  # a retry loop with a bare except: its cancellation is swallowed
                try:
                    await asyncio.Event().wait()
                except BaseException:
                    await asyncio.sleep(0.05)

        async def close(self):
            pass

        def sync_close(self):
            pass

    g = StateGraph(AgentState, publisher=Stubborn())
    g.add_node("model", lambda s: Message.text_message("hi", role="assistant"))
    g.set_entry_point("model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    out = app.invoke({"messages": [Message.text_message("hello")]}, config={"thread_id": "t"})
    print("RETURNED", out["messages"][-1].text(), flush=True)
""")


def test_a_publisher_that_swallows_its_cancellation_does_not_hold_a_sync_invoke() -> None:
    # 120 s is the guard against a hang; the run needs about the outbox's deadline (10 s) plus
    # the loop's close (5 s) at most.
    done = subprocess.run([sys.executable, "-c", _STUBBORN], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RETURNED hi" in done.stdout


@pytest.mark.asyncio
@pytest.mark.parametrize("shape", ["json_text", "empty", "junk", "list", "bare_value"])
async def test_a_ledger_record_of_another_shape_never_runs_an_at_most_once_call_again(shape: str) -> None:
    """(session 31) ``aget_tool_result`` returning the record as its JSON text, ``{}``, a dict
    of other keys, a list or its bare ``"value"`` counted as not recorded: the resume charged
    again (10xGraph reads them as misses too). It is a failed ledger read: the call is refused
    with ``TOOL_LEDGER_UNAVAILABLE``, as when the read raises."""
    import json

    from tenxgraph.core.exceptions import FailpointError
    from tenxgraph.utils import tool

    from .tool_graphs import call, tool_graph

    class Garbled(DictCheckpointer):
        garble = False

        async def aget_tool_result(self, config: dict[str, Any], tool_call_id: str) -> Any:
            record = await super().aget_tool_result(config, tool_call_id)
            if record is None or not self.garble:
                return record
            return {"json_text": json.dumps(record), "empty": {}, "junk": {"junk": 1}, "list": [record],
                    "bare_value": record.get("value")}[shape]

    charges: list[int] = []

    @tool(name="charge", side_effects="at_most_once")
    async def charge(amount: int) -> str:
        """Charge a card."""
        charges.append(amount)
        return f"charged {amount}"

    cp = Garbled()
    app = tool_graph(AgentState, [charge], [[call("c1", "charge", {"amount": 42})], []], checkpointer=cp)
    cfg = {"thread_id": f"garbled-{shape}"}
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [Message.text_message("pay")]},
                          dict(cfg, failpoints="after_record:charge=raise"))
    cp.garble = True
    await app.ainvoke({}, dict(cfg))
    assert charges == [42]
    state = await cp.aget_state(dict(cfg))
    answer = [m.text() for m in state.context if m.role == "tool"]
    assert len(answer) == 1 and "TOOL_LEDGER_UNAVAILABLE" in answer[0], answer


class _Frozen(DictCheckpointer):
    """Answers until ``frozen`` is set, then never (a hung client, cancellable)."""

    call_timeout = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.frozen = False
        self.owner_error: BaseException | None = None

    async def aget_state(self, config: dict[str, Any]) -> Any:
        if self.frozen:
            await asyncio.Event().wait()
        return await super().aget_state(config)

    async def aget_thread_owner(self, thread_id: str, config: Any = None) -> Any:
        if self.owner_error is not None:
            raise self.owner_error
        if self.frozen:
            await asyncio.Event().wait()
        return None


@pytest.mark.asyncio
async def test_stop_and_an_owner_check_keep_the_call_timeout_of_a_python_checkpointer() -> None:
    """(session 31) ``astop()`` and an authz owner check awaited the checkpointer's methods on
    the caller's loop without a deadline: a hung store hung ``stop()`` for good. They are called as
    a run calls them: ``TransientStorageError`` STORAGE_TRANSIENT_001 after ``call_timeout``."""
    cp = _Frozen()
    app = one_reply_graph(cp)
    await app.ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": "t"})
    cp.frozen = True
    owner_scope = {"thread_id": "t2", "user_id": "u", "authz": {"user_id": "u", "scope": "owner"}}
    for call in (app.astop({"thread_id": "t"}), app.ainvoke({"messages": [Message.text_message("y")]}, owner_scope)):
        with pytest.raises(TransientStorageError) as err:
            await asyncio.wait_for(call, 30)
        assert err.value.error_code == "STORAGE_TRANSIENT_001"


@pytest.mark.asyncio
async def test_an_owner_check_that_fails_is_a_storage_error() -> None:
    """(session 31) A failing ``aget_thread_owner`` reached the caller as its bare exception."""
    from tenxgraph.core.exceptions import StorageError

    cp = _Frozen()
    cp.owner_error = ConnectionError("db down")
    app = one_reply_graph(cp)
    with pytest.raises(StorageError) as err:
        await app.ainvoke({"messages": [Message.text_message("y")]},
                          {"thread_id": "t", "user_id": "u", "authz": {"user_id": "u", "scope": "owner"}})
    assert err.value.error_code == "STORAGE_001" and "db down" in str(err.value)
    assert await cp.aget_state({"thread_id": "t", "user_id": "u"}) is None


@pytest.mark.asyncio
async def test_a_recovery_pass_finds_the_runs_a_crash_left_in_a_python_checkpointer() -> None:
    """(session 31) A recovery pass asked only the process's working copy of a Python
    checkpointer, empty after a restart: a turn a crash cut off was never finished. It now
    lists the checkpointer's threads (``alist_threads``) and reads each one's status."""
    from tenxgraph.core.exceptions import FailpointError
    from tenxgraph.utils.thread_info import ThreadInfo

    from .tool_graphs import call, tool_graph

    class Listed(DictCheckpointer):
        async def alist_threads(self, config: dict[str, Any], search: Any = None, offset: Any = None,
                                limit: Any = None) -> list[ThreadInfo]:
            return [ThreadInfo(thread_id=t) for t in self.states]

    charges: list[str] = []

    async def charge(order: str) -> str:
        """Charge an order."""
        charges.append(order)
        return f"charged {order}"

    def build(cp: Any) -> Any:
        return tool_graph(AgentState, [charge], [[call("c1", "charge", {"order": "x"})], []], checkpointer=cp)

    cp = Listed()
    with pytest.raises(FailpointError):
        await build(cp).ainvoke({"messages": [Message.text_message("pay")]},
                                {"thread_id": "cut", "failpoints": "after_step:model=raise"})
    await build(cp).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "done"})
    # A new process: a fresh graph and adapter over the same stored data.
    fresh = Listed()
    fresh.states, fresh.ledger = cp.states, cp.ledger
    report = await build(fresh).arecover()
    assert [(r.thread_id, r.status) for r in report.resumed] == [("cut", "completed")]
    assert charges == ["x", "x"]  # "done"'s turn, and "cut"'s, which the crash cut off before its tools
    state = await fresh.aget_state({"thread_id": "cut"})
    assert str(state.execution_meta.status).endswith("completed")
    assert [m.text() for m in state.context if m.role == "tool"] == ["charged x"]
