"""Tools the client runs (10xGraph's client-side tools): their validated declaration, and
attaching them to a graph's ToolNode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tenxgraph.core.exceptions import GraphError

if TYPE_CHECKING:
    from tenxgraph.core.graph.state_graph import StateGraph

__all__ = ["RemoteToolConfig", "attach_remote_tools"]


def _empty_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}, "required": []}


class RemoteToolConfig(BaseModel):
    """A client-run tool as the model sees it, and the ToolNode that offers it (``node``, or
    ``node_name``). Unknown fields are refused, so a typo fails at startup."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    node_name: str = Field(alias="node", min_length=1)
    name: str = Field(min_length=1)
    description: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=_empty_parameters)

    @field_validator("node_name", "name", "description")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be blank")
        return value

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        params = dict(value)
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        params.setdefault("required", [])
        if params["type"] != "object":
            raise ValueError("remote tool parameters.type must be 'object'")
        if not isinstance(params["properties"], dict):
            raise ValueError("remote tool parameters.properties must be an object")
        if not isinstance(params["required"], list) or not all(isinstance(r, str) for r in params["required"]):
            raise ValueError("remote tool parameters.required must be a list of strings")
        return params

    def to_tool_schema(self) -> dict[str, Any]:
        """The OpenAI function schema the ToolNode advertises."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def _schema_name(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    fn = schema.get("function")
    name = fn.get("name") if isinstance(fn, dict) else schema.get("name")
    return name if isinstance(name, str) and name.strip() else None


def attach_remote_tools(builder: StateGraph[Any], tools: list[Any], node_name: str | None) -> None:
    """See ``CompiledGraph.attach_remote_tools``. Everything is checked before anything is
    attached, so a bad entry leaves every ToolNode as it was."""
    from tenxgraph.core.graph.tool_node import ToolNode

    if not isinstance(tools, list):
        raise TypeError(f"tools must be a list, got {type(tools).__name__}")
    grouped: dict[str, list[dict[str, Any]]] = {}
    if node_name is None:
        configs = [t if isinstance(t, RemoteToolConfig) else RemoteToolConfig.model_validate(t) for t in tools]
        seen: set[str] = set()
        for c in configs:
            if c.name in seen:
                raise ValueError(f"Duplicate remote tool name '{c.name}'")
            seen.add(c.name)
            grouped.setdefault(c.node_name, []).append(c.to_tool_schema())
    else:
        schemas = []
        for t in tools:
            if isinstance(t, RemoteToolConfig):
                if t.node_name != node_name:
                    raise ValueError(f"Remote tool '{t.name}' targets node '{t.node_name}', not '{node_name}'")
                schemas.append(t.to_tool_schema())
            elif _schema_name(t) is None:
                raise ValueError(f"remote tool schema without a name: {t!r}")
            else:
                schemas.append(dict(t))
        grouped[node_name] = schemas
    targets: dict[str, Any] = {}
    for name in grouped:
        node = builder.nodes.get(name)
        if node is None:
            raise GraphError(message=f"Node '{name}' not found in graph", error_code="GRAPH_004",
                             context={"node_name": name})
        if not isinstance(node.func, ToolNode):
            raise GraphError(message=f"Node '{name}' is not a ToolNode", error_code="GRAPH_005",
                             context={"node_name": name})
        targets[name] = node.func
    for name, schemas in grouped.items():
        targets[name].set_remote_tool(schemas)
