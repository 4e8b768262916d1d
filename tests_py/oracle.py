"""Differential tests: the same script run on the real 10xGraph 0.10.0 and on tenxgraph.

    def test_same_messages(oracle):
        theirs, ours = oracle.run_both(SCRIPT)
        assert ours["messages"] == theirs["messages"]

A script is Python source that imports ``tenxgraph`` as a user would and ends by calling
``emit(obj)`` with something JSON-serialisable; ``emit`` (and ``fresh_container()``, to call
before compiling each graph of a script that compiles several) is defined before the script runs. The
reference is 10xGraph 0.10.0 from the package registry in a Python 3.12+ venv of its own (it also
imports as ``tenxgraph``, so it can never share ours). The venv is built once per machine, in
``$TENXGRAPH_ORACLE_VENV`` or ``~/.cache/tenxgraph/oracle-10xgraph-0.10.0``. Where no Python 3.12+
can be found, or the registry cannot be reached, the tests that need it are skipped with a message
that says why (never silently passed).

Both sides run as child processes with the same environment, so neither sees the other's modules
and a script can use real Postgres / Redis DSNs passed through ``env``.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from oracle_venv import build_oracle_venv  # noqa: E402

from tests_py import oracle_spawn  # noqa: E402

import pytest  # noqa: E402

_MARK = "__TENX_ORACLE_EMIT__"
_PRELUDE = f"""
import json as _json, sys as _sys
def emit(obj):
    _sys.stdout.write({_MARK!r} + _json.dumps(obj, default=repr) + "\\n")
    _sys.stdout.flush()
def fresh_container():
    # 10xGraph binds the first compiled graph's checkpointer in InjectQ for good: a script that
    # compiles several graphs calls this before each (tenxgraph has no InjectQ: a no-op there).
    try:
        from injectq import InjectQ
        from injectq.core.context import ContainerContext
    except ImportError:
        return
    InjectQ.reset_instance()
    ContainerContext.clear_current()
"""


@dataclass
class Oracle:
    """Runs scripts on 10xGraph 0.10.0 (``python``) and on tenxgraph (this interpreter)."""

    python: str
    workdir: Path

    def _run(self, python: str, script: str, env: Mapping[str, str] | None, timeout: float, side: str) -> Any:
        path = self.workdir / f"script_{side}.py"
        path.write_text(_PRELUDE + textwrap.dedent(script))
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        if side == "ours":
            # Our package as this test session imports it (an editable install or a source tree).
            import tenxgraph

            child_env["PYTHONPATH"] = str(Path(tenxgraph.__file__).resolve().parent.parent)
        child_env.update(env or {})
        # 10xGraph's side through the fork server (oracle_spawn.py): its imports take 3-4 s a process.
        r = oracle_spawn.run(python, [str(path)], env=child_env, cwd=self.workdir, timeout=timeout)
        emitted = [line[len(_MARK):] for line in r.stdout.splitlines() if line.startswith(_MARK)]
        if r.returncode != 0 or not emitted:
            raise AssertionError(f"{side} run failed (rc={r.returncode}):\n--- stdout\n{r.stdout[-3000:]}"
                                 f"\n--- stderr\n{r.stderr[-3000:]}")
        results = [json.loads(e) for e in emitted]
        return results[0] if len(results) == 1 else results

    def run_theirs(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float = 120) -> Any:
        return self._run(self.python, script, env, timeout, "theirs")

    def run_ours(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float = 120) -> Any:
        return self._run(sys.executable, script, env, timeout, "ours")

    def run_both(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float = 120) -> tuple[Any, Any]:
        """(10xGraph's emitted value, tenxgraph's emitted value) for the same script."""
        return self.run_theirs(script, env=env, timeout=timeout), self.run_ours(script, env=env, timeout=timeout)


_cached: tuple[str | None, str] | None = None


@pytest.fixture
def oracle(tmp_path: Path) -> Oracle:
    """The reference runner; skips (with the reason) where 10xGraph 0.10.0 cannot be installed."""
    global _cached
    if _cached is None:
        _cached = build_oracle_venv()
    python, why = _cached
    if python is None:
        pytest.skip(f"differential test skipped: {why}")
    return Oracle(python=python, workdir=tmp_path)
