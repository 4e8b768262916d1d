"""Red team (session 9): ids that are not valid Unicode text.

A Python ``str`` may hold a lone surrogate (``"\\ud800"``; ``json.loads('"\\\\ud800"')`` makes
one, so a user id decoded from a token can). No backend can store it. The run's config was read
with a lossy conversion, so ``ainvoke`` stored the thread under another id (each surrogate
became three U+FFFD) while every other entry point raised ``UnicodeEncodeError``: the thread
was unreachable by its own id, two different ids named the same thread, and under user
isolation the user ``"u\\ufffd\\ufffd\\ufffd"`` read the thread of the user ``"u\\ud800"``.
Such an id is now refused like any other bad id: ``InvalidConfigError`` ``STORAGE_CONFIG_002``
before anything is read or written, on every entry point and every backend.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import InvalidConfigError
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo

LOSSY = "\ufffd" * 3


def graph(cp: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("m", lambda state: [Message.text_message("ok", role="assistant")])
    g.add_edge(START, "m")
    g.add_edge("m", END)
    return g.compile(checkpointer=cp)


def refused(exc: BaseException, field: str) -> bool:
    return (isinstance(exc, InvalidConfigError) and exc.error_code == "STORAGE_CONFIG_002"
            and exc.context.get("field") == field)


@pytest.mark.asyncio
@pytest.mark.parametrize("field", ["thread_id", "user_id"])
async def test_a_lone_surrogate_id_is_refused_everywhere_and_nothing_is_written(
    checkpointer: Any, make_thread: Any, field: str
) -> None:
    cp = checkpointer
    app = graph(cp)
    tid = make_thread("sur")
    cfg = {"thread_id": tid, "user_id": "u"}
    cfg[field] = cfg[field] + "\ud800"
    hi = {"messages": [Message.text_message("hi")]}

    async def astream_all() -> None:
        async for _ in app.astream(hi, dict(cfg)):
            pass

    calls = {
        "ainvoke": lambda: app.ainvoke(hi, dict(cfg)),
        "ainvoke resume": lambda: app.ainvoke({}, dict(cfg)),
        "invoke": lambda: asyncio.to_thread(app.invoke, hi, dict(cfg)),
        "astream": astream_all,
        "stream": lambda: asyncio.to_thread(lambda: list(app.stream(hi, dict(cfg)))),
        "astop": lambda: app.astop(dict(cfg)),
        "aget_state": lambda: cp.aget_state(dict(cfg)),
        "aput_state": lambda: cp.aput_state(dict(cfg), AgentState(context=[Message.text_message("x")])),
        "aput_messages": lambda: cp.aput_messages(dict(cfg), [Message.text_message("x")]),
        "aput_thread": lambda: cp.aput_thread(dict(cfg), ThreadInfo(thread_id=cfg["thread_id"])),
        "alist_messages": lambda: cp.alist_messages(dict(cfg)),
        "aget_thread": lambda: cp.aget_thread(dict(cfg)),
        "arequest_stop": lambda: cp.arequest_stop(dict(cfg)),
    }
    wrong = {}
    for name, call in calls.items():
        try:
            await call()
            wrong[name] = "accepted"
        except Exception as exc:  # noqa: BLE001 - the test reports every kind
            if not refused(exc, field):
                wrong[name] = f"{type(exc).__name__}: {str(exc)[:80]}"
    assert wrong == {}
    # Nothing under the id the lossy conversion makes, nor under the caller's other spellings.
    lossy = {"thread_id": tid, "user_id": "u"}
    lossy[field] = lossy[field] + LOSSY
    assert await cp.aget_state(dict(lossy)) is None
    assert [t.thread_id for t in await cp.alist_threads({"user_id": lossy["user_id"]})] == []


@pytest.mark.asyncio
async def test_two_users_whose_ids_differ_only_in_surrogates_do_not_share_a_thread(tmp_path) -> None:
    cp = SqliteCheckpointer(tmp_path / "iso.db", enforce_user_isolation=True)
    app = graph(cp)
    with pytest.raises(InvalidConfigError):
        await app.ainvoke({"messages": [Message.text_message("secret")]}, {"thread_id": "x", "user_id": "u\ud800"})
    # The literal U+FFFD user is an ordinary user with a thread of their own.
    await app.ainvoke({"messages": [Message.text_message("mine")]}, {"thread_id": "x", "user_id": "u" + LOSSY})
    state = await cp.aget_state({"thread_id": "x", "user_id": "u" + LOSSY})
    assert [m.text() for m in state.context] == ["mine", "ok"]


@pytest.mark.parametrize("argv", [["threads", "show", "a\udcff"], ["ledger", "a\udcff"], ["stop", "t", "--user", "\udcfe"]],
                         ids=["show", "ledger", "stop-user"])
def test_the_cli_refuses_an_argument_that_is_not_utf8_like_any_other_bad_id(tmp_path, argv: list[str]) -> None:
    """A shell argument that is not valid UTF-8 reaches Python with lone surrogates
    (surrogateescape); the CLI refuses it as every entry point does, not with a codec error."""
    import io

    from tenxgraph.cli.main import main

    db = tmp_path / "cli.db"
    asyncio.run(graph(SqliteCheckpointer(db)).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t"}))
    out, err = io.StringIO(), io.StringIO()
    code = main(["--sqlite", str(db), *argv], out, err)
    assert code != 0 and "STORAGE_CONFIG_002" in err.getvalue(), (code, err.getvalue())


@pytest.mark.asyncio
@pytest.mark.parametrize("call", ["aget_message", "adelete_message"])
async def test_a_lone_surrogate_message_id_is_refused_like_a_bad_id(checkpointer: Any, make_thread: Any, call: str) -> None:
    cp = checkpointer
    tid = make_thread("sur-msg")
    await graph(cp).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
    with pytest.raises(InvalidConfigError) as info:
        await getattr(cp, call)({"thread_id": tid}, "m\ud800")
    assert refused(info.value, "message_id")
    assert [m.text() for m in (await cp.aget_state({"thread_id": tid})).context] == ["hi", "ok"]
