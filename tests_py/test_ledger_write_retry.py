"""A tool result whose ledger write fails quickly and transiently (a pool with no connection
free under a burst of results) is written on a second try (helper red-team of exhaustion,
session 33). It was only kept in the process's memory, 1,000 results at most: a resume in
another process, or past that, ran the finished tool again. A slow failure is not tried again
(it would hold the node for several deadlines), and a record that keeps failing is still
logged as not recorded."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph.core.exceptions import TransientStorageError
from tenxgraph.core.state import Message

from tests_py.one_tool_graph import ledger_key, one_tool_graph
from tests_py.test_python_checkpointer_faults import DictCheckpointer


class FlakyLedger(DictCheckpointer):
    """Its first ``failures`` ledger writes fail at once with TransientStorageError."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0

    async def aput_tool_result(self, config: dict[str, Any], tool_call_id: str, result: dict[str, Any]) -> Any:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise TransientStorageError("no connection of the pool became free")
        return await super().aput_tool_result(config, tool_call_id, result)


def charging(cp: DictCheckpointer, charges: list[int]) -> Any:
    def charge(amount: int) -> str:
        """Charge the card."""
        charges.append(amount)
        return "charged"

    return one_tool_graph(cp, charge, "charge", {"amount": 5})


@pytest.mark.asyncio
async def test_a_quick_transient_ledger_failure_is_written_on_a_later_try(caplog: pytest.LogCaptureFixture) -> None:
    cp = FlakyLedger(failures=2)
    charges: list[int] = []
    out = await charging(cp, charges).ainvoke({"messages": [Message.text_message("pay")]}, {"thread_id": "t"})
    assert out["messages"][-1].text() == "done" and charges == [5]
    assert cp.attempts == 3
    assert len(cp.ledger) == 1, "the result is not in the ledger: a replay elsewhere runs the tool again"
    assert "tool_result_not_recorded" not in caplog.text


@pytest.mark.asyncio
async def test_a_ledger_that_keeps_failing_is_tried_a_bounded_number_of_times(caplog: pytest.LogCaptureFixture) -> None:
    cp = FlakyLedger(failures=1000)
    charges: list[int] = []
    await charging(cp, charges).ainvoke({"messages": [Message.text_message("pay")]}, {"thread_id": "t"})
    assert charges == [5] and cp.ledger == {}
    assert 2 <= cp.attempts <= 10


@pytest.mark.asyncio
async def test_a_result_too_large_to_store_is_an_error_the_model_reads_recorded_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """PostgreSQL's jsonb cannot hold a string past 256 MiB: such a result's ledger write failed
    every time and every resume ran the tool again (a 260 MiB result ran 3 times in 3 attempts).
    The bound is lowered here so the test needs no such result."""
    import tenxgraph._tool_step as tool_step
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    monkeypatch.setattr(tool_step, "MAX_RESULT_TEXT", 10_000, raising=False)
    runs: list[int] = []

    def dump(n: int) -> str:
        """A big export."""
        runs.append(n)
        return "x" * n

    cp = SqliteCheckpointer(tmp_path / "big.db")
    app = one_tool_graph(cp, dump, "dump", {"n": 50_000})
    out = await app.ainvoke({"messages": [Message.text_message("export")]}, {"thread_id": "t"})
    tool_msg = [m for m in out["messages"] if m.role == "tool"][0]
    assert "too large to store" in tool_msg.text() and runs == [50_000]
    # Recorded whole: a replay of the node answers from the ledger, and the tool does not run again.
    umid = out["messages"][0].message_id
    assert await cp.aget_tool_status({"thread_id": "t"}, ledger_key(umid, 0, "dump")) == "completed"
    state = await cp.aget_state({"thread_id": "t"})
    assert all(len(m.text()) < 10_000 for m in state.context)
    await cp.arelease()
