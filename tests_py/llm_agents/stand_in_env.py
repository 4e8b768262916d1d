"""The fixture body the provider tests share: a stand-in started, its env vars set for the SDK
(others that would send the SDK elsewhere removed), stopped at the end."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest


def serving(stand_in: type, monkeypatch: pytest.MonkeyPatch, drop: Iterable[str] = ()) -> Iterator[Any]:
    for name in drop:
        monkeypatch.delenv(name, raising=False)
    with stand_in() as server:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        yield server
