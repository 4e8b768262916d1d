"""tests_py/test_redteam_kills_mcp.py's random kills with the MCP server's ``charge_card`` classed
``at_most_once`` (``ToolNode(mcp_side_effects=...)``): it never reaches the server twice, and a
call a kill cut off is answered "outcome unknown" (TOOL_OUTCOME_UNKNOWN)."""

from __future__ import annotations

from pathlib import Path

from tests_py.redteam.mcp_server import McpServer
from tests_py.test_redteam_kills_mcp import db, kill_rounds, server  # noqa: F401  (fixtures)


def test_random_kills_of_an_at_most_once_mcp_turn(db: str, server: McpServer, tmp_path: Path) -> None:  # noqa: F811
    kill_rounds(db, server, tmp_path, at_most_once=True)
