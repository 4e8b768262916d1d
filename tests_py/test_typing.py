"""The package is typed: stubs for the native module match it, and py.typed ships."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tenxgraph


def test_py_typed_marker_ships() -> None:
    assert (Path(tenxgraph.__file__).parent / "py.typed").exists()


def test_native_stub_matches_the_extension() -> None:
    pytest.importorskip("mypy")
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "tenxgraph._core"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
