"""Several processes invoking one thread at (nearly) the same moment.

    results = race("myapp.agent:build", "t-1", db=db, inputs="charge order 4821", workers=2)
    assert sum(r.completed for r in results) >= 1

Each worker is a child process that imports ``target`` (``"package.module:factory"``, a
function ``factory(checkpointer) -> CompiledGraph``), opens its own checkpointer on ``db``,
then waits at a file barrier until every worker is ready, and runs ``ainvoke`` once. The result
says, per worker, whether the run completed or which exception it raised (class name and
``error_code``, e.g. ``StaleStateError`` / ``STORAGE_CONFLICT_001``): the caller asserts its
contract, typically with an :class:`~tenxgraph.testing.effects.EffectCounter`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenxgraph.testing._children import (
    DRIVER,
    ChildException,
    base_spec,
    child_failed,
    describe_rc,
    exception_of,
    kill_group,
    read_result,
    Workdir,
    write_spec,
    child_env,
    normalize_input,
    parse_failpoints,
)

__all__ = ["WorkerResult", "race"]


@dataclass
class WorkerResult:
    """One worker's outcome: ``"completed"`` or ``"error"`` (then ``exception`` says which).

    ``started`` / ``finished`` are wall-clock times (``time.time()``) at the barrier's release and
    at the end of the run; ``pid`` matches the ``pid`` of the effects this worker recorded.
    """

    index: int
    outcome: str
    pid: int
    returncode: int
    stdout: str
    stderr: str
    exception: ChildException | None = None
    messages: list[str] = field(default_factory=list)
    status: str | None = None
    started: float | None = None
    finished: float | None = None

    @property
    def completed(self) -> bool:
        """Whether the worker's run returned."""
        return self.outcome == "completed"

    @property
    def error_type(self) -> str | None:
        """The class name of the exception the worker's run raised, or None."""
        return self.exception.type if self.exception else None

    @property
    def error_code(self) -> str | None:
        """The ``error_code`` of the exception the worker's run raised, or None."""
        return self.exception.error_code if self.exception else None

    def __str__(self) -> str:
        return f"worker {self.index} (pid {self.pid}): " + ("completed" if self.completed else str(self.exception))


def _logs(log: Path) -> tuple[str, str]:
    def read(p: Path) -> str:
        try:
            return p.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return ""

    return read(log.with_suffix(".out")), read(log.with_suffix(".err"))


def _inputs_per_worker(inputs: Any, workers: int) -> list[dict[str, Any]]:
    if isinstance(inputs, (str, Mapping)) or inputs is None or not isinstance(inputs, Sequence):
        one = normalize_input(inputs)
        return [one] * workers  # the same message (same id) for every worker: a retried request
    items = list(inputs)
    if len(items) != workers:
        raise ValueError(f"inputs has {len(items)} items for {workers} workers: give one per worker, or a single "
                         "input (str or dict) for all")
    return [normalize_input(i) for i in items]


def race(
    target: str,
    thread_id: str,
    *,
    db: str | os.PathLike[str],
    inputs: Any,
    workers: int = 2,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    schema: str | None = None,
    checkpointer_kwargs: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    failpoints: str | None = None,
    stagger: float = 0.0,
    workdir: str | os.PathLike[str] | None = None,
) -> list[WorkerResult]:
    """Starts ``workers`` child processes that each run ``ainvoke(input, {"thread_id": ...})`` on
    the same thread, released together by a file barrier once all have built their graph and
    opened the database. Returns one :class:`WorkerResult` per worker, in worker order.

    ``inputs``: a single input (None, a str, a dict) given to every worker as the *same*
    message (same id), or a list of exactly ``workers`` inputs (distinct messages).
    ``failpoints``: armed in every worker (``TENXGRAPH_FAILPOINTS``), e.g. a ``delay(MS)`` that
    holds the first run at a point while a staggered second one arrives.
    ``stagger``: worker ``i`` starts ``i * stagger`` seconds after the barrier (0: all at once),
    to probe a later arrival (e.g. one that loads the thread after another's first commit).
    Workers build their graphs and open the database one at a time, before the barrier.
    Raises AssertionError (with stderr) when a worker cannot set up, dies, or exceeds ``timeout``.
    """
    if workers < 2:
        raise ValueError("a race needs at least 2 workers")
    if stagger < 0:
        raise ValueError(f"stagger must be >= 0, got {stagger}")
    if failpoints is not None:
        parse_failpoints(failpoints)
    per_worker = _inputs_per_worker(inputs, workers)
    what = f"race({target!r}, {thread_id!r}) worker"
    procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    with Workdir(workdir) as wd:
        barrier_dir = wd / f"barrier-{os.getpid()}-{time.monotonic_ns()}"
        barrier_dir.mkdir()
        child_environ = child_env(failpoints=failpoints, env=env)
        try:
            for i, data in enumerate(per_worker):
                spec = base_spec("race", target, thread_id, db, data, config, False, schema, checkpointer_kwargs)
                spec["barrier"] = {"dir": str(barrier_dir), "index": i, "workers": workers,
                                   "timeout": max(1.0, timeout / 2), "delay": i * stagger}
                spec_path, result_path = write_spec(wd, f"race{i}", spec)
                # Output to files, not pipes: a worker blocked on a full pipe could stall the others.
                log = spec_path.with_suffix(".log")
                with open(log.with_suffix(".out"), "wb") as out_f, open(log.with_suffix(".err"), "wb") as err_f:
                    # A session of its own: what is left of its group once it ends is killed (see
                    # _children.run_child), so a process a tool started does not outlive the race.
                    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(spec_path)], env=child_environ,
                                            stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f, cwd=os.getcwd(),
                                            start_new_session=True)
                procs.append((proc, result_path, log))
            deadline = time.monotonic() + timeout
            for i, (proc, _, log) in enumerate(procs):
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    raise child_failed(f"{what} {i}", f"did not finish within {timeout}s (killed)", *_logs(log)) from None
        finally:
            for proc, _, _ in procs:
                kill_group(proc)
        results = []
        for i, (proc, result_path, log) in enumerate(procs):
            rc = proc.returncode
            out, err = _logs(log)
            report = read_result(result_path)
            if report is None:
                raise child_failed(f"{what} {i}", f"{describe_rc(rc)} without reporting a result", out, err)
            if report.get("outcome") == "setup_error":
                exc = report["exception"]
                raise child_failed(f"{what} {i}", f"could not set up: {exc['type']}: {exc['message']}", out, err,
                                    report)
            results.append(WorkerResult(
                index=i, outcome=report["outcome"], pid=int(report.get("pid", proc.pid)), returncode=rc, stdout=out,
                stderr=err, exception=exception_of(report) if report["outcome"] == "error" else None,
                messages=list(report.get("messages", [])), status=report.get("status"),
                started=report.get("started"), finished=report.get("finished"),
            ))
    return results
