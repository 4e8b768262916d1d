"""StateGraph building and compile-time validation (spec §2.1, §2.2, §2.3 generate_graph)."""

from __future__ import annotations

import pytest

from tenxgraph import END, START, AgentState, StateGraph
from tenxgraph.core.exceptions import GraphError
from tenxgraph.core.graph import CompiledGraph, Edge, Node
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


class NoteState(AgentState):
    note: str = "preset"


def alpha(state):
    return "a"


def beta(state):
    return "b"


def cond(state):
    return "x"


# -- add_node ------------------------------------------------------------------------------


def test_add_node_with_callable_only_uses_function_name() -> None:
    g = StateGraph()
    assert g.add_node(alpha) is g
    assert "alpha" in g.nodes
    assert isinstance(g.nodes["alpha"], Node)
    assert g.nodes["alpha"].func is alpha
    assert g.nodes["alpha"].name == "alpha"


def test_add_node_with_name_and_callable() -> None:
    g = StateGraph()
    g.add_node("custom", alpha)
    assert g.nodes["custom"].func is alpha
    assert "alpha" not in g.nodes


def test_builder_starts_with_start_and_end_nodes() -> None:
    g = StateGraph()
    assert set(g.nodes) == {START, END}
    assert g.edges == []
    assert g.entry_point is None
    assert g.compiled is False


@pytest.mark.parametrize(
    "args",
    [
        ("name",),  # a name with no function
        ("name", "not callable"),
        (123, alpha),  # name is not a str
        (alpha, beta),  # two callables
        (None,),
    ],
    ids=["name-only", "non-callable-func", "int-name", "two-callables", "none"],
)
def test_add_node_invalid_arguments(args: tuple) -> None:
    g = StateGraph()
    with pytest.raises(ValueError, match="Invalid arguments for add_node"):
        g.add_node(*args)


def test_add_node_duplicate_name_replaces() -> None:
    g = StateGraph()
    g.add_node("n", alpha)
    g.add_node("n", beta)
    assert g.nodes["n"].func is beta
    assert list(g.nodes).count("n") == 1


# -- edges and entry point -----------------------------------------------------------------


def test_add_edge_from_start_sets_entry_point() -> None:
    g = StateGraph()
    g.add_node(alpha)
    assert g.add_edge(START, "alpha") is g
    assert g.entry_point == "alpha"
    assert len(g.edges) == 1
    e = g.edges[0]
    assert isinstance(e, Edge)
    assert (e.from_node, e.to_node, e.condition, e.condition_result) == (START, "alpha", None, None)


def test_add_edge_not_from_start_leaves_entry_point() -> None:
    g = StateGraph()
    g.add_node(alpha).add_node(beta)
    g.add_edge("alpha", "beta")
    assert g.entry_point is None
    assert [(e.from_node, e.to_node) for e in g.edges] == [("alpha", "beta")]


def test_set_entry_point_sets_and_adds_start_edge() -> None:
    g = StateGraph()
    g.add_node(alpha)
    assert g.set_entry_point("alpha") is g
    assert g.entry_point == "alpha"
    assert [(e.from_node, e.to_node) for e in g.edges] == [(START, "alpha")]


def test_add_conditional_edges_with_path_map() -> None:
    g = StateGraph()
    g.add_node(alpha).add_node(beta)
    assert g.add_conditional_edges("alpha", cond, {"go": "beta", "stop": END}) is g
    assert len(g.edges) == 2
    got = [(e.from_node, e.to_node, e.condition, e.condition_result) for e in g.edges]
    assert got == [("alpha", "beta", cond, "go"), ("alpha", END, cond, "stop")]


def test_add_conditional_edges_without_path_map() -> None:
    g = StateGraph()
    g.add_node(alpha)
    g.add_conditional_edges("alpha", cond)
    assert len(g.edges) == 1
    e = g.edges[0]
    assert (e.from_node, e.to_node, e.condition, e.condition_result) == ("alpha", "", cond, None)


def test_override_node_replaces_existing() -> None:
    g = StateGraph()
    g.add_node("n", alpha)
    assert g.override_node("n", beta) is g
    assert g.nodes["n"].func is beta


def test_override_node_unknown_raises_keyerror() -> None:
    g = StateGraph()
    with pytest.raises(KeyError):
        g.override_node("missing", alpha)


def test_compiled_override_node_unknown_raises_keyerror() -> None:
    g = StateGraph()
    g.add_node(alpha).set_entry_point("alpha")
    app = g.compile()
    with pytest.raises(KeyError):
        app.override_node("missing", beta)


# -- state prototype -----------------------------------------------------------------------


def test_state_class_is_instantiated() -> None:
    g = StateGraph(NoteState)
    assert type(g._state) is NoteState
    assert g._state.note == "preset"


def test_state_instance_is_kept_as_prototype() -> None:
    proto = NoteState(note="custom")
    g = StateGraph(proto)
    assert g._state is proto


def test_default_state_is_agent_state() -> None:
    assert type(StateGraph()._state) is AgentState


# -- compile validation --------------------------------------------------------------------


def _code(excinfo: pytest.ExceptionInfo) -> str:
    assert type(excinfo.value) is GraphError
    return excinfo.value.error_code


def test_compile_without_entry_point_is_graph_002() -> None:
    g = StateGraph()
    g.add_node(alpha).add_node(beta)
    g.add_edge("alpha", "beta")
    with pytest.raises(GraphError) as ei:
        g.compile()
    assert _code(ei) == "GRAPH_002"
    assert g.compiled is False


def test_compile_orphan_node_is_graph_003() -> None:
    g = StateGraph()
    g.add_node(alpha).add_node(beta)
    g.set_entry_point("alpha")
    with pytest.raises(GraphError) as ei:
        g.compile()
    assert _code(ei) == "GRAPH_003"
    assert "beta" in str(ei.value)


def test_compile_edge_to_missing_node_is_graph_004() -> None:
    g = StateGraph()
    g.add_node(alpha)
    g.set_entry_point("alpha")
    g.add_edge("alpha", "ghost")
    with pytest.raises(GraphError) as ei:
        g.compile()
    assert _code(ei) == "GRAPH_004"
    assert "ghost" in str(ei.value)


def test_compile_path_map_target_missing_is_graph_004() -> None:
    g = StateGraph()
    g.add_node(alpha)
    g.set_entry_point("alpha")
    g.add_conditional_edges("alpha", cond, {"x": "ghost"})
    with pytest.raises(GraphError) as ei:
        g.compile()
    assert _code(ei) == "GRAPH_004"


def test_conditional_edge_without_path_map_empty_target_is_accepted() -> None:
    g = StateGraph()
    g.add_node(alpha)
    g.set_entry_point("alpha")
    g.add_conditional_edges("alpha", cond)
    assert isinstance(g.compile(), CompiledGraph)


@pytest.mark.parametrize("kind", ["interrupt_before", "interrupt_after"])
def test_compile_unknown_interrupt_node_is_graph_004(kind: str) -> None:
    g = StateGraph()
    g.add_node(alpha)
    g.set_entry_point("alpha")
    with pytest.raises(GraphError) as ei:
        g.compile(**{kind: ["nope"]})
    assert _code(ei) == "GRAPH_004"
    assert "nope" in str(ei.value)


def test_compile_with_known_interrupt_nodes_succeeds() -> None:
    g = StateGraph()
    g.add_node(alpha).add_node(beta)
    g.set_entry_point("alpha")
    g.add_edge("alpha", "beta")
    app = g.compile(interrupt_before=["beta"], interrupt_after=["alpha"])
    assert app.interrupt_before == ["beta"]
    assert app.interrupt_after == ["alpha"]
    assert g.compiled is True


def test_compile_without_checkpointer_creates_in_memory() -> None:
    g = StateGraph(NoteState)
    g.add_node(alpha).set_entry_point("alpha")
    app = g.compile()
    assert isinstance(app._checkpointer, InMemoryCheckpointer)
    assert app._checkpointer.state_type is NoteState


def test_compile_binds_state_type_on_given_checkpointer() -> None:
    cp = InMemoryCheckpointer()
    g = StateGraph(NoteState)
    g.add_node(alpha).set_entry_point("alpha")
    app = g.compile(checkpointer=cp)
    assert app._checkpointer is cp
    assert cp.state_type is NoteState


def test_compile_rejects_non_checkpointer() -> None:
    g = StateGraph()
    g.add_node(alpha).set_entry_point("alpha")
    with pytest.raises(TypeError):
        g.compile(checkpointer=object())


# -- generate_graph ------------------------------------------------------------------------


def test_generate_graph_shape() -> None:
    g = StateGraph(NoteState)
    g.add_node(alpha).add_node(beta)
    g.set_entry_point("alpha")
    g.add_conditional_edges("alpha", cond, {"x": "beta", "y": END})
    g.add_edge("beta", END)
    data = g.compile().generate_graph()
    assert set(data) == {"info", "nodes", "edges"}
    assert isinstance(data["info"], dict)
    assert data["info"]["entry_point"] == "alpha"
    names = {n["name"] for n in data["nodes"]}
    assert {"alpha", "beta", START, END} <= names
    for n in data["nodes"]:
        assert set(n) >= {"id", "name"}
    pairs = [(e["source"], e["target"]) for e in data["edges"]]
    assert pairs == [(START, "alpha"), ("alpha", "beta"), ("alpha", END), ("beta", END)]
    ids = [e["id"] for e in data["edges"]]
    assert len(set(ids)) == len(ids)
    for e in data["edges"]:
        assert set(e) >= {"id", "source", "target"}


def test_two_fixed_edges_out_of_one_node_is_graph_005() -> None:
    """(session 31) The loop followed the first and the other branch never ran, without a word
    (10xGraph the same): there are no parallel branches. The same edge twice is still one edge."""
    def gamma(state: AgentState) -> AgentState:
        return state

    g = StateGraph()
    g.add_node(alpha).add_node(beta).add_node(gamma)
    g.set_entry_point("alpha")
    g.add_edge("alpha", "beta").add_edge("alpha", "gamma")
    g.add_edge("beta", END).add_edge("gamma", END)
    with pytest.raises(GraphError) as ei:
        g.compile()
    assert _code(ei) == "GRAPH_005" and "'beta' and 'gamma'" in str(ei.value)
    g = StateGraph()
    g.add_node(alpha).add_node(beta)
    g.set_entry_point("alpha")
    g.add_edge("alpha", "beta").add_edge("alpha", "beta").add_edge("beta", END)
    g.compile()
