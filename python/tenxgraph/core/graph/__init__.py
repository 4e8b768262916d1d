"""Graph building and running."""

from tenxgraph.core.graph.compiled_graph import CompiledGraph
from tenxgraph.core.graph.edge import Edge
from tenxgraph.core.graph.node import Node
from tenxgraph.core.graph.state_graph import StateGraph

__all__ = ["CompiledGraph", "Edge", "Node", "StateGraph"]
