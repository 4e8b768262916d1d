"""``BaseContextManager`` at 10xGraph 0.10's module path (it lives in :mod:`.context_manager`)."""

from tenxgraph.core.state.context_manager import BaseContextManager

__all__ = ["BaseContextManager"]
