"""The 10xGraph fork server the differential and crash tests start 10xGraph through
(tests_py/oracle_spawn.py, oracle_zygote.py): a forked run must be the process ``python script``
would be, or every differential test compares tenxgraph with something that is not 10xGraph.
Each case runs the same script both ways on the oracle venv's Python and compares."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests_py import oracle_spawn

PROBE = """
import sys
fresh = "tenxgraph" not in sys.modules
import asyncio, json, os

async def inside():
    async with asyncio.timeout(30):  # needs asyncio's current task: broken once by the preload order
        return type(asyncio.current_task()).__name__

import tenxgraph.core.graph
print(json.dumps({"fresh": fresh, "argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
                  "var": os.environ.get("PROBE_VAR"), "unset": "PROBE_UNSET" in os.environ,
                  "task": asyncio.run(inside()), "stdin": sys.stdin.read()}))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("boom")
sys.exit(int(sys.argv[1]))
"""


def _both(oracle, tmp_path: Path, arg: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PROBE_UNSET")}
    env["PROBE_VAR"] = "a:b c"
    plain = subprocess.run([oracle.python, str(script), arg], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
    os.environ["PROBE_UNSET"] = "set in the test process only"
    try:
        assert oracle_spawn._server(oracle.python, oracle.python) is not None, "the fork server did not start"
        forked = oracle_spawn.run(oracle.python, [str(script), arg], env=env, cwd=tmp_path, timeout=120)
    finally:
        del os.environ["PROBE_UNSET"]
    return plain, forked


@pytest.mark.parametrize("arg", ["0", "3", "raise"])
def test_a_forked_run_is_the_process_python_script_would_be(oracle, tmp_path: Path, arg: str) -> None:
    plain, forked = _both(oracle, tmp_path, arg)
    assert forked.returncode == plain.returncode == {"0": 0, "3": 3, "raise": 1}[arg]
    ours, theirs = json.loads(forked.stdout), json.loads(plain.stdout)
    assert ours == theirs
    assert theirs["fresh"] is True and theirs["task"] == "Task" and theirs["name"] == "__main__"
    assert theirs["var"] == "a:b c" and theirs["unset"] is False and theirs["stdin"] == ""
    assert "to stderr" in forked.stderr and "to stderr" not in forked.stdout
    if arg == "raise":
        assert "ValueError: boom" in forked.stderr and "ValueError: boom" in plain.stderr


def test_a_forked_run_killed_with_sigkill_reports_it_as_subprocess_does(oracle, tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import pathlib, time\npathlib.Path('started').write_text('1')\ntime.sleep(600)\n")
    assert oracle_spawn._server(oracle.python, oracle.python) is not None, "the fork server did not start"
    proc = oracle_spawn.spawn(oracle.python, [str(script)], env=dict(os.environ), cwd=tmp_path,
                              stdout=tmp_path / "log")
    assert isinstance(proc, oracle_spawn.ZygoteChild)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, (tmp_path / "log").read_text()
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)  # reaped by the server: no zombie left behind


@pytest.mark.parametrize("when", ["with the pid unread", "right after sending"])
def test_a_client_that_goes_away_does_not_take_the_server_with_it(oracle, tmp_path: Path, when: str) -> None:
    """A test killed by pytest-timeout inside ``ZygoteChild.__init__`` closes its connection with
    the pid unread (the server's next recv: ECONNRESET) or before it is sent (EPIPE): the first
    version exited on either, and every later 10xGraph run of that worker failed."""
    server = oracle_spawn._server(oracle.python, oracle.python)
    assert server is not None, "the fork server did not start"
    (tmp_path / "hang.py").write_text("import time\ntime.sleep(600)\n")
    (tmp_path / "ok.py").write_text("print('ok')\n")
    request = {"argv": [str(tmp_path / "hang.py")], "env": dict(os.environ), "cwd": str(tmp_path),
               "stdout": str(tmp_path / "log"), "stderr": str(tmp_path / "log")}
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(server.path)
    s.sendall(json.dumps(request).encode() + b"\n")
    if when == "with the pid unread":
        ready, _, _ = select.select([s], [], [], 60)  # the pid is in this socket's buffer, unread
        assert ready, "the server never answered"
    s.close()
    r = oracle_spawn.run(oracle.python, [str(tmp_path / "ok.py")], env=dict(os.environ), cwd=tmp_path, timeout=120)
    assert (r.returncode, r.stdout) == (0, "ok\n"), r
    assert server.proc.poll() is None, "the fork server exited"
    assert oracle_spawn._servers[oracle.python] is server
