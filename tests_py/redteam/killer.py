"""A child process running one turn of a graph, killed with SIGKILL at a random moment.

The child (the crash kit's driver, tenxgraph.testing.crash) touches a ready file just before it
calls ``ainvoke`` (its one-worker start barrier); the delay is counted from there, so the kill
lands inside the run, not in the interpreter's start-up. A child that finished before its
kill is reported as such (``killed`` False)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenxgraph.testing._children import DRIVER, base_spec, child_env, normalize_input, write_spec

START_TIMEOUT = 120.0  # a loaded CI machine: importing the SDKs can be slow
RUN_TIMEOUT = 120.0


@dataclass
class Outcome:
    killed: bool
    result: dict[str, Any] | None
    stderr: str


def run_once(workdir: Path, label: str, target: str, thread_id: str, db: str, *, text: str | None,
             kill_after: float | None, env: dict[str, str], stream: bool = False) -> Outcome:
    """Runs ``target`` on ``thread_id`` (a new turn with ``text``, or a resume with None; through
    ``astream`` with ``stream``); with ``kill_after``, SIGKILLs it that many seconds after it
    starts the run."""
    workdir.mkdir(parents=True, exist_ok=True)
    barrier = workdir / f"{label}.barrier"
    barrier.mkdir()
    input_data = normalize_input(text, default_text=None)
    spec = base_spec("run" if text else "resume", target, thread_id, db, input_data, None, stream, None, None)
    spec["barrier"] = {"dir": str(barrier), "index": 0, "workers": 1, "timeout": START_TIMEOUT}
    spec_path, result_path = write_spec(workdir, label, spec)
    err_path = workdir / f"{label}.stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(spec_path)], env=child_env(env=env),
                                stdout=subprocess.DEVNULL, stderr=err)
        killed = False
        try:
            if kill_after is not None:
                ready = barrier / "ready.0"
                deadline = time.monotonic() + START_TIMEOUT
                while not ready.exists() and proc.poll() is None:  # polled: the child's start-up
                    assert time.monotonic() < deadline, f"{label}: the child never started its run"
                    time.sleep(0.002)
                if proc.poll() is None:
                    time.sleep(kill_after)  # the random moment itself, not a wait for something
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGKILL)
            rc = proc.wait(timeout=RUN_TIMEOUT)
            killed = rc == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    return Outcome(killed, result, err_path.read_text(errors="replace"))
