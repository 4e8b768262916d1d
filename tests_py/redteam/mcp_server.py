"""tests_py/mcp_kit/server.py in a child process on a free loopback port, for the red-team tests;
``calls(tool)`` reads what reached it (it counts on its side, fsynced before it answers)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class McpServer:
    url: str
    calls_file: Path
    process: subprocess.Popen[bytes]

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.calls_file.exists():
            return []
        rows = [json.loads(x) for x in self.calls_file.read_text().splitlines() if x.strip()]
        return [r for r in rows if tool is None or r["tool"] == tool]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.calls():
            out[r["tool"]] = out.get(r["tool"], 0) + 1
        return out

    def reset(self) -> None:
        self.calls_file.write_text("")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mcp_server(directory: Path, module: str = "tests_py.mcp_kit.server") -> Iterator[McpServer]:
    calls = directory / "calls.jsonl"
    calls.write_text("")
    port = free_port()
    env = dict(os.environ, MCP_CALLS=str(calls), PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-m", module, str(port)], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:  # polled until it listens: its start-up on a loaded machine
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                if child.poll() is not None:
                    raise AssertionError(f"the MCP server died: {child.stderr.read().decode()[-2000:]}") from None
                assert time.monotonic() < deadline, "the MCP server never listened"
                time.sleep(0.05)
        yield McpServer(f"http://127.0.0.1:{port}/mcp", calls, child)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
