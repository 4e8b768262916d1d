"""``SqliteCheckpointer(path)`` takes a file name, as 10xGraph's does. It was read as a
``sqlite://`` URL: ``%41`` was decoded (``report%41.db`` was the file ``reportA.db``, so two
checkpointers on two paths shared their threads), a ``?`` cut the name and was refused as a URL
parameter, and a name starting with ``file:`` was opened as an SQLite URI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import SqliteCheckpointer

NAMES = ["report%41.db", "what?.db", "a#b.db", "with space.db", "x.db?mode=ro", "file:lit.db", "é.db"]


@pytest.mark.asyncio
async def test_every_path_is_the_file_of_that_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # `file:lit.db` is relative: it must be a file here, not a URI
    for name in NAMES:
        cp = SqliteCheckpointer(name)
        await cp.aput_messages({"thread_id": "t"}, [Message.text_message(f"in {name}")])
        await cp.arelease()
    files = sorted(p for p in os.listdir(tmp_path) if not p.endswith(("-wal", "-shm")))
    assert files == sorted(NAMES)
    # Each file holds its own thread: none was another's under a decoded name.
    for name in NAMES:
        cp = SqliteCheckpointer(tmp_path / name)
        got = [m.text() for m in await cp.alist_messages({"thread_id": "t"})]
        await cp.arelease()
        assert got == [f"in {name}"], name


@pytest.mark.asyncio
async def test_a_decoded_twin_is_another_file(tmp_path: Path) -> None:
    a = SqliteCheckpointer(tmp_path / "report%41.db")
    await a.aput_messages({"thread_id": "t"}, [Message.text_message("secret of A")])
    await a.arelease()
    b = SqliteCheckpointer(tmp_path / "reportA.db")
    assert await b.alist_messages({"thread_id": "t"}) == []
    await b.arelease()


@pytest.mark.asyncio
async def test_dot_dot_after_a_symlinked_directory_is_where_the_kernel_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``link/../app.db`` with ``link -> real/sub`` is ``real/app.db`` for the kernel, SQLite and
    10xGraph; normalising the text first (``os.path.abspath``) made it ``work/app.db``."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "link").symlink_to(tmp_path / "real" / "sub")
    monkeypatch.chdir(tmp_path / "work")
    cp = SqliteCheckpointer("link/../app.db")
    await cp.asetup()
    await cp.arelease()
    assert (tmp_path / "real" / "app.db").exists() and not (tmp_path / "work" / "app.db").exists()
