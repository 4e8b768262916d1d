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
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

FAILPOINTS_ENV = "TENXGRAPH_FAILPOINTS"
FAILPOINT_POINTS = ("before_tool", "after_tool", "after_record", "after_step", "in_step_tx", "mid_stream",
                    "lease_renew", "after_lease")
DEFAULT_TEXT = "hello"

_ENTRY_RE = re.compile(
    r"^\s*(?P<point>[a-z_]+)\s*(?::(?P<target>[^@=]+?))?\s*(?:@(?P<nth>[^=]*))?=\s*(?P<action>.+?)\s*$"
)
_DELAY_RE = re.compile(r"^delay\(\s*(\d+)\s*\)$")

# The child's whole program: everything else is in _child_main, importable and readable.
_DRIVER = "import sys; from tenxgraph.testing.crash import _child_main; sys.exit(_child_main(sys.argv[1]))"


# --------------------------------------------------------------------------- failpoint syntax


def parse_failpoints(spec: str) -> list[dict[str, Any]]:
    """Checks a ``TENXGRAPH_FAILPOINTS`` string the way the core parses it; returns its entries
    as ``{"point", "target", "nth", "action", "delay_ms"}``. Raises ``ValueError`` with the bad
    entry, so a typo fails the test at once instead of arming nothing."""
    if not isinstance(spec, str):
        raise TypeError(f"failpoints must be a str, got {type(spec).__name__}")
    entries = []
    for raw in (s.strip() for s in spec.split(";")):
        if not raw:
            continue
        m = _ENTRY_RE.match(raw)
        if not m:
            raise ValueError(f"failpoint {raw!r}: expected point[:target][@n]=action")
        point, target, nth_s, action = m["point"], m["target"], m["nth"], m["action"]
        if point not in FAILPOINT_POINTS:
            raise ValueError(f"failpoint {raw!r}: unknown point {point!r} (one of {', '.join(FAILPOINT_POINTS)})")
        nth = 1
        if nth_s is not None:
            if not nth_s.strip().isdigit() or int(nth_s) < 1:
                raise ValueError(f"failpoint {raw!r}: @n must be a positive integer, got {nth_s!r}")
            nth = int(nth_s)
        delay_ms = None
        if action in ("kill", "raise"):
            pass
        elif d := _DELAY_RE.match(action):
            delay_ms = int(d[1])
            action = "delay"
        else:
            raise ValueError(f"failpoint {raw!r}: unknown action {action!r} (kill, raise, delay(MS))")
        entries.append({"point": point, "target": target.strip() if target else None, "nth": nth,
                        "action": action, "delay_ms": delay_ms})
    if not entries:
        raise ValueError("failpoints is empty: give at least one point[:target][@n]=action")
    return entries


# --------------------------------------------------------------------------- results


@dataclass
class ChildException:
    """An exception raised by the graph run in the child: class name, ``error_code`` (None for
    an exception without one), message, ``context`` and the formatted traceback."""

    type: str
    module: str
    message: str
    error_code: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    traceback: str = ""

    @property
    def is_failpoint(self) -> bool:
        """A ``raise`` failpoint fired (``FailpointError``, ``FAILPOINT_001``)."""
        return self.type == "FailpointError" or self.error_code == "FAILPOINT_001"

    def __str__(self) -> str:
        code = f" [{self.error_code}]" if self.error_code else ""
        return f"{self.type}{code}: {self.message}"


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
        return self.messages[-1] if self.messages else None


# --------------------------------------------------------------------------- parent side


def _is_postgres(db: str) -> bool:
    return db.startswith(("postgres://", "postgresql://"))


def _redact(db: str) -> str:
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", db)


def _db_spec(db: str | os.PathLike[str] | None, schema: str | None, checkpointer_kwargs: Mapping[str, Any] | None
             ) -> dict[str, Any]:
    if db is None:
        raise ValueError("db is required: a SQLite file path or a postgresql:// DSN")
    db_s = os.fspath(db)
    if not isinstance(db_s, str) or not db_s:
        raise ValueError(f"db must be a SQLite path or a postgresql:// DSN, got {db!r}")
    kw = dict(checkpointer_kwargs or {})
    if _is_postgres(db_s):
        if schema is not None:
            kw["schema"] = schema
        return {"kind": "postgres", "db": db_s, "kwargs": kw}
    if schema is not None:
        raise ValueError("schema= is for a Postgres DSN; db here is a SQLite path")
    return {"kind": "sqlite", "db": os.path.abspath(db_s), "kwargs": kw}


def _check_target(target: str) -> None:
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(f"target must be 'package.module:factory', got {target!r}")


def _message_json(m: Any) -> Any:
    from tenxgraph.core.state.message import Message

    if isinstance(m, Message):
        return m.model_dump(mode="json")
    return m


def normalize_input(value: Any, *, default_text: str | None = DEFAULT_TEXT) -> dict[str, Any]:
    """A run input as JSON: None -> one user message ``default_text`` (or ``{}`` when
    ``default_text`` is None); a str -> one user message with that text; a dict -> as given,
    with ``Message`` objects in ``"messages"`` dumped to JSON. The message ids are fixed here,
    in the parent: the same input given twice is the same message."""
    from tenxgraph.core.state.message import Message

    if value is None:
        if default_text is None:
            return {}
        value = default_text
    if isinstance(value, str):
        return {"messages": [Message.text_message(value).model_dump(mode="json")]}
    if isinstance(value, Message):
        return {"messages": [value.model_dump(mode="json")]}
    if not isinstance(value, Mapping):
        raise TypeError(f"input must be None, a str, a Message or a dict, got {type(value).__name__}")
    out = dict(value)
    if isinstance(out.get("messages"), list):
        out["messages"] = [_message_json(m) for m in out["messages"]]
    try:
        json.dumps(out)
    except (TypeError, ValueError) as e:
        raise TypeError(f"input must be JSON-serialisable (it goes to a child process): {e}") from None
    return out


def child_env(*, failpoints: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours, ``PYTHONPATH`` = our ``sys.path`` (minus the interpreter's
    own directories) + the old ``PYTHONPATH``, unbuffered output (a SIGKILLed child's prints are
    kept), ``TENXGRAPH_FAILPOINTS`` = ``failpoints`` or removed, then ``env`` on top."""
    out = dict(os.environ)
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    paths: list[str] = []
    for p in sys.path:
        p = os.path.abspath(p or os.getcwd())
        real = os.path.realpath(p)
        if any(real == pre or real.startswith(pre + os.sep) for pre in prefixes):
            continue  # stdlib and site-packages: the child's interpreter has them already
        if p not in paths and os.path.isdir(p):
            paths.append(p)
    for p in out.get("PYTHONPATH", "").split(os.pathsep):
        if p and p not in paths:
            paths.append(p)
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out["PYTHONUNBUFFERED"] = "1"
    out.pop(FAILPOINTS_ENV, None)
    if failpoints:
        out[FAILPOINTS_ENV] = failpoints
    if env:
        out.update({str(k): str(v) for k, v in env.items()})
    return out


class _Workdir:
    """Where specs and results go: the caller's directory (kept), or a temporary one (removed)."""

    def __init__(self, workdir: str | os.PathLike[str] | None) -> None:
        self._tmp = workdir is None
        self.path = Path(tempfile.mkdtemp(prefix="tenx-crash-")) if workdir is None else Path(workdir)
        self.path.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: Any) -> None:
        if self._tmp:
            shutil.rmtree(self.path, ignore_errors=True)


def _write_spec(workdir: Path, label: str, spec: dict[str, Any]) -> tuple[Path, Path]:
    stem = f"{label}-{uuid.uuid4().hex[:8]}"
    spec_path, result_path = workdir / f"{stem}.spec.json", workdir / f"{stem}.result.json"
    spec["result"] = str(result_path)
    spec_path.write_text(json.dumps(spec))
    return spec_path, result_path


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode(errors="replace")


def _describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"died of {signal.Signals(-rc).name}"
        except ValueError:
            return f"died of signal {-rc}"
    return f"exited with code {rc}"


def _child_failed(what: str, reason: str, stdout: str, stderr: str, result: dict[str, Any] | None = None) -> AssertionError:
    parts = [f"{what}: {reason}"]
    if result and result.get("traceback"):
        parts.append("child traceback:\n" + result["traceback"].rstrip())
    parts.append("child stderr:\n" + (stderr.rstrip()[-8000:] or "(empty)"))
    if stdout.strip():
        parts.append("child stdout:\n" + stdout.rstrip()[-4000:])
    return AssertionError("\n".join(parts))


def _exception_of(result: dict[str, Any]) -> ChildException:
    e = result["exception"]
    return ChildException(type=e["type"], module=e["module"], message=e["message"], error_code=e.get("error_code"),
                          context=e.get("context") or {}, traceback=result.get("traceback", ""))


def _run_child(spec_path: Path, env: dict[str, str], timeout: float, what: str) -> tuple[int, str, str]:
    cmd = [sys.executable, "-c", _DRIVER, str(spec_path)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, timeout=timeout, cwd=os.getcwd())
    except subprocess.TimeoutExpired as e:  # run() has killed the child already
        raise _child_failed(what, f"did not finish within {timeout}s (killed); a hung tool, or a delay() "
                            "failpoint longer than the timeout?", _text(e.stdout), _text(e.stderr)) from None
    return proc.returncode, _text(proc.stdout), _text(proc.stderr)


def _base_spec(mode: str, target: str, thread_id: str, db: str | os.PathLike[str] | None, input_data: dict[str, Any],
               config: Mapping[str, Any] | None, stream: bool, schema: str | None,
               checkpointer_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    _check_target(target)
    if not isinstance(thread_id, str) or not thread_id:
        raise ValueError(f"thread_id must be a non-empty str, got {thread_id!r}")
    cfg = dict(config or {})
    cfg["thread_id"] = thread_id
    try:
        json.dumps(cfg)
    except (TypeError, ValueError) as e:
        raise TypeError(f"config must be JSON-serialisable (it goes to a child process): {e}") from None
    return {"mode": mode, "target": target, "db": _db_spec(db, schema, checkpointer_kwargs), "input": input_data,
            "config": cfg, "stream": bool(stream)}


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
    spec = _base_spec("run", target, thread_id, db, normalize_input(input), config, stream, schema,
                      checkpointer_kwargs)
    what = f"run_until_crash({target!r}, {thread_id!r}, failpoints={failpoints!r}) child"
    with _Workdir(workdir) as wd:
        spec_path, result_path = _write_spec(wd, "crash", spec)
        rc, out, err = _run_child(spec_path, child_env(failpoints=failpoints, env=env), timeout, what)
        result = _read_result(result_path)
    killed = rc == -signal.SIGKILL
    res = CrashResult(returncode=rc, killed=killed, stdout=out, stderr=err, failpoints=failpoints)
    if killed:
        return res
    if result is None:
        raise _child_failed(what, f"{_describe_rc(rc)} without reporting a result", out, err)
    outcome = result.get("outcome")
    if outcome == "setup_error":
        raise _child_failed(what, f"could not set up the graph: {result['exception']['type']}: "
                            f"{result['exception']['message']}", out, err, result)
    res.status = result.get("status")
    if outcome == "error":
        res.exception = _exception_of(result)
        return res
    if outcome == "completed":
        res.completed = True
        res.messages = list(result.get("messages", []))
        res.message_dicts = list(result.get("message_dicts", []))
        if expect_crash:
            raise _child_failed(
                what, f"the run completed (status {res.status!r}) but no kill/raise failpoint fired: check the "
                "point and target names (a tool name for before_tool/after_tool/after_record, a node name for "
                "the others) and @n; pass expect_crash=False if finishing is fine", out, err)
        return res
    raise _child_failed(what, f"{_describe_rc(rc)} with an unknown outcome {outcome!r}", out, err)


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
    spec = _base_spec("resume", target, thread_id, db, normalize_input(input, default_text=None), config, stream,
                      schema, checkpointer_kwargs)
    what = f"resume({target!r}, {thread_id!r}) child"
    with _Workdir(workdir) as wd:
        spec_path, result_path = _write_spec(wd, "resume", spec)
        rc, out, err = _run_child(spec_path, child_env(env=env), timeout, what)
        result = _read_result(result_path)
    if result is None:
        raise _child_failed(what, f"{_describe_rc(rc)} without reporting a result", out, err)
    outcome = result.get("outcome")
    if outcome == "setup_error":
        raise _child_failed(what, f"could not set up the graph: {result['exception']['type']}: "
                            f"{result['exception']['message']}", out, err, result)
    if outcome == "error":
        raise _child_failed(what, f"the resumed run raised {_exception_of(result)} (thread status "
                            f"{result.get('status')!r})", out, err, result)
    if outcome != "completed" or rc != 0:
        raise _child_failed(what, f"{_describe_rc(rc)} with outcome {outcome!r}", out, err)
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
        return f"CrashKit(workdir={str(self.workdir)!r}, db={_redact(self.db)!r})"

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        if self.effects is None:
            return dict(env) if env else None
        return {EFFECTS_ENV: str(self.effects.path), **(env or {})}

    def run_until_crash(self, target: str, thread_id: str, *, failpoints: str, db: str | os.PathLike[str] | None = None,
                        env: Mapping[str, str] | None = None, **kw: Any) -> CrashResult:
        return run_until_crash(target, thread_id, failpoints=failpoints, db=db if db is not None else self.db,
                               env=self._env(env), workdir=self.workdir, **kw)

    def resume(self, target: str, thread_id: str, *, db: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None, **kw: Any) -> ResumeResult:
        return resume(target, thread_id, db=db if db is not None else self.db, env=self._env(env),
                      workdir=self.workdir, **kw)

    def race(self, target: str, thread_id: str, *, inputs: Any, db: str | os.PathLike[str] | None = None,
             env: Mapping[str, str] | None = None, **kw: Any) -> list[Any]:
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

