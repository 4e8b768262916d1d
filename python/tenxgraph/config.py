"""``10xgraph.json``: the project file that names the graph, the checkpointer and the env file.

    {"graph": "graph.agent:app", "checkpointer": "graph.agent:checkpointer", "env": ".env"}

``graph`` is spelled ``agent`` in 10xGraph's files; both are accepted. The other keys 10xGraph's
server reads (``auth``, ``store``, ``redis``, ``rate_limit``, ...) are accepted and ignored here.
Import paths are ``module:attribute``, with modules found relative to the file's directory; the
env file is loaded (without overriding variables already set) before anything is imported.
Every problem raises :class:`ConfigError`, which names the file, the key and what is wrong.
"""

from __future__ import annotations

import difflib
import importlib
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["CONFIG_FILE", "ConfigError", "TenxConfig", "load_config"]

CONFIG_FILE = "10xgraph.json"
_log = logging.getLogger("tenxgraph.config")

# Keys 10xGraph's own tooling reads; accepted so one file serves both, not used by this runtime.
_PASSTHROUGH_KEYS = frozenset({
    "auth", "authorization", "evaluation", "injectq", "observability", "rate_limit", "redis", "store",
    "test", "thread_name_generator", "websocket",
})
_KEYS = frozenset({"graph", "agent", "checkpointer", "env"})
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")  # whole string: fullmatch (no "$\n")


class ConfigError(ValueError):
    """A problem with a ``10xgraph.json``: ``path``, ``key`` (None for the file as a whole) and
    ``problem``; ``error_code`` is stable (CONFIG_001 ... CONFIG_006)."""

    def __init__(self, path: Path | str, key: str | None, problem: str, error_code: str) -> None:
        self.path = str(path)
        self.key = key
        self.problem = problem
        self.error_code = error_code
        where = f"{self.path}: key {key!r}" if key else self.path
        super().__init__(f"[{error_code}] {where}: {problem}")


class TenxConfig(BaseModel):
    """A loaded ``10xgraph.json``. Paths in it are relative to ``root`` (the file's directory)."""

    model_config = ConfigDict(frozen=True)

    path: Path
    graph: str | None = None
    checkpointer: str | None = None
    env: str | None = None
    # Keys of 10xGraph's tooling, kept as written.
    passthrough: dict[str, Any] = {}

    @property
    def root(self) -> Path:
        """The directory holding the config file: ``env`` resolves from it, and graph modules are
        imported with it on ``sys.path``."""
        return self.path.parent

    def load_env(self) -> dict[str, str]:
        """Loads the env file into ``os.environ`` (variables already set win) and returns what it
        defines. No ``env`` key: nothing."""
        if self.env is None:
            return {}
        env_path = (self.root / self.env).resolve()
        if not env_path.is_file():
            raise ConfigError(self.path, "env", f"env file {str(env_path)!r} does not exist", "CONFIG_006")
        values = _parse_env(env_path, self.path)
        for k, v in values.items():
            os.environ.setdefault(k, v)
        return values

    def load_checkpointer(self) -> Any:
        """The checkpointer object: from ``checkpointer``, else the one the graph was compiled with."""
        from tenxgraph.storage.checkpointer import BaseCheckpointer

        if self.checkpointer is not None:
            obj = self._import("checkpointer", self.checkpointer)
            if not isinstance(obj, BaseCheckpointer):
                raise ConfigError(self.path, "checkpointer",
                                  f"{self.checkpointer!r} is a {type(obj).__name__}, not a tenxgraph checkpointer "
                                  "(InMemoryCheckpointer, SqliteCheckpointer, PgCheckpointer)", "CONFIG_005")
            return obj
        if self.graph is not None:
            return self.load_graph()._checkpointer
        raise ConfigError(self.path, "checkpointer", "neither 'checkpointer' nor 'graph' is set", "CONFIG_003")

    def load_graph(self) -> Any:
        """The compiled graph named by ``graph``."""
        from tenxgraph.core.graph.compiled_graph import CompiledGraph

        if self.graph is None:
            raise ConfigError(self.path, "graph", "not set", "CONFIG_003")
        obj = self._import("graph", self.graph)
        if not isinstance(obj, CompiledGraph):
            raise ConfigError(self.path, "graph",
                              f"{self.graph!r} is a {type(obj).__name__}, not a compiled graph (StateGraph.compile())",
                              "CONFIG_005")
        return obj

    def _import(self, key: str, target: str) -> Any:
        self.load_env()
        module_name, _, attr = target.partition(":")
        root = str(self.root.resolve())
        if root not in sys.path:
            sys.path.insert(0, root)
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise ConfigError(self.path, key, f"module {module_name!r} not found (searched from {root})",
                                  "CONFIG_004") from exc
            raise ConfigError(self.path, key, f"importing {module_name!r} failed: {exc}", "CONFIG_004") from exc
        except (Exception, SystemExit) as exc:  # a module that exits at import is a failed import too
            raise ConfigError(self.path, key, f"importing {module_name!r} failed: {type(exc).__name__}: {exc}",
                              "CONFIG_004") from exc
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise ConfigError(self.path, key, f"module {module_name!r} has no attribute {attr!r}",
                                  "CONFIG_004") from exc
        return obj


def load_config(path: str | os.PathLike[str] | None = None) -> TenxConfig:
    """Reads and checks ``10xgraph.json`` (default: the one in the current directory). Imports
    nothing yet: ``load_graph()`` / ``load_checkpointer()`` do, after ``load_env()``."""
    file = Path(path) if path is not None else Path.cwd() / CONFIG_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(file, None, "file not found", "CONFIG_001") from None
    except OSError as exc:
        raise ConfigError(file, None, f"cannot be read: {exc.strerror or exc}", "CONFIG_001") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(file, None, f"is not UTF-8 text: {exc}", "CONFIG_002") from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(file, None, f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                          "CONFIG_002") from exc
    except RecursionError:
        raise ConfigError(file, None, "not valid JSON here: nested too deeply", "CONFIG_002") from None
    if not isinstance(raw, dict):
        raise ConfigError(file, None, f"must be a JSON object, got {type(raw).__name__}", "CONFIG_002")

    values: dict[str, str | None] = {}
    for key in ("graph", "agent", "checkpointer", "env"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(file, key, f"must be a non-empty string, got {json.dumps(value)}", "CONFIG_003")
        if value is not None and "\0" in value:
            raise ConfigError(file, key, "holds a NUL character, which no path or name can", "CONFIG_003")
        values[key] = value
    for key in ("graph", "agent", "checkpointer"):
        value = values[key]
        if value is not None and not _IMPORT_PATH.fullmatch(value):
            raise ConfigError(file, key, f"{value!r} is not an import path of the form 'module.path:attribute'",
                              "CONFIG_003")
    graph, agent = values["graph"], values["agent"]
    if graph is not None and agent is not None and graph != agent:
        raise ConfigError(file, "agent", f"{agent!r} differs from 'graph' {graph!r}; set one of them", "CONFIG_003")
    for key in raw:
        if key in _KEYS or key in _PASSTHROUGH_KEYS:
            continue
        close = difflib.get_close_matches(key, sorted(_KEYS), n=1, cutoff=0.75)
        if close:
            raise ConfigError(file, key, f"unknown key; did you mean {close[0]!r}?", "CONFIG_003")
        _log.warning("%s: key %r is not used by tenxgraph; ignored", file, key)
    return TenxConfig(
        path=file.resolve(),
        graph=graph or agent,
        checkpointer=values["checkpointer"],
        env=values["env"],
        passthrough={k: v for k, v in raw.items() if k in _PASSTHROUGH_KEYS},
    )


def _parse_env(env_path: Path, config_path: Path) -> dict[str, str]:
    """``KEY=value`` lines (``export`` prefix, ``#`` comments and matching quotes allowed). The
    whole file is checked before anything is applied; an error names the line by number only
    (a line such as ``OPENAI_API_KEY: sk-...`` was echoed whole, and the CLI printed it)."""
    out: dict[str, str] = {}
    try:
        lines = env_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(config_path, "env", f"env file {str(env_path)!r} cannot be read: {exc}", "CONFIG_006") from exc
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export "):].lstrip()
        name, sep, value = stripped.partition("=")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(config_path, "env", f"{env_path}:{number}: expected NAME=value (the line is not "
                              "shown: it may hold a secret)", "CONFIG_006")
        value = value.strip()
        quoted = re.fullmatch(r"""(["'])(.*?)\1(\s+#.*)?""", value)
        if quoted:
            value = quoted.group(2)
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        if "\0" in value:
            raise ConfigError(config_path, "env", f"{env_path}:{number}: {name} holds a NUL character, which no "
                              "environment variable can", "CONFIG_006")
        out[name] = value
    return out
