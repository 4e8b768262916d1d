"""Lazy re-exports for package ``__init__`` modules: a name is imported from its module on first
access, so importing a package never pulls in what the caller does not use (optional extras,
the LLM layer, the Rust core's heavier pieces) and import order never matters."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, namespace: dict[str, Any], names: Mapping[str, str],
                 modules: Mapping[str, str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` pair for ``package``: ``names`` maps an exported name to the
    module that defines it, ``modules`` a submodule attribute to its module path. A resolved value
    is cached in ``namespace`` (the package's globals), so later lookups skip ``__getattr__``; an
    unknown name raises the AttributeError Python's own lookup would."""
    submodules = dict(modules or {})

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(submodules[name])
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names) | set(submodules))

    return __getattr__, __dir__
