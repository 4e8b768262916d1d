"""The registry of sync tool calls in flight (tenxgraph._sync_calls), on the interleavings the
graph-level tests (test_sync_tool_deadlines.py) cannot force: each is made exact by blocking the
event loop's thread while the worker thread moves on."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from tenxgraph import _sync_calls

pytestmark = pytest.mark.asyncio


def _key() -> tuple[str, str]:
    return ("test", uuid.uuid4().hex)


async def _until(predicate, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline
        await asyncio.sleep(0.005)


async def test_result_arriving_as_the_last_waiter_gives_up_is_recorded() -> None:
    key, release, recorded, done = _key(), threading.Event(), [], threading.Event()

    def late(result: str) -> None:
        recorded.append(result)
        done.set()

    task = asyncio.create_task(_sync_calls.run(key, lambda: release.wait(30) and "result", late))
    await _until(lambda: _sync_calls.in_flight(key) and _sync_calls._flights[key].waiters == 1)
    flight = _sync_calls._flights[key]
    release.set()
    # The loop's thread blocks here, so the waiter cannot take the result before it is cancelled:
    # the worker saw a waiter and left the record to it.
    assert flight.future.result(timeout=30) == "result"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done.wait(30) and recorded == ["result"]
    await _until(lambda: not _sync_calls.in_flight(key))


async def test_a_second_attempt_waits_for_the_first_and_nothing_is_recorded_late() -> None:
    key, release, starts, late_calls = _key(), threading.Event(), [], []

    def work() -> str:
        starts.append(1)
        release.wait(30)
        return "once"

    first = asyncio.create_task(_sync_calls.run(key, work, late_calls.append))
    await _until(lambda: bool(starts))
    second = asyncio.create_task(_sync_calls.run(key, work, late_calls.append))
    await _until(lambda: _sync_calls._flights[key].waiters == 2)
    release.set()
    assert await asyncio.wait_for(asyncio.gather(first, second), 30) == ["once", "once"]
    assert starts == [1] and late_calls == []  # an attempt returned it: its run records it
    assert not _sync_calls.in_flight(key)


async def test_an_error_nobody_waits_for_is_forgotten_not_recorded() -> None:
    key, release, late_calls = _key(), threading.Event(), []

    def work() -> str:
        release.wait(30)
        raise KeyboardInterrupt  # not an ordinary error: work() did not turn it into a result

    task = asyncio.create_task(_sync_calls.run(key, work, late_calls.append))
    await _until(lambda: _sync_calls.in_flight(key))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    await _until(lambda: not _sync_calls.in_flight(key))
    assert late_calls == []
