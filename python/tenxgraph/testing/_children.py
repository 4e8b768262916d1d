"""The parent side of the testing kit's child processes, shared by ``crash`` and ``race``:
failpoint specs, the run spec a child reads, its environment, and how its result or failure is read
back. Both import it; neither imports the other's private names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ChildException",
    "DEFAULT_TEXT",
    "DRIVER",
    "FAILPOINTS_ENV",
    "FAILPOINT_POINTS",
    "Workdir",
    "base_spec",
    "child_env",
    "child_failed",
    "describe_rc",
    "exception_of",
    "normalize_input",
    "parse_failpoints",
    "read_result",
    "redact_db",
    "run_child",
    "write_spec",
]

FAILPOINTS_ENV = "TENXGRAPH_FAILPOINTS"
FAILPOINT_POINTS = ("before_tool", "after_tool", "after_record", "after_step", "in_step_tx", "mid_stream",
                    "lease_renew", "after_lease", "before_input_tx")
DEFAULT_TEXT = "hello"

_ENTRY_RE = re.compile(
    r"^\s*(?P<point>[a-z_]+)\s*(?::(?P<target>[^@=]+?))?\s*(?:@(?P<nth>[^=]*))?=\s*(?P<action>.+?)\s*$"
)
_DELAY_RE = re.compile(r"^delay\(\s*(\d+)\s*\)$")

# The child's whole program: everything else is in _child_main, importable and readable.
DRIVER = "import sys; from tenxgraph.testing.crash import _child_main; sys.exit(_child_main(sys.argv[1]))"


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




def _is_postgres(db: str) -> bool:
    return db.startswith(("postgres://", "postgresql://"))


def redact_db(db: str) -> str:
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


class Workdir:
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


def write_spec(workdir: Path, label: str, spec: dict[str, Any]) -> tuple[Path, Path]:
    stem = f"{label}-{uuid.uuid4().hex[:8]}"
    spec_path, result_path = workdir / f"{stem}.spec.json", workdir / f"{stem}.result.json"
    spec["result"] = str(result_path)
    spec_path.write_text(json.dumps(spec))
    return spec_path, result_path


def read_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode(errors="replace")


def describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"died of {signal.Signals(-rc).name}"
        except ValueError:
            return f"died of signal {-rc}"
    return f"exited with code {rc}"


def child_failed(what: str, reason: str, stdout: str, stderr: str, result: dict[str, Any] | None = None) -> AssertionError:
    parts = [f"{what}: {reason}"]
    if result and result.get("traceback"):
        parts.append("child traceback:\n" + result["traceback"].rstrip())
    parts.append("child stderr:\n" + (stderr.rstrip()[-8000:] or "(empty)"))
    if stdout.strip():
        parts.append("child stdout:\n" + stdout.rstrip()[-4000:])
    return AssertionError("\n".join(parts))


def exception_of(result: dict[str, Any]) -> ChildException:
    e = result["exception"]
    return ChildException(type=e["type"], module=e["module"], message=e["message"], error_code=e.get("error_code"),
                          context=e.get("context") or {}, traceback=result.get("traceback", ""))


def run_child(spec_path: Path, env: dict[str, str], timeout: float, what: str) -> tuple[int, str, str]:
    """Runs the driver on ``spec_path``; returns its returncode, stdout and stderr.

    Output goes to files next to the spec, not to pipes: a process a tool started inherits the
    child's output descriptors, and a reader waiting for EOF on a pipe would wait for that
    grandchild too, long after the child itself died. The child leads a session of its own, and
    whatever is left of its process group once it has ended is SIGKILLed, so a killed child's
    strays do not outlive the test (a grandchild that started a session of its own escapes this).
    """
    cmd = [sys.executable, "-c", DRIVER, str(spec_path)]
    out_path, err_path = spec_path.with_suffix(".out"), spec_path.with_suffix(".err")
    with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                                cwd=os.getcwd(), start_new_session=True)
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        kill_group(proc)
    out, err = _read_text(out_path), _read_text(err_path)
    if timed_out:
        raise child_failed(what, f"did not finish within {timeout}s (killed); a hung tool, or a delay() "
                            "failpoint longer than the timeout?", out, err)
    return proc.returncode, out, err


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILLs what is left of ``proc``'s process group (it leads a session of its own), then reaps it."""
    # The group id is the child's pid (start_new_session), still reserved while any member lives,
    # so this cannot hit an unrelated group even after the child itself was reaped.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_text(path: Path) -> str:
    try:
        return _text(path.read_bytes())
    except FileNotFoundError:
        return ""


def base_spec(mode: str, target: str, thread_id: str, db: str | os.PathLike[str] | None, input_data: dict[str, Any],
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
