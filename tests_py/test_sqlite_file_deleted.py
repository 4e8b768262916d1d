"""The SQLite file deleted (a cleanup job, an ``rm`` to reset) or replaced by a rename while a
process has it open. The open descriptors kept the old inode alive, so the process's next turns
ran their tools, reported success, and were committed where nobody could read them again: gone
for every other process and for this one after a restart. Now a write on a file the path no
longer names fails with a StorageError saying so, before any tool runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import StorageError
from tenxgraph.storage.checkpointer import SqliteCheckpointer

from tests_py.one_tool_graph import one_tool_graph


def charging_graph(cp: SqliteCheckpointer, charges: list[int]) -> Any:
    def charge(amount: int) -> str:
        """Charge the card."""
        charges.append(amount)
        return "charged"

    return one_tool_graph(cp, charge, "charge", {"amount": 1})


def user(mid: str) -> dict[str, Any]:
    return {"messages": [Message.text_message("go", role="user", message_id=mid)]}


def remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_turn_on_a_file_no_longer_at_its_path_fails_before_any_tool(tmp_path: Path, how: str) -> None:
    path = tmp_path / "agent.db"
    charges: list[int] = []
    cp = SqliteCheckpointer(path)
    app = charging_graph(cp, charges)
    await app.ainvoke(user("m1"), {"thread_id": "t1"})
    assert charges == [1]
    if how == "deleted":
        remove_db(path)
    else:  # another database moved into its place (a restore, a reset by rename)
        other = SqliteCheckpointer(tmp_path / "fresh.db")
        await other.asetup()
        await other.arelease()
        remove_db(path)
        os.rename(tmp_path / "fresh.db", path)
    with pytest.raises(StorageError, match="no longer the file this process opened") as err:
        await app.ainvoke(user("m2"), {"thread_id": "t2"})
    assert err.value.error_code.startswith("STORAGE")
    assert charges == [1], "the tool ran on a turn nobody could read back"
    await cp.arelease()
    # A checkpointer opened now uses the file at the path, and the failed turn left nothing.
    fresh = SqliteCheckpointer(path)
    assert await fresh.aget_state({"thread_id": "t2"}) is None
    await charging_graph(fresh, charges).ainvoke(user("m3"), {"thread_id": "t3"})
    assert charges == [1, 1]
    await fresh.arelease()


@pytest.mark.asyncio
async def test_a_relative_path_keeps_working_after_the_process_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite keeps the absolute name of a file opened by a relative one; the check must too."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    charges: list[int] = []
    cp = SqliteCheckpointer("agent.db")
    app = charging_graph(cp, charges)
    await app.ainvoke(user("m1"), {"thread_id": "t1"})
    monkeypatch.chdir(tmp_path / "b")
    await app.ainvoke(user("m2"), {"thread_id": "t1"})
    assert charges == [1, 1]
    assert not (tmp_path / "b" / "agent.db").exists()
    await cp.arelease()


@pytest.mark.asyncio
async def test_a_relative_path_names_the_file_of_the_directory_it_was_given_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file opens on first use: a relative path given before a chdir still names the file
    where the checkpointer was made, as when it opened at once."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    cp = SqliteCheckpointer("agent.db")
    assert cp.db_path == "agent.db"
    monkeypatch.chdir(tmp_path / "b")
    await cp.asetup()
    await cp.arelease()
    assert (tmp_path / "a" / "agent.db").exists() and not (tmp_path / "b" / "agent.db").exists()
