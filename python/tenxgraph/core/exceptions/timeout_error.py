"""NodeTimeoutError and GraphStopRequested (10xGraph 0.10's module path; the classes live in :mod:`tenxgraph.core.exceptions`)."""

from tenxgraph.core.exceptions import NodeTimeoutError, GraphStopRequested

__all__ = ["NodeTimeoutError", "GraphStopRequested"]
