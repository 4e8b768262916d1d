"""GraphRecursionError: the recursion limit was reached (10xGraph 0.10's module path; the classes live in :mod:`tenxgraph.core.exceptions`)."""

from tenxgraph.core.exceptions import GraphRecursionError

__all__ = ["GraphRecursionError"]
