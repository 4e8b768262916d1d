"""10xGraph 0.10's public surface, name by name: every public module (no leading underscore) and
every name of its ``__all__`` imports from tenxgraph, except what NOT_SUPPORTED lists with a reason.

The surface is read from the real 10xGraph (the ``oracle`` fixture), not from a list written here,
so a name 10xGraph exports and we lack fails this test. The table stays honest both ways: a
prefix that now imports from tenxgraph fails too (take it out of the table), and every prefix is
named in docs/migrating-from-10xgraph.md with the same reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs" / "migrating-from-10xgraph.md"

# Module prefix -> why tenxgraph does not provide it. A (module, name) pair is covered when its
# module is the prefix or under it, or (outside INTERNAL) when the name is defined there and
# re-exported elsewhere (tenxgraph.storage.BaseStore is tenxgraph.storage.store's).
NOT_SUPPORTED: dict[str, str] = {
    "tenxgraph.qa": "10xGraph's evaluation and QA-testing toolkit (LLM judges, simulators, reporters, "
                    "TestAgent/QuickTest): a separate product on top of the runtime, not built yet",
    "tenxgraph.storage.store": "long-term memory stores (Qdrant, Mem0, embeddings, memory tools' backends): "
                               "no vector store in tenxgraph",
    "tenxgraph.storage.media": "media offload and storage (local/cloud/in-memory media stores, resolvers): "
                               "not built; media blocks stay inline in messages",
    "tenxgraph.core.exceptions.media_exceptions": "belongs to the media layer (tenxgraph.storage.media), "
                                                  "not built",
    "tenxgraph.core.skills": "skills (SKILL.md loading and activation): not built",
    "tenxgraph.core.realtime": "realtime / live audio agents (Gemini Live): outside this release",
    "tenxgraph.runtime.adapters": "10xGraph's provider response converters: tenxgraph's provider adapters are "
                                  "tenxgraph.core.llm.* (different internals, the same Message out)",
    "tenxgraph.runtime.protocols": "A2A and ACP protocol servers and clients: not built",
    "tenxgraph.core.llm.anthropic_batch": "the provider batch APIs (AnthropicBatch, OpenAIBatch, BatchResult): "
                                          "not built",
    "tenxgraph.core.llm.openai_batch": "the provider batch APIs: not built",
    "tenxgraph.core.llm.batch_common": "the provider batch APIs: not built",
    "tenxgraph.core.graph.agent_internal": "the Agent's internal modules; the Agent itself is "
                                           "tenxgraph.core.graph.Agent (the LLM layer)",
    "tenxgraph.core.graph.utils": "10xGraph's internal invoke/stream handler modules: the loop is in Rust",
    "tenxgraph.core.graph.tool_node.base": "ToolNode internals; ToolNode is tenxgraph.core.graph.ToolNode",
    "tenxgraph.core.graph.tool_node.coercion": "ToolNode internals",
    "tenxgraph.core.graph.tool_node.constants": "ToolNode internals",
    "tenxgraph.core.graph.tool_node.deps": "ToolNode internals (MCP client dependency probes)",
    "tenxgraph.core.graph.tool_node.executors": "ToolNode internals (10xGraph's executor mixins)",
    "tenxgraph.core.graph.tool_node.kwargs_resolver": "ToolNode internals",
    "tenxgraph.core.graph.tool_node.local_exec": "ToolNode internals",
    "tenxgraph.core.graph.tool_node.mcp_exec": "ToolNode internals",
    "tenxgraph.core.graph.tool_node.run_tools": "ToolNode internals",
    "tenxgraph.core.graph.tool_node.schema": "ToolNode internals",
}

# Internal modules: the modules are not provided, but the public names 10xGraph defines in them
# and re-exports (ToolNode, RetryConfig ...) are, so re-exports are not excused by these.
INTERNAL = frozenset(p for p in NOT_SUPPORTED if p.startswith(("tenxgraph.core.graph.agent_internal",
                                                               "tenxgraph.core.graph.utils",
                                                               "tenxgraph.core.graph.tool_node.")))

# Run on 10xGraph: every public module, its __all__, and where each exported name is defined.
SURFACE_SCRIPT = """
import importlib, inspect, pkgutil, types, warnings
warnings.simplefilter("ignore")
import tenxgraph
mods = {}
for info in pkgutil.walk_packages(tenxgraph.__path__, "tenxgraph."):
    if any(p.startswith("_") for p in info.name.split(".")[1:]):
        continue
    try:
        mods[info.name] = importlib.import_module(info.name)
    except Exception as e:
        mods[info.name] = e
out = {}
for name, mod in mods.items():
    if isinstance(mod, Exception):
        out[name] = {"error": repr(mod)[:200], "all": {}}
        continue
    names = {}
    for n in sorted(getattr(mod, "__all__", []) or []):
        obj = getattr(mod, n, None)
        origin = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        if not (isinstance(origin, str) and origin.startswith("tenxgraph")):
            # A constant: the shortest other module that exports this very object too.
            holders = [m for m, v in mods.items()
                       if not isinstance(v, Exception) and m != name and n in (getattr(v, "__all__", None) or [])
                       and vars(v).get(n, None) is obj]
            origin = min(holders, key=len) if holders else name
        names[n] = origin
    out[name] = {"all": names}
emit(out)
"""

# Run on tenxgraph: which modules import, which names resolve, and whether a NOT_SUPPORTED prefix does.
OURS_SCRIPT = """
import importlib, json, warnings
warnings.simplefilter("ignore")
surface = json.loads({surface!r})
prefixes = json.loads({prefixes!r})
missing, present = [], []
for mod, info in sorted(surface.items()):
    try:
        m = importlib.import_module(mod)
    except Exception as e:
        missing.append([mod, None, type(e).__name__ + ": " + str(e)[:120]])
        continue
    for n in info["all"]:
        try:
            getattr(m, n)
        except Exception as e:
            missing.append([mod, n, type(e).__name__])
for p in prefixes:
    try:
        importlib.import_module(p)
        present.append(p)
    except ImportError:
        pass
emit({{"missing": missing, "present": present}})
"""


def _covered(module: str, *, reexport: bool = False) -> str | None:
    for prefix in NOT_SUPPORTED:
        if reexport and prefix in INTERNAL:
            continue
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    from tests_py.oracle import Oracle, build_oracle_venv

    python, why = build_oracle_venv()
    if python is None:
        pytest.skip(f"differential test skipped: {why}")
    oracle = Oracle(python=python, workdir=tmp_path_factory.mktemp("surface"))
    theirs = oracle.run_theirs(SURFACE_SCRIPT, timeout=600)
    ours = oracle.run_ours(OURS_SCRIPT.format(surface=json.dumps(theirs), prefixes=json.dumps(sorted(NOT_SUPPORTED))),
                           timeout=600)
    return theirs, ours


def test_the_walk_sees_10xgraphs_whole_surface(surfaces: tuple[dict, dict]) -> None:
    theirs, _ = surfaces
    # A walk that found nothing would make every other assertion here vacuous.
    assert len(theirs) > 200
    assert "StateGraph" in theirs["tenxgraph.core.graph"]["all"]
    assert theirs["tenxgraph.storage"]["all"]["BaseStore"].startswith("tenxgraph.storage.store")


def test_every_public_name_of_10xgraph_imports_from_tenxgraph(surfaces: tuple[dict, dict]) -> None:
    theirs, ours = surfaces
    gaps = []
    for mod, name, why in ours["missing"]:
        if _covered(mod):
            continue
        if name is not None and _covered(theirs[mod]["all"][name], reexport=True):
            continue
        gaps.append(f"{mod}{'.' + name if name else ''}: {why}")
    assert not gaps, "10xGraph public names tenxgraph lacks (implement, or list in NOT_SUPPORTED):\n" + "\n".join(gaps)


def test_not_supported_prefixes_really_are_missing(surfaces: tuple[dict, dict]) -> None:
    theirs, ours = surfaces
    assert not ours["present"], f"these now import from tenxgraph; take them out of NOT_SUPPORTED: {ours['present']}"
    # A re-export of a listed module (tenxgraph.storage.BaseStore ...) must be missing too.
    provided = []
    missing = {(m, n) for m, n, _ in ours["missing"]}
    for mod, info in theirs.items():
        for name, origin in info["all"].items():
            if _covered(origin, reexport=True) and not _covered(mod) and (mod, name) not in missing:
                provided.append(f"{mod}.{name}")
    assert not provided, f"provided by tenxgraph yet listed as not supported: {provided}"


def test_every_prefix_of_the_table_is_in_the_migration_guide() -> None:
    text = DOCS.read_text()
    # The same table: each prefix with the same reason, one row each.
    absent = [p for p, why in NOT_SUPPORTED.items() if f"| `{p}` | not supported | {why} |" not in text]
    assert not absent, f"docs/migrating-from-10xgraph.md has no row (prefix and reason) for: {absent}"


def test_every_prefix_is_part_of_10xgraphs_surface(surfaces: tuple[dict, dict]) -> None:
    theirs, _ = surfaces
    unknown = [p for p in NOT_SUPPORTED if not any(m == p or m.startswith(p + ".") for m in theirs)]
    assert not unknown, f"not a 10xGraph 0.10 module: {unknown}"


MEMBERS = """
import importlib
i = importlib.import_module("tenxgraph.utils.interrupt")  # the attribute is the function interrupt()
from tenxgraph.utils import ExecutionState, ResponseGranularity
from tenxgraph.core.state.stream_chunks import StreamEvent
emit({
    "enums": {e.__name__: {m.name: m.value for m in e} for e in (ExecutionState, ResponseGranularity, StreamEvent)},
    "interrupt": {n: getattr(i, n) for n in ("INTERRUPT_REASON", "INTERRUPT_DATA_KEY", "RESUME_KEY",
                                             "RESUME_VALUES_KEY", "SCOPE_CONFIG_KEY") if hasattr(i, n)},
})
"""


def test_10xgraphs_enum_members_and_interrupt_constants_exist_with_its_values(oracle) -> None:
    """Members are not names of an ``__all__``: ``ExecutionState.PAUSED`` was missing (session 32's
    differential pass), and so were ``tenxgraph.utils.interrupt``'s constants."""
    theirs, ours = oracle.run_both(MEMBERS)
    for enum, members in theirs["enums"].items():
        assert {k: ours["enums"][enum].get(k) for k in members} == members, enum
    assert len(theirs["interrupt"]) == 5 and ours["interrupt"] == theirs["interrupt"]
