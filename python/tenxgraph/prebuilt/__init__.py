"""Prebuilt agents (``tenxgraph.prebuilt.agent``) and tools (``tenxgraph.prebuilt.tools``)."""
