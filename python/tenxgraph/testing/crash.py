"""Crash a user's graph at an exact point in a child process, then resume it in a fresh one.

    result = run_until_crash("myapp.agent:build", "t-1", db=db,
                             failpoints="after_tool:charge_card=kill")
    assert result.killed
    resumed = resume("myapp.agent:build", "t-1", db=db)
    assert resumed.status == "completed"

``target`` is an import string ``"package.module:factory"`` naming a function
``factory(checkpointer) -> CompiledGraph``: your own graph builder, given the checkpointer the
child opens on ``db`` (a SQLite file path, or a ``postgresql://`` DSN). The child runs
``python -c`` with this module's small driver; the parent's ``sys.path`` reaches it through
``PYTHONPATH``, so whatever your test can import, the child can too.

``run_until_crash`` arms the failpoints through ``TENXGRAPH_FAILPOINTS`` in the child's
environment (syntax: ``point[:target][@n]=action``, ``;``-separated; see docs/testing-kit.md).
``resume`` runs ``ainvoke(input or {}, {"thread_id": ...})`` in a fresh child with no failpoints.
Both raise ``AssertionError`` (with the child's stderr) when the child failed in a way the test
did not ask for: the target did not import, the database did not open, the timeout passed, the
child died of anything but SIGKILL, or (``run_until_crash``) no kill/raise failpoint fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenxgraph.testing._children import (
    ChildException,
    FAILPOINT_POINTS,
    FAILPOINTS_ENV,
    Workdir,
    base_spec,
    child_env,
    child_failed,
    describe_rc,
    exception_of,
    normalize_input,
    parse_failpoints,
    read_result,
    redact_db,
    run_child,
    write_spec,
)
from tenxgraph.testing.effects import EFFECTS_ENV, EffectCounter

__all__ = [
    "FAILPOINTS_ENV",
    "FAILPOINT_POINTS",
    "ChildException",
    "CrashKit",
    "CrashResult",
    "ResumeResult",
    "parse_failpoints",
    "resume",
    "run_until_crash",
]


@dataclass
class CrashResult:
    """What ``run_until_crash``'s child did.

    ``killed``: it died of SIGKILL (returncode -9, the ``kill`` action). ``exception``: the run
    raised (a ``raise`` failpoint gives ``FailpointError``). ``completed``: the run returned
    (then ``messages``, ``message_dicts`` and ``status`` are set). ``status`` is the thread's stored status after
    a raise too, when it could be read.
    """

    returncode: int
    killed: bool
    stdout: str
    stderr: str
    failpoints: str
    exception: ChildException | None = None
    completed: bool = False
    messages: list[str] = field(default_factory=list)
    status: str | None = None
    message_dicts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        """True when the child died of SIGKILL or its run raised: ``killed or exception is not None``.

        Neither half proves a failpoint fired. ``exception`` is whatever the run raised: a
        ``raise`` failpoint's ``FailpointError``, but just as well an unrelated error (a tool's own
        bug, a database error), which also gives ``crashed=True, killed=False``; check
        ``exception.is_failpoint``. ``killed`` is any SIGKILL, a ``kill`` failpoint's or another's
        (the OOM killer, say)."""
        return self.killed or self.exception is not None


@dataclass
class ResumeResult:
    """A finished ``resume``: the result messages' texts (``message_dicts`` whole, as JSON),
    the thread's final status (``"completed"``, ``"interrupted_before"``, ...), the child's
    output."""

    messages: list[str]
    status: str
    stdout: str
    stderr: str
    returncode: int = 0
    message_dicts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> str | None:
        """The last result message's text, or None when there was none."""
        return self.messages[-1] if self.messages else None


# --------------------------------------------------------------------------- parent side



def run_until_crash(
    target: str,
    thread_id: str,
    *,
    failpoints: str,
    db: str | os.PathLike[str],
    input: Any = None,  # noqa: A002 - the name of the run's input in the API
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    schema: str | None = None,
    checkpointer_kwargs: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    stream: bool = False,
    expect_crash: bool | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> CrashResult:
    """Runs ``target``'s graph on ``thread_id`` in a child process with ``failpoints`` armed
    (``TENXGRAPH_FAILPOINTS``) until it is killed, raises or finishes.

    ``input``: None (one user message "hello"), a str (one user message), or a dict
    (``{"messages": [...]}``, Message objects or their JSON dicts). ``config`` adds run config
    keys (``user_id``, ``tool_timeout``, ...); ``stream=True`` runs ``astream`` instead of
    ``ainvoke`` (needed for ``mid_stream``). ``schema`` / ``checkpointer_kwargs`` go to the
    checkpointer (``schema`` only for Postgres).

    ``expect_crash`` (default: True when any entry is ``kill`` or ``raise``): a child that
    finished normally then fails the call with AssertionError: a failpoint that never fired
    (a misspelt tool or node name, an ``@n`` too high) must not make a crash test pass.
    """
    entries = parse_failpoints(failpoints)
    if expect_crash is None:
        expect_crash = any(e["action"] in ("kill", "raise") for e in entries)
    spec = base_spec("run", target, thread_id, db, normalize_input(input), config, stream, schema,
                      checkpointer_kwargs)
    what = f"run_until_crash({target!r}, {thread_id!r}, failpoints={failpoints!r}) child"
    with Workdir(workdir) as wd:
        spec_path, result_path = write_spec(wd, "crash", spec)
        rc, out, err = run_child(spec_path, child_env(failpoints=failpoints, env=env), timeout, what)
        result = read_result(result_path)
    killed = rc == -signal.SIGKILL
    res = CrashResult(returncode=rc, killed=killed, stdout=out, stderr=err, failpoints=failpoints)
    if killed:
        return res
    if result is None:
        raise child_failed(what, f"{describe_rc(rc)} without reporting a result", out, err)
    outcome = result.get("outcome")
    if outcome == "setup_error":
        raise child_failed(what, f"could not set up the graph: {result['exception']['type']}: "
                            f"{result['exception']['message']}", out, err, result)
    res.status = result.get("status")
    if outcome == "error":
        res.exception = exception_of(result)
        return res
    if outcome == "completed":
        res.completed = True
        res.messages = list(result.get("messages", []))
        res.message_dicts = list(result.get("message_dicts", []))
        if expect_crash:
            raise child_failed(
                what, f"the run completed (status {res.status!r}) but no kill/raise failpoint fired: check the "
                "point and target names (a tool name for before_tool/after_tool/after_record, a node name for "
                "the others) and @n; pass expect_crash=False if finishing is fine", out, err)
        return res
    raise child_failed(what, f"{describe_rc(rc)} with an unknown outcome {outcome!r}", out, err)


def resume(
    target: str,
    thread_id: str,
    *,
    db: str | os.PathLike[str],
    input: Any = None,  # noqa: A002
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    schema: str | None = None,
    checkpointer_kwargs: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    stream: bool = False,
    workdir: str | os.PathLike[str] | None = None,
) -> ResumeResult:
    """Continues ``thread_id`` in a fresh child process: ``ainvoke(input or {}, {"thread_id": ...})``
    with no failpoints armed (unless ``env`` arms some). Raises AssertionError with the child's
    stderr when the run raises or the child dies."""
    spec = base_spec("resume", target, thread_id, db, normalize_input(input, default_text=None), config, stream,
                      schema, checkpointer_kwargs)
    what = f"resume({target!r}, {thread_id!r}) child"
    with Workdir(workdir) as wd:
        spec_path, result_path = write_spec(wd, "resume", spec)
        rc, out, err = run_child(spec_path, child_env(env=env), timeout, what)
        result = read_result(result_path)
    if result is None:
        raise child_failed(what, f"{describe_rc(rc)} without reporting a result", out, err)
    outcome = result.get("outcome")
    if outcome == "setup_error":
        raise child_failed(what, f"could not set up the graph: {result['exception']['type']}: "
                            f"{result['exception']['message']}", out, err, result)
    if outcome == "error":
        raise child_failed(what, f"the resumed run raised {exception_of(result)} (thread status "
                            f"{result.get('status')!r})", out, err, result)
    if outcome != "completed" or rc != 0:
        raise child_failed(what, f"{describe_rc(rc)} with outcome {outcome!r}", out, err)
    return ResumeResult(messages=list(result["messages"]), status=str(result.get("status")), stdout=out, stderr=err,
                        returncode=rc, message_dicts=list(result.get("message_dicts", [])))


# --------------------------------------------------------------------------- the kit


class CrashKit:
    """``run_until_crash`` / ``resume`` / ``race`` bound to one test: their files go to
    ``workdir`` (kept for a failed test's post-mortem), ``db`` defaults to the test's SQLite
    file, and ``effects`` is the test's :class:`EffectCounter` (``$TENXGRAPH_EFFECTS``)."""

    def __init__(self, workdir: str | os.PathLike[str], db: str | os.PathLike[str] | None = None,
                 effects: EffectCounter | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.db = os.fspath(db) if db is not None else str(self.workdir / "kit.db")
        self.effects = effects

    def __repr__(self) -> str:
        return f"CrashKit(workdir={str(self.workdir)!r}, db={redact_db(self.db)!r})"

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        if self.effects is None:
            return dict(env) if env else None
        return {EFFECTS_ENV: str(self.effects.path), **(env or {})}

    def run_until_crash(self, target: str, thread_id: str, *, failpoints: str, db: str | os.PathLike[str] | None = None,
                        env: Mapping[str, str] | None = None, **kw: Any) -> CrashResult:
        """``run_until_crash`` with this kit's workdir, effects environment and default database."""
        return run_until_crash(target, thread_id, failpoints=failpoints, db=db if db is not None else self.db,
                               env=self._env(env), workdir=self.workdir, **kw)

    def resume(self, target: str, thread_id: str, *, db: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None, **kw: Any) -> ResumeResult:
        """``resume`` with this kit's workdir, effects environment and default database."""
        return resume(target, thread_id, db=db if db is not None else self.db, env=self._env(env),
                      workdir=self.workdir, **kw)

    def race(self, target: str, thread_id: str, *, inputs: Any, db: str | os.PathLike[str] | None = None,
             env: Mapping[str, str] | None = None, **kw: Any) -> list[Any]:
        """``tenxgraph.testing.race.race`` with this kit's workdir, effects environment and default
        database."""
        from tenxgraph.testing.race import race

        return race(target, thread_id, db=db if db is not None else self.db, inputs=inputs, env=self._env(env),
                    workdir=self.workdir, **kw)


# --------------------------------------------------------------------------- child side


def _import_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj


def _open_checkpointer(db: dict[str, Any]) -> Any:
    if db["kind"] == "postgres":
        from tenxgraph.storage.checkpointer import PgCheckpointer

        return PgCheckpointer(db["db"], **db["kwargs"])
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    return SqliteCheckpointer(db["db"], **db["kwargs"])


def _exc_json(exc: BaseException) -> dict[str, Any]:
    context = getattr(exc, "context", None)
    try:
        context = json.loads(json.dumps(context, default=str)) if isinstance(context, dict) else {}
    except (TypeError, ValueError):
        context = {}
    code = getattr(exc, "error_code", None)
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": getattr(exc, "message", str(exc)),
            "error_code": code if isinstance(code, str) else None, "context": context}


def _write_json_atomic(path: str, obj: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def _setup_lock(barrier: dict[str, Any] | None) -> Iterator[None]:
    """Race workers open the database one at a time (the race is about the run, not about
    creating the schema: SQLite's first migration is not safe to run from several processes at
    once), then meet at the barrier."""
    if not barrier:
        yield
        return
    import fcntl

    with open(Path(barrier["dir"]) / "setup.lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class _BarrierTimeout(Exception):
    pass


def _wait_barrier(barrier: dict[str, Any]) -> float:
    """Touches our ready file, waits for every worker's, returns the wall time we went."""
    directory, index, workers = Path(barrier["dir"]), int(barrier["index"]), int(barrier["workers"])
    (directory / f"ready.{index}").touch()
    deadline = time.monotonic() + float(barrier.get("timeout", 30))
    while True:
        if all((directory / f"ready.{i}").exists() for i in range(workers)):
            if barrier.get("delay"):
                time.sleep(float(barrier["delay"]))
            return time.time()
        if time.monotonic() > deadline:
            raise _BarrierTimeout(f"worker {index}: the other workers never reached the start barrier")
        time.sleep(0.0005)


async def _child_run(spec: dict[str, Any], app: Any, checkpointer: Any, report: dict[str, Any]) -> None:
    from tenxgraph.core.state.message import Message

    config = dict(spec["config"])
    input_data = dict(spec["input"])
    if isinstance(input_data.get("messages"), list):
        input_data["messages"] = [Message.model_validate(m) for m in input_data["messages"]]
    if spec.get("barrier"):  # as late as possible: the workers' runs start within a poll interval
        report["started"] = _wait_barrier(spec["barrier"])
    try:
        if spec.get("stream"):
            produced = []
            async for chunk in app.astream(input_data, config):
                if chunk.message is not None and not chunk.message.delta:
                    produced.append(chunk.message)
            messages = produced
        else:
            result = await app.ainvoke(input_data, config)
            messages = list(result.get("messages", []))
        report["outcome"] = "completed"
        report["messages"] = [m.text() for m in messages]
        report["message_dicts"] = [m.model_dump(mode="json") for m in messages]
    except Exception as exc:
        report["outcome"] = "error"
        report["exception"] = _exc_json(exc)
        report["traceback"] = traceback.format_exc()
        print(report["traceback"], file=sys.stderr, flush=True)
    report["finished"] = time.time()
    with contextlib.suppress(Exception):
        state = await checkpointer.aget_state({"thread_id": config["thread_id"],
                                               **({"user_id": config["user_id"]} if "user_id" in config else {})})
        if state is not None:
            report["status"] = str(state.execution_meta.status)
    with contextlib.suppress(Exception):
        await app.aclose()


def _child_main(spec_path: str) -> int:
    """The child process: build the graph, (race: meet the others), run once, report as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    report: dict[str, Any] = {"pid": os.getpid()}
    try:
        with _setup_lock(spec.get("barrier")):
            factory = _import_target(spec["target"])
            checkpointer = _open_checkpointer(spec["db"])
            app = factory(checkpointer)
        if not hasattr(app, "ainvoke"):
            raise TypeError(f"{spec['target']}(checkpointer) returned {type(app).__name__}, not a compiled graph")
    except Exception as exc:
        report.update(outcome="setup_error", exception=_exc_json(exc), traceback=traceback.format_exc())
        print(report["traceback"], file=sys.stderr, flush=True)
        _write_json_atomic(spec["result"], report)
        return 3
    try:
        asyncio.run(_child_run(spec, app, checkpointer, report))
    except _BarrierTimeout as exc:
        report.update(outcome="setup_error", exception=_exc_json(exc), traceback=traceback.format_exc())
        _write_json_atomic(spec["result"], report)
        return 3
    _write_json_atomic(spec["result"], report)
    return 0 if report["outcome"] == "completed" else 1

