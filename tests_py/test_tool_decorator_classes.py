"""``@tool``'s side-effect class is set once (helper red-team of side-effect classes, session
33). Applied again without it (stacked, or ``tool(name=...)(lib.charge)`` to rename a library's
tool) it reset an ``at_most_once`` tool to idempotent, silently: a replay ran the charge again.
Above ``@staticmethod`` the class went on the wrapper and the class's tool was a plain one."""

from __future__ import annotations

import pytest

from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.utils.tool_decorator import get_tool_metadata, tool


def test_applying_tool_again_keeps_the_declared_class() -> None:
    @tool
    @tool(side_effects="at_most_once", on_unknown="interrupt")
    async def charge(amount: int) -> str:
        """Charge."""
        return "charged"

    meta = get_tool_metadata(charge)
    assert (meta["side_effects"], meta["on_unknown"]) == ("at_most_once", "interrupt")
    renamed = tool(name="charge_card")(charge)
    assert get_tool_metadata(renamed)["name"] == "charge_card"
    assert get_tool_metadata(renamed)["side_effects"] == "at_most_once"
    assert ToolNode([renamed]).side_effects("charge_card") == "at_most_once"


def test_a_different_class_than_the_declared_one_is_refused() -> None:
    @tool(side_effects="at_most_once")
    def wire(amount: int) -> str:
        """Wire."""
        return "wired"

    with pytest.raises(ValueError, match="set once"):
        tool(side_effects="idempotent")(wire)
    with pytest.raises(ValueError, match="set once"):
        tool(side_effects="pure")(wire)
    assert get_tool_metadata(wire)["side_effects"] == "at_most_once"
    # An unmarked (default) tool may be declared stricter.
    plain = tool(lambda: "x")
    assert get_tool_metadata(tool(side_effects="at_most_once")(plain))["side_effects"] == "at_most_once"


def test_a_static_method_tool_keeps_its_class() -> None:
    class Tools:
        @tool(side_effects="at_most_once")
        @staticmethod
        def refund(order: str) -> str:
            """Refund."""
            return "refunded"

    assert get_tool_metadata(Tools.refund)["side_effects"] == "at_most_once"
    assert ToolNode([Tools.refund]).side_effects("refund") == "at_most_once"


@pytest.mark.parametrize("bad", [["at_most_once"], {"x": 1}, 3, "AT_MOST_ONCE"])
def test_a_class_that_is_no_class_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="side_effects must be one of"):
        tool(side_effects=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_unknown must be one of"):
        tool(side_effects="at_most_once", on_unknown=bad)  # type: ignore[arg-type]
