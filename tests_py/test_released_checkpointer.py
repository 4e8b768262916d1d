"""A checkpointer used after ``arelease()`` (or after ``aclose()`` of another graph compiled with
it): the error must say so and must not be one a caller is told to retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenxgraph.core.exceptions import StorageError, TransientStorageError
from tests_py.conftest import make_checkpointer


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_released_checkpointer_fails_for_good_not_transiently(kind: str, request: pytest.FixtureRequest,
                                                                      tmp_path: Path) -> None:
    """Postgres raised TransientStorageError "the database is unreachable" after arelease: the
    docs say retry it, and no retry could ever pass (a retry loop spun for ever)."""
    cp = make_checkpointer(kind, request, tmp_path)
    cfg = {"thread_id": "released"}
    await cp.aget_state(cfg)
    await cp.arelease()
    for call in (lambda: cp.aget_state(cfg), lambda: cp.alist_threads(cfg)):
        with pytest.raises(StorageError) as err:
            await call()
        assert not isinstance(err.value, TransientStorageError), repr(err.value)
        assert err.value.error_code == "STORAGE_001", repr(err.value)
        if kind == "postgres":
            assert "closed" in str(err.value), str(err.value)
