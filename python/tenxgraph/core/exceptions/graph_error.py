"""GraphError, the base of the graph's errors (10xGraph 0.10's module path; the classes live in :mod:`tenxgraph.core.exceptions`)."""

from tenxgraph.core.exceptions import GraphError

__all__ = ["GraphError"]
