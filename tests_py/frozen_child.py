"""Child process for test_redteam_frozen_deps.py (red-team pass: frozen and half-dead dependencies).

    python frozen_child.py SPEC.json

SPEC is a JSON object with a "mode":

- "run": one call of an entry point (ainvoke / astream / invoke) on the two-tool graph below, with
  the run config given; writes {"outcome": "ok" | "error" | "caller_timeout", ...} to spec["result"].
- "reads": checkpointer entry points on a Postgres backend this process freezes itself (SIGSTOP of
  the backend serving the checkpointer's one connection), and setup() behind a frozen holder of
  the migration advisory lock; writes one outcome per entry point to spec["result"].

The graph (also ``build(checkpointer)`` for ``tenxgraph recover --graph frozen_child:build``):
model -> tools (fast_tool, slow_tool in parallel) -> model -> END. Side effects are appended to
$RT_EFFECTS (one fsynced line each), so the parent counts what really ran across SIGKILLs.
slow_tool touches $RT_MARKS/slow_started and sleeps $RT_SLOW seconds (default 0.2).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer

# 10xGraph's migration lock key (ASCII "AGNTFLW!"), src/store/postgres/migrations.rs LOCK_KEY.
MIGRATION_LOCK_KEY = 0x4147_4E54_464C_5721


def effect(line: str) -> None:
    path = os.environ.get("RT_EFFECTS")
    if not path:
        return
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def mark(name: str) -> None:
    d = os.environ.get("RT_MARKS")
    if d:
        Path(d, name).touch()


def tool_call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def build(checkpointer: Any):
    """The graph on ``checkpointer`` (the CLI's ``--graph frozen_child:build``)."""

    async def fast_tool(x: int) -> str:
        """Return x doubled."""
        effect("fast")
        return f"fast {2 * x}"

    async def slow_tool(x: int) -> str:
        """Return x tripled, after a while."""
        effect("start:slow")
        mark("slow_started")
        await asyncio.sleep(float(os.environ.get("RT_SLOW", "0.2")))
        effect("slow")
        return f"slow {3 * x}"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            # One id per turn (from the user message's): ledger keys are per turn, and ids are
            # unique across the threads of a database.
            msg = Message.text_message("calling tools", role="assistant",
                                       message_id=f"calls-{state.context[-1].message_id}")
            msg.tools_calls = [tool_call("call_fast", "fast_tool", x=2), tool_call("call_slow", "slow_tool", x=3)]
            return msg
        effect("model:final")
        return Message.text_message("all done", role="assistant")

    def route(state: AgentState) -> str:
        return "tools" if state.context[-1].tools_calls else END

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([fast_tool, slow_tool]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


def open_checkpointer(spec: dict[str, Any]) -> Any:
    if spec.get("sqlite"):
        return SqliteCheckpointer(spec["sqlite"])
    # A deadline per statement (2 s; a transaction twice that) and per row-lock wait (1 s).
    pool = {"max_size": spec.get("pool_max", 2), "timeout": spec.get("pool_timeout", 2.0),
            "statement_timeout": 2.0, "lock_timeout": 1.0}
    return PgCheckpointer(spec["dsn"], redis_url=spec.get("redis"), schema=spec["schema"], pool_config=pool,
                          enforce_user_isolation=False)


def write_result(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def describe(exc: BaseException, started: float) -> dict[str, Any]:
    return {"outcome": "error", "error_type": type(exc).__name__, "error_code": getattr(exc, "error_code", None),
            "message": str(exc)[:500], "elapsed": round(time.monotonic() - started, 3)}


# --------------------------------------------------------------------------- mode "run"


async def _one_call(app: Any, entry: str, data: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    if entry == "ainvoke":
        r = await app.ainvoke(data, cfg, "full")
        meta = r["state"].execution_meta
        return {"status": str(meta.status), "reason": meta.interrupt_reason, "stop": meta.stop_current_execution}
    if entry == "astream":
        n = 0
        async for _chunk in app.astream(data, cfg):
            n += 1
        state = await app._checkpointer.aget_state(cfg)
        return {"status": str(state.execution_meta.status) if state else None, "chunks": n}
    raise ValueError(entry)


async def stop_when(app: Any, flag: str, cfg: dict[str, Any], out: str) -> None:
    while not os.path.exists(flag):
        await asyncio.sleep(0.02)
    t0 = time.monotonic()
    try:
        got = await app.astop(cfg)
        write_result(out, {"outcome": "ok", "value": got, "elapsed": round(time.monotonic() - t0, 3)})
    except BaseException as exc:  # noqa: BLE001
        write_result(out, describe(exc, t0))


def hang_graph(checkpointer: Any):
    """One node that waits for ever when $RT_HANG is 1 (only a hard stop ends it), else answers."""

    async def hang(state: AgentState) -> Message:
        if os.environ.get("RT_HANG") == "1":
            mark("hang_started")
            await asyncio.Event().wait()
        return Message.text_message("answered", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("hang", hang)
    g.add_edge(START, "hang")
    g.add_edge("hang", END)
    return g.compile(checkpointer=checkpointer)


def blocked_sync_graph(checkpointer: Any):
    """model -> tools (a sync tool blocked in a C call for an hour) -> model -> END."""

    def blocked_tool(x: int) -> str:
        """Never comes back (in practice)."""
        effect("start:blocked")
        mark("blocked_started")
        time.sleep(3600)
        effect("blocked")
        return "late"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("calling", role="assistant", message_id="assistant-blocked")
            msg.tools_calls = [tool_call("call_blocked", "blocked_tool", x=1)]
            return msg
        return Message.text_message("gave up", role="assistant")

    def route(state: AgentState) -> str:
        return "tools" if state.context[-1].tools_calls else END

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([blocked_tool]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


GRAPHS = {"tools": build, "hang": hang_graph, "blocked_sync": blocked_sync_graph}
build_hang = hang_graph


def run_mode(spec: dict[str, Any]) -> None:
    cfg = {"thread_id": spec["thread"], "user_id": "u", **spec.get("config", {})}
    data = {} if spec.get("resume") else {"messages": [Message.text_message("do it", message_id=spec.get("user_msg", "u1"))]}
    entry = spec.get("entry", "ainvoke")
    guard = spec.get("guard")  # the caller's own safety net (asyncio.wait_for), when given
    started = time.monotonic()
    try:
        if entry == "invoke":
            app = GRAPHS[spec.get("graph", "tools")](open_checkpointer(spec))
            r = app.invoke(data, cfg, "full")
            out = {"outcome": "ok", "status": str(r["state"].execution_meta.status)}
        else:
            async def main() -> dict[str, Any]:
                app = GRAPHS[spec.get("graph", "tools")](open_checkpointer(spec))
                call = _one_call(app, entry, data, cfg)
                if spec.get("stop_file"):  # a stop() from this process once the parent says so
                    asyncio.ensure_future(stop_when(app, spec["stop_file"], dict(cfg), spec["result"] + ".astop"))
                if guard:
                    try:
                        got = await asyncio.wait_for(call, guard)
                    except asyncio.TimeoutError:
                        return {"outcome": "caller_timeout"}
                else:
                    got = await call
                return {"outcome": "ok", **got}

            out = asyncio.run(main())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out = describe(exc, started)
    out.setdefault("elapsed", round(time.monotonic() - started, 3))
    write_result(spec["result"], out)


# --------------------------------------------------------------------------- mode "reads"


def backend_pid(psql: list[str], dsn: str, app_name: str) -> int:
    q = f"SELECT pid FROM pg_stat_activity WHERE application_name = '{app_name}' AND backend_type = 'client backend'"
    out = subprocess.run([*psql, "-d", dsn, "-c", q], capture_output=True, text=True, timeout=30).stdout.split()
    assert len(out) == 1, (app_name, out)
    return int(out[0])


def lock_holder(psql: list[str], dsn: str, app_name: str, lock_sql: str) -> subprocess.Popen[str]:
    """A psql session that runs BEGIN and ``lock_sql``, then waits for its client with the
    transaction open ("idle in transaction"); returned once it holds the lock. SIGKILL of the
    psql process ends the session (its socket closes) and so releases the lock."""
    holder = subprocess.Popen([*psql, "-d", with_app_name(dsn, app_name)], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True)
    assert holder.stdin is not None
    holder.stdin.write(f"BEGIN;\n{lock_sql};\n")
    holder.stdin.flush()
    q = (f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app_name}' "
         "AND state = 'idle in transaction' AND query NOT LIKE 'BEGIN%'")
    deadline = time.monotonic() + 30
    while subprocess.run([*psql, "-d", dsn, "-c", q], capture_output=True, text=True, timeout=30).stdout.strip() != "1":
        assert time.monotonic() < deadline, f"the lock holder {app_name} never took its lock"
        time.sleep(0.05)
    return holder


def with_app_name(dsn: str, name: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + f"application_name={name}"


async def reads_mode(spec: dict[str, Any]) -> dict[str, Any]:
    psql, dsn, schema, thread = spec["psql"], spec["dsn"], spec["schema"], spec["thread"]
    guard = float(spec.get("guard", 10.0))
    cfg = {"thread_id": thread, "user_id": "u"}
    stopped: list[int] = []
    results: dict[str, Any] = {}
    tasks: dict[str, asyncio.Task[Any]] = {}

    def cp_named(name: str, schema_name: str = schema) -> PgCheckpointer:
        return PgCheckpointer(with_app_name(dsn, name), schema=schema_name, enforce_user_isolation=False,
                              pool_config={"max_size": 1, "timeout": 2.0, "statement_timeout": 2.0, "lock_timeout": 1.0})

    async def guarded(name: str, coro: Any) -> None:
        t0 = time.monotonic()
        try:
            got = await asyncio.wait_for(coro, guard)
            results[name] = {"outcome": "ok", "elapsed": round(time.monotonic() - t0, 3), "value": repr(got)[:80]}
        except asyncio.TimeoutError:
            results[name] = {"outcome": "caller_timeout", "elapsed": round(time.monotonic() - t0, 3)}
        except BaseException as exc:  # noqa: BLE001
            results[name] = describe(exc, t0)

    # A thread to read (one completed turn), written through its own checkpointer.
    writer = cp_named("rt_reads_writer")
    await build(writer).ainvoke({"messages": [Message.text_message("do it", message_id="u1")]}, dict(cfg))
    state = await writer.aget_state(cfg)

    ops = {
        "aget_state": lambda cp: cp.aget_state(dict(cfg)),
        "alist_messages": lambda cp: cp.alist_messages(dict(cfg)),
        "aput_state": lambda cp: cp.aput_state(dict(cfg), state),
        "astop": lambda cp: build(cp).astop(dict(cfg)),
    }
    for name, op in ops.items():
        app_name = f"rt_read_{name}"
        cp = cp_named(app_name)
        await cp.asetup()
        pid = backend_pid(psql, dsn, app_name)  # the pool's one connection
        await cp.aget_state(dict(cfg))  # the connection has just finished a statement ...
        os.kill(pid, signal.SIGSTOP)  # ... and its backend freezes (a stall of the server process)
        stopped.append(pid)
        tasks[name] = asyncio.ensure_future(guarded(name, op(cp)))

    # arelease() while a statement of the checkpointer is stuck on a frozen backend.
    cp = cp_named("rt_read_arelease")
    await cp.asetup()
    pid = backend_pid(psql, dsn, "rt_read_arelease")
    await cp.aget_state(dict(cfg))
    os.kill(pid, signal.SIGSTOP)
    stopped.append(pid)
    stuck = asyncio.ensure_future(cp.aget_state(dict(cfg)))
    await asyncio.sleep(0.2)
    tasks["arelease"] = asyncio.ensure_future(guarded("arelease", cp.arelease()))

    # setup() while another process that was migrating is frozen holding the migration lock: an
    # opened checkpointer's setup() and a new worker's first call (which opens and migrates).
    opened = cp_named("rt_read_setup")
    await opened.asetup()
    holder = await asyncio.get_running_loop().run_in_executor(
        None, lock_holder, psql, dsn, "rt_migrator", f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    try:
        os.kill(holder.pid, signal.SIGSTOP)  # the migrating process freezes
        tasks["setup_opened"] = asyncio.ensure_future(guarded("setup_opened", opened.asetup()))
        fresh = cp_named("rt_read_fresh_worker")
        tasks["first_call_new_worker"] = asyncio.ensure_future(guarded("first_call_new_worker", fresh.aget_state(dict(cfg))))
        await asyncio.gather(*tasks.values())
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        os.kill(holder.pid, signal.SIGKILL)
        os.kill(holder.pid, signal.SIGCONT)
        holder.wait()
    stuck.cancel()
    # After the dependency came back: the same checkpointers answer again.
    after: dict[str, Any] = {}
    for name in ("aget_state", "alist_messages"):
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(getattr(cp_named(f"rt_after_{name}"), name)(dict(cfg)), guard)
            after[name] = {"outcome": "ok", "elapsed": round(time.monotonic() - t0, 3)}
        except BaseException as exc:  # noqa: BLE001
            after[name] = describe(exc, t0)
    return {"during": results, "after": after}


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text())
    for k, v in spec.get("env", {}).items():
        os.environ[k] = str(v)
    if spec["mode"] == "run":
        run_mode(spec)
    elif spec["mode"] == "reads":
        out = asyncio.run(reads_mode(spec))
        write_result(spec["result"], out)
    else:
        raise SystemExit(f"unknown mode {spec['mode']!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
