"""The reference runtime: 10xGraph 0.10.0 from the package registry, in a Python 3.12+ venv of its
own (it imports as ``tenxgraph`` too, so it never shares ours). Used by the differential tests
(tests_py/oracle.py) and by the benchmark (bench/run_compare.sh).

    python scripts/oracle_venv.py     # prints the venv's python, or exits 3 with the reason on stderr

The venv is built once per machine, in ``$TENXGRAPH_ORACLE_VENV`` or
``~/.cache/tenxgraph/oracle-10xgraph-0.10.0``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

ORACLE_VERSION = "0.10.0"
# 10xGraph with its Postgres/Redis/SQLite drivers and the provider SDKs its Agent calls (the
# differential LLM tests point both runtimes at the same local stand-in), and fastmcp for its MCP
# tools: 2.x, because 10xGraph 0.10's MCP code does not work with fastmcp 3+ (it pings, which
# those servers answer "Method not found", and reads `inputSchema`, which mcp 2.x renamed).
ORACLE_PACKAGES = [f"10xgraph=={ORACLE_VERSION}", "asyncpg", "redis", "aiosqlite", "openai>=1.40",
                   "anthropic>=1.0.0", "google-genai>=1.56.0", "fastmcp>=2.11.3,<3", "aio-pika>=9",
                   "opentelemetry-sdk>=1.20", "opentelemetry-exporter-otlp-proto-http>=1.20"]


def _venv_dir() -> Path:
    env = os.environ.get("TENXGRAPH_ORACLE_VENV")
    return Path(env) if env else Path.home() / ".cache" / "tenxgraph" / f"oracle-10xgraph-{ORACLE_VERSION}"


def _find_python312() -> str | None:
    """A Python >= 3.12 interpreter that actually runs: one of pyenv's, or one on PATH (a pyenv shim
    on PATH may name a version that is not selected, so each candidate is asked for its version)."""
    candidates: list[str] = []
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv_root.is_dir():
        candidates += [str(v / "bin" / "python3") for v in sorted(pyenv_root.iterdir())
                       if v.name.startswith(("3.12", "3.13"))]
    candidates += [c for c in (shutil.which(n) for n in ("python3.12", "python3.13")) if c]
    for c in candidates:
        try:
            r = subprocess.run([c, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True,
                               text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == "True":
            return c
    return None


def build_oracle_venv() -> tuple[str | None, str]:
    """(python of the reference venv, "") or (None, why it cannot be had)."""
    venv = _venv_dir()
    wanted = " ".join(ORACLE_PACKAGES)
    if _complete(venv, wanted):
        return str(venv / "bin" / "python"), ""
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test workers (pytest -n) all ask for it at once: one builds, the others wait on
    # the lock and then find it complete.
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(venv, wanted):
            return str(venv / "bin" / "python"), ""
        return _build(venv, wanted)


def _complete(venv: Path, wanted: str) -> bool:
    ok = venv / ".complete"
    return ok.exists() and (venv / "bin" / "python").exists() and ok.read_text() == wanted


def _build(venv: Path, wanted: str) -> tuple[str | None, str]:
    py = venv / "bin" / "python"
    base = _find_python312()
    if base is None:
        return None, "no Python >= 3.12 on this machine (10xGraph 0.10 needs it)"
    steps = [[str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *ORACLE_PACKAGES]]
    if not py.exists():  # else the venv is kept and only brought up to the package list
        shutil.rmtree(venv, ignore_errors=True)
        steps.insert(0, [base, "-m", "venv", str(venv)])
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            return None, f"could not build the 10xGraph {ORACLE_VERSION} venv ({' '.join(cmd[:3])}...): " \
                         f"{(r.stderr or r.stdout).strip()[-400:]}"
    (venv / ".complete").write_text(wanted)
    return str(py), ""

if __name__ == "__main__":
    python, why = build_oracle_venv()
    if python is None:
        print(why, file=sys.stderr)
        sys.exit(3)
    print(python)
