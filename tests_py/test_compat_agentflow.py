"""``import agentflow`` and the distribution's version (issue 14 item 1).

10xGraph 0.10 ships ``agentflow`` as a deprecated alias of ``tenxgraph`` in its wheel; requirements
such as ``10xgraph>=0.10.0,<2.0`` (10xgraph-api declares exactly that) must accept our wheel.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent

ALIAS = """
import sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import agentflow
    import agentflow.core.graph as ag
    from agentflow.core.state import AgentState, Message
    from agentflow.utils import END
    import agentflow.storage.checkpointer
import tenxgraph, tenxgraph.core.graph as tg, tenxgraph.core.state as ts
deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning) and "agentflow" in str(w.message)]
try:
    import agentflow.no_such_module
    missing = "imported"
except ModuleNotFoundError as e:
    missing = e.name
g = ag.StateGraph(AgentState)
g.add_node("n", lambda s: Message.text_message("hi", role="assistant"))
g.add_edge("n", END)
g.set_entry_point("n")
app = g.compile()
out = app.invoke({"messages": [Message.text_message("x", role="user")]}, {"thread_id": "t"})
emit({
    "same_package": agentflow is tenxgraph,
    "same_submodule": ag is tg and sys.modules["agentflow.core.state"] is ts,
    "same_class": AgentState is ts.AgentState,
    "names": [agentflow.__name__, ag.__name__],
    "deprecations": len(deprecations),
    "mentions_tenxgraph": all("tenxgraph" in str(w.message) for w in deprecations),
    "missing": missing,
    "texts": [m.text() for m in out["messages"]],
    "has_version": isinstance(agentflow.__version__, str),
})
"""


def test_agentflow_is_tenxgraph_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(ALIAS)
    assert ours == theirs
    assert ours["same_package"] and ours["same_submodule"] and ours["same_class"]
    assert ours["names"] == ["tenxgraph", "tenxgraph.core.graph"]
    assert ours["deprecations"] == 1 and ours["mentions_tenxgraph"]
    assert ours["missing"] == "agentflow.no_such_module"


def test_a_second_import_of_agentflow_warns_no_more() -> None:
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import agentflow\n"
        "    import agentflow\n"
        "    import agentflow.utils\n"
        "    import importlib; importlib.import_module('agentflow.core')\n"
        "print(sum(issubclass(x.category, DeprecationWarning) for x in w))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_installed_version_satisfies_what_10xgraph_users_pin() -> None:
    import tenxgraph

    installed = version("10xgraph")
    assert tenxgraph.__version__ == installed
    assert Version(installed) in SpecifierSet(">=0.10.0,<2.0")
    # The version comes from Cargo.toml (pyproject declares it dynamic): the source says the same.
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]
    assert installed == cargo


def test_the_wheel_configuration_ships_the_agentflow_package() -> None:
    """maturin puts only the main package of ``python-source`` in the wheel unless told:
    ``python-packages`` names agentflow (a built wheel is checked in the report of issue 14)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["maturin"]
    assert "agentflow" in cfg.get("python-packages", [])
    assert (ROOT / cfg["python-source"] / "agentflow" / "__init__.py").is_file()


@pytest.mark.parametrize("name", ["tenxgraph", "agentflow"])
def test_the_version_is_there_under_either_name(name: str) -> None:
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", f"import {name}; print({name}.__version__)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == version("10xgraph")
