"""NodeError: a node raised (10xGraph 0.10's module path; the classes live in :mod:`tenxgraph.core.exceptions`)."""

from tenxgraph.core.exceptions import NodeError

__all__ = ["NodeError"]
