"""``agentflow``: 10xGraph's old import name, kept as a deprecated alias of :mod:`tenxgraph`.

``import agentflow`` and ``import agentflow.<sub>`` hand back the very module objects that
``tenxgraph`` and ``tenxgraph.<sub>`` are (not copies), so ``isinstance`` checks, registries and
module-level singletons are shared between code that uses either name. One DeprecationWarning is
issued, when ``agentflow`` is first imported. 10xGraph 0.10 keeps the alias until 2.0; so do we.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

_ALIAS = "agentflow"
_TARGET = "tenxgraph"


class _Redirect(importlib.abc.Loader):
    """Loads ``agentflow.X`` by importing ``tenxgraph.X`` and returning that module itself."""

    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self._target)
        # The import system stamps the alias spec onto the module it gets back; keep the real one
        # so the module still names itself tenxgraph.X (reloads, pickling, tracebacks).
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        real = getattr(self, "_real_spec", None)
        if real is not None:
            module.__spec__ = real


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_ALIAS + "."):
            return None
        real = _TARGET + fullname[len(_ALIAS):]
        try:
            real_spec = importlib.util.find_spec(real)
        except (ImportError, ValueError):
            return None
        if real_spec is None:
            return None  # the usual ModuleNotFoundError, naming agentflow.X
        return importlib.util.spec_from_loader(
            fullname, _Redirect(real), is_package=real_spec.submodule_search_locations is not None
        )


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

warnings.warn(
    "'agentflow' is the deprecated old name of this package and goes away in 2.0; "
    "import 'tenxgraph' instead (e.g. 'from tenxgraph.core.graph import StateGraph').",
    DeprecationWarning,
    stacklevel=2,
)

# From here on `agentflow` is the tenxgraph package object itself.
sys.modules[_ALIAS] = importlib.import_module(_TARGET)
