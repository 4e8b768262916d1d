"""The errors the prebuilt agents and tools raise; each carries an ``error_code``
(docs/error-codes.md). Each is also the builtin type 10xGraph raises in the same case
(``ValueError``, ``ImportError``, ``NotImplementedError``), so existing ``except`` clauses still
catch them."""

from __future__ import annotations

from typing import Any

from tenxgraph.core.exceptions import GraphError

__all__ = ["PrebuiltConfigError", "PrebuiltExtraMissingError", "PrebuiltNotSupportedError"]


class _PrebuiltError(GraphError):
    default_code = "PREBUILT_000"

    def __init__(self, message: str, error_code: str | None = None, context: dict[str, Any] | None = None) -> None:
        super().__init__(message, error_code or self.default_code, context)


class PrebuiltConfigError(_PrebuiltError, ValueError):
    """A prebuilt agent was constructed with arguments it cannot run with (``PREBUILT_001``):
    no workers or members, an unknown entry member, ``top_k < 1``, a reserved node name. Raised
    by the constructor, before any graph exists."""

    default_code = "PREBUILT_001"


class PrebuiltExtraMissingError(_PrebuiltError, ImportError):
    """A prebuilt piece needs a package that is not installed (``PREBUILT_002``); the message
    names the package and the ``pip install`` that brings it. Raised when the piece is
    constructed or called, never at import."""

    default_code = "PREBUILT_002"


class PrebuiltNotSupportedError(_PrebuiltError, NotImplementedError):
    """A prebuilt name 10xGraph has that tenxgraph does not provide (``PREBUILT_003``), e.g.
    ``AudioAgent``: importable, so a module that only imports it loads; constructing it raises."""

    default_code = "PREBUILT_003"
