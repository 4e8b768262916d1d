"""The prebuilt tools: 10xGraph 0.10's schemas and results (differential), a good and a bad
input for each, bad inputs as tool errors the model reads, and their side-effect classes."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tenxgraph.core.state import Message
import tenxgraph.prebuilt.tools.fetch as fetch_module
from tenxgraph.prebuilt.tools import (
    fetch_url,
    file_read,
    file_search,
    file_write,
    google_web_search,
    make_agent_memory_tool,
    make_user_memory_tool,
    memory_tool,
    safe_calculator,
    vertex_ai_search,
)
from tenxgraph.testing.providers import OpenAIStandIn
from tenxgraph.utils.decorators import get_tool_metadata

SCHEMAS = """
import json
from tenxgraph.core.graph import ToolNode
from tenxgraph.prebuilt.tools import *
class _Scope:
    enabled = True; store = None; limit = 5; score_threshold = None; config = None
    memory_type = "episodic"; category = "general"
class _MemoryConfig:
    user_memory = _Scope(); agent_memory = _Scope(); store = None; limit = 5; score_threshold = None; config = None
tn = ToolNode([safe_calculator, file_read, file_write, file_search, fetch_url, google_web_search, vertex_ai_search,
               memory_tool, make_user_memory_tool(_MemoryConfig()), make_agent_memory_tool(_MemoryConfig())])
emit(tn.get_local_tool())
"""


def test_tool_schemas_match_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(SCHEMAS)
    assert [t["function"]["name"] for t in theirs] == [
        "safe_calculator", "file_read", "file_write", "file_search", "fetch_url", "google_web_search",
        "vertex_ai_search", "memory_tool", "user_memory_tool", "agent_memory_tool"]
    assert ours == theirs


EXPRESSIONS = ["2*(3+4)", "7 // 2", "2 ** 10", "-3 % 5", "1/3", "1/0", "2+", "", "   ", "9**99", "10**13",
               "__import__('os')", "a + 1", "True + 1", "1e400", "1 << 2", "x" * 501, "2.5 * 4"]

CALCULATOR = """
from tenxgraph.prebuilt.tools import safe_calculator
emit([safe_calculator(e) for e in EXPRESSIONS] + [safe_calculator("1/3", precision=3),
                                                  safe_calculator("1/3", precision=99)])
"""


def test_calculator_answers_as_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(f"EXPRESSIONS = {EXPRESSIONS!r}\n" + CALCULATOR)
    assert ours == theirs
    results = [json.loads(r) for r in ours]
    assert results[0] == {"result": 14} and results[-2] == {"result": 0.333}
    assert results[EXPRESSIONS.index("1/0")] == {"error": "division by zero"}


def test_calculator_good_and_bad() -> None:
    assert json.loads(safe_calculator("(1 + 2) * 3 - 4 / 2")) == {"result": 7.0}
    for bad in ("2 +", "open('x')", "9 ** 9 ** 9", "[1, 2]"):
        assert set(json.loads(safe_calculator(bad))) == {"error"}, bad


FILES = """
import json, os, tempfile
from pathlib import Path
from tenxgraph.prebuilt.tools import file_read, file_search, file_write
root = Path(tempfile.mkdtemp()).resolve()
outside = Path(tempfile.mkdtemp()).resolve()
(outside / "secret.txt").write_text("top secret")
(root / "notes").mkdir()
(root / "notes" / "todo.md").write_text("buy milk\\nrefund A-1001\\ncall Bob\\n")
(root / "blob.bin").write_bytes(b"\\x00\\x01binary")
os.symlink(outside / "secret.txt", root / "link.txt")
cfg = {"file_tool_root": str(root)}
calls = [
    file_read("notes/todo.md", config=cfg),
    file_read("notes/todo.md", start_line=2, end_line=2, config=cfg),
    file_read("notes/todo.md", start_line=3, end_line=1, config=cfg),
    file_read("notes/todo.md", max_chars=4, config=cfg),
    file_read("../" + outside.name + "/secret.txt", config=cfg),
    file_read(str(outside / "secret.txt"), config=cfg),
    file_read("link.txt", config=cfg),
    file_read("missing.txt", config=cfg),
    file_read("notes", config=cfg),
    file_read("blob.bin", config=cfg),
    file_read("", config=cfg),
    file_write("out/new.txt", "hello", config=cfg),
    file_write("out/new.txt", "hello", create_dirs=True, config=cfg),
    file_write("out/new.txt", "again", config=cfg),
    file_write("out/new.txt", " world", mode="append", config=cfg),
    file_write("notes", "x", mode="overwrite", config=cfg),
    file_write("../escape.txt", "x", config=cfg),
    file_write("big.txt", "x" * 200_001, config=cfg),
    file_read("out/new.txt", config=cfg),
    file_search("refund", config=cfg),
    file_search("TODO", config=cfg),
    file_search("milk", path="notes", glob="*.md", config=cfg),
    file_search("", config=cfg),
    file_search("x", path="nowhere", config=cfg),
    file_search("secret", path="..", config=cfg),
]
emit([c.replace(str(root), "<root>").replace(str(outside), "<outside>") for c in calls]
     + [(root / "../escape.txt").exists()])
"""


def test_file_tools_answer_as_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(FILES)
    assert ours == theirs
    results = [json.loads(r) for r in ours[:-1]]
    assert results[0]["content"] == "buy milk\nrefund A-1001\ncall Bob"
    outside_root = {"error": "path must stay within the configured root: <root>"}
    assert results[4] == results[5] == results[6] == results[16] == outside_root
    assert results[18]["content"] == "hello world"
    assert ours[-1] is False  # nothing written outside the root


def test_file_tools_good_and_bad(tmp_path: Path) -> None:
    cfg = {"file_tool_root": str(tmp_path)}
    assert json.loads(file_write("a.txt", "one\ntwo", config=cfg))["status"] == "written"
    assert json.loads(file_read("a.txt", config=cfg))["content"] == "one\ntwo"
    found = json.loads(file_search("two", config=cfg))["results"]
    assert found == [{"path": "a.txt", "match_type": "content", "line": 2, "preview": "two"}]
    for bad in (file_read("../x", config=cfg), file_write("/etc/passwd", "x", mode="overwrite", config=cfg),
                file_search("x", path="/", config=cfg)):
        assert json.loads(bad)["error"].startswith("path must stay within the configured root")


class _Pages(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/missing":
            self.send_error(404)
            return
        body = b"<html><head><style>p{}</style><script>x()</script></head><body><h1>Orders</h1><p>A-1001 shipped</p></body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def pages():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_url_refuses_local_hosts_and_other_schemes(pages: str) -> None:
    # The loopback page is real, and refused: the tool must not reach the machine's own services.
    assert json.loads(asyncio.run(fetch_url(pages + "/"))) == {
        "error": "URL host is not public or could not be resolved"}
    for url in ("file:///etc/passwd", "ftp://example.com/x", "http://10.0.0.1/", "http://[::1]/", "not a url"):
        assert set(json.loads(asyncio.run(fetch_url(url)))) >= {"error"}, url


def test_fetch_url_reads_a_page(pages: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only this test lets loopback through, to serve a real page without a network.
    monkeypatch.setattr(fetch_module, "_ALLOWED_PRIVATE_HOSTS", {"127.0.0.1"})
    got = json.loads(asyncio.run(fetch_url(pages + "/orders")))
    assert got == {"url": pages + "/orders", "status_code": 200, "content_type": "text/html; charset=utf-8",
                   "content": "Orders A-1001 shipped", "truncated": False}
    short = json.loads(asyncio.run(fetch_url(pages + "/orders", max_chars=10)))
    assert short["truncated"] is True and len(short["content"]) <= 10
    assert json.loads(asyncio.run(fetch_url(pages + "/missing"))) == {"error": "HTTP error: 404", "status_code": 404}


def test_search_tools_name_the_missing_extra() -> None:
    try:
        import google.genai  # noqa: F401
        pytest.skip("google-genai is installed here; the missing-SDK answer cannot be observed")
    except ImportError:
        pass
    for result in (asyncio.run(google_web_search("tenxgraph")), asyncio.run(vertex_ai_search("q", "projects/p/x"))):
        error = json.loads(result)["error"]
        assert "google-genai is required" in error and "pip install 10xgraph[google-genai]" in error
    assert json.loads(asyncio.run(google_web_search(""))) == {"error": "query is required"}
    assert json.loads(asyncio.run(vertex_ai_search("q", ""))) == {"error": "datastore is required"}


def test_memory_tools_answer_that_there_is_no_store() -> None:
    assert json.loads(asyncio.run(memory_tool(action="search", query="name")))["error"] == "no memory store configured"
    user = make_user_memory_tool(object())
    agent = make_agent_memory_tool(object())
    assert json.loads(asyncio.run(user(action="remember", text="likes tea")))["error"] == (
        "no user memory store configured")
    assert json.loads(asyncio.run(agent(query="policy")))["error"] == "no agent memory store configured"
    assert "tenxgraph has no long-term memory store" in json.loads(asyncio.run(agent(query="q")))["reason"]


def test_side_effect_classes() -> None:
    classes = {fn.__name__: get_tool_metadata(fn)["side_effects"] for fn in (
        safe_calculator, file_read, file_search, file_write, fetch_url, google_web_search, vertex_ai_search,
        memory_tool)}
    assert classes == {"safe_calculator": "pure", "file_read": "idempotent", "file_search": "idempotent",
                       "file_write": "at_most_once", "fetch_url": "idempotent", "google_web_search": "idempotent",
                       "vertex_ai_search": "idempotent", "memory_tool": "at_most_once"}


def test_a_bad_path_reaches_the_model_as_a_tool_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tenxgraph.prebuilt.agent import ReactAgent

    (tmp_path / "ok.txt").write_text("fine")
    with OpenAIStandIn() as llm:
        for key, value in llm.env.items():
            monkeypatch.setenv(key, value)
        llm.reply_tool_calls(("file_read", {"path": "../../etc/passwd"}), ("safe_calculator", {"expression": "2+"}))
        llm.reply_text("I may not read that file.")
        app = ReactAgent(model="openai/gpt-4o-mini", tools=[file_read, safe_calculator]).compile()
        out = app.invoke({"messages": [Message.text_message("read /etc/passwd")]},
                         config={"thread_id": "t", "file_tool_root": str(tmp_path)})
        assert out["messages"][-1].text() == "I may not read that file."
        tool_results = [m for m in llm.requests[-1].messages if m["role"] == "tool"]
        assert json.loads(tool_results[0]["content"]) == {
            "error": f"path must stay within the configured root: {tmp_path.resolve()}"}
        assert "error" in json.loads(tool_results[1]["content"])


@pytest.mark.parametrize(("failpoint", "outcome_known"), [("after_record:file_write=kill", True),
                                                          ("after_tool:file_write=kill", False)],
                         ids=["after_its_ledger_row", "before_its_ledger_row"])
def test_file_write_is_never_run_twice_across_a_kill(failpoint: str, outcome_known: bool, tmp_path: Path,
                                                     crash_kit) -> None:
    """file_write is at_most_once: killed after it appended, the resume does not append again;
    either its result comes from the ledger, or (killed before the result was recorded) the
    model is told the outcome is unknown."""
    root = tmp_path / "work"
    root.mkdir()
    (root / "log.txt").write_text("start\n")
    target = "tests_py.llm_agents.prebuilt:build_file_writer"
    cfg = {"file_tool_root": str(root)}
    with OpenAIStandIn() as llm:
        llm.reply_tool_calls(("file_write", {"path": "log.txt", "content": "charged A1\n", "mode": "append"}))
        crashed = crash_kit.run_until_crash(target, "t", input="log the charge", failpoints=failpoint,
                                            env=llm.env, config=cfg)
        assert crashed.killed
        assert (root / "log.txt").read_text() == "start\ncharged A1\n"
        llm.reply_text("Logged.")
        resumed = crash_kit.resume(target, "t", env=llm.env, config=cfg)
        assert resumed.status == "completed", resumed.stderr[-2000:]
        assert (root / "log.txt").read_text() == "start\ncharged A1\n"  # not appended twice
        answer = [m for m in llm.requests[-1].messages if m["role"] == "tool"][-1]["content"]
        if outcome_known:
            assert json.loads(answer) == {"status": "written", "path": "log.txt", "bytes": 11, "mode": "append"}
        else:
            assert "[TOOL_OUTCOME_UNKNOWN]" in answer
