"""CompiledGraph: ``invoke``/``ainvoke`` over the Rust loop, ``stop``, the topology it compiles.

Streaming is in ``_graph_stream``, recovery and closing in ``_graph_lifecycle``."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tenxgraph import _core
from tenxgraph import _in_flight as in_flight
from tenxgraph._abandon import within
from tenxgraph._live_states import LiveStates
from tenxgraph._run_values import copy_update_value, refuse_id_twins
from tenxgraph._state_codec import check_state_update, encode_message_shaped
from tenxgraph._runtime import Run
from tenxgraph._events import RunEvents
from tenxgraph._sync import run_sync
from tenxgraph.core.graph._busy_answers import BusyAnswers
from tenxgraph.core.graph._graph_lifecycle import GraphLifecycle, recovery_options
from tenxgraph.core.graph._graph_stream import SYNC_EVENT_FLUSH_SECONDS, StreamingRuns
from tenxgraph.core.graph.remote_tool import RemoteToolConfig, attach_remote_tools
from tenxgraph.runtime.publisher.publish import activate as activate_publisher
from tenxgraph.runtime.publisher.publish import deactivate as deactivate_publisher
from tenxgraph.runtime.publisher.publish import outbox_for
from tenxgraph.logs import log_fields, run_logger
from tenxgraph.storage.checkpointer.authz_guard import check_authz, thread_owner
from tenxgraph.storage.checkpointer.native_checkpointer import stop_token
from tenxgraph.core.exceptions import StorageError
from tenxgraph.utils.background_task_manager import BackgroundTaskManager
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.execution_state import ExecutionStatus
from tenxgraph.core.state.message import _reset_run_id_generator, _use_run_id_generator, generate_id
from tenxgraph._user_id import user_id_of
from tenxgraph.utils.constants import (
    DEFAULT_NODE_TIMEOUT_SECONDS,
    END,
    START,
    ResponseGranularity,
)
from tenxgraph.utils.validators import ValidationError

if TYPE_CHECKING:
    from tenxgraph.core.graph.state_graph import StateGraph
    from tenxgraph.storage.checkpointer import BaseCheckpointer

__all__ = ["CompiledGraph", "resolve_timeout", "run_sync"]

StateT = TypeVar("StateT", bound=AgentState)
_log = run_logger("tenxgraph.graph")
_MISSING = object()


def resolve_timeout(config: dict[str, Any], key: str, default: float | None) -> float | None:
    """10xGraph's rule: missing -> default; None or <= 0 -> no deadline; invalid -> warn, default.

    The rule is the engine's (``_core.resolve_timeout``): the deadlines a run gets are resolved by
    the same code."""
    return _core.resolve_timeout(config, key, default)


DEFAULT_BUSY_TIMEOUT_SECONDS: float = _core.DEFAULT_BUSY_TIMEOUT_SECONDS
DEFAULT_LEASE_TTL_SECONDS: float = _core.DEFAULT_LEASE_TTL_SECONDS


def _keyed_condition(condition: Any, pairs: list[tuple[Any, str]]) -> Any:
    """``condition`` for a path_map with keys that are not str: a result equal to such a key
    (in the path_map's order) comes back as that key's token; any other result as it was. It
    failed ``compile()`` with a bare TypeError (10xGraph 0.10 routes on it)."""
    def keyed(state: Any) -> Any:
        result = condition(state)
        if not isinstance(result, str):
            for key, token in pairs:
                if result == key:
                    return token
        return result

    return keyed


def _is_tool_node(func: Any) -> bool:
    from tenxgraph.core.graph.tool_node import ToolNode

    return isinstance(func, ToolNode)


class CompiledGraph(BusyAnswers, StreamingRuns, GraphLifecycle, Generic[StateT]):
    """A graph ready to run. Each run's loop executes in the Rust core."""

    def __init__(
        self,
        builder: StateGraph[StateT],
        checkpointer: BaseCheckpointer,
        store: Any,
        interrupt_before: list[str],
        interrupt_after: list[str],
        shutdown_timeout: float,
        live_states: int = 0,
        recover_on_start: bool | dict[str, Any] = False,
        callback_manager: Any = None,
    ) -> None:
        from tenxgraph.utils.callbacks import CallbackManager

        self._callbacks: CallbackManager = callback_manager if callback_manager is not None else CallbackManager()
        self._builder = builder
        generator = getattr(builder, "_id_generator", None)
        self._id_fn: Any = generator.generate if generator is not None else None
        self._live = LiveStates(live_states)
        self._checkpointer = checkpointer
        self._store = store
        self._prototype: StateT = builder._state
        self._state_type: type[StateT] = type(builder._state)
        self._nodes = {n: node for n, node in builder.nodes.items() if n not in (START, END)}
        # Where a handoff call may send the run (prebuilt.tools.handoff): the nodes that are not
        # tool nodes.
        self._agent_nodes = frozenset(n for n, node in self._nodes.items() if not _is_tool_node(node.func))
        self._conditions: list[Any] = []
        self._log = _log
        self.interrupt_before = interrupt_before
        self.interrupt_after = interrupt_after
        self.shutdown_timeout = shutdown_timeout
        self._closed = False
        self._task_manager = BackgroundTaskManager(default_shutdown_timeout=shutdown_timeout)
        self._recover_on_start = recovery_options(recover_on_start)
        self._publisher = getattr(builder, "publisher", None)
        self._outbox = outbox_for(self._publisher) if self._publisher is not None else None
        self.recovery: asyncio.Task[Any] | None = None
        edges = []
        cond_index: dict[int, int] = {}
        # path_map keys that are not str (True/False, ints: 10xGraph routes on `result == key`):
        # the loop matches text, so each gets a token its condition returns on a match.
        tokens: dict[int, list[tuple[Any, str]]] = {}
        for e in builder.edges:
            idx = None
            key = e.condition_result
            if e.condition is not None:
                idx = cond_index.get(id(e.condition))
                if idx is None:
                    idx = cond_index[id(e.condition)] = len(self._conditions)
                    self._conditions.append(e.condition)
                if key is not None and not isinstance(key, str):
                    pairs = tokens.setdefault(idx, [])
                    token = f"\x00path_map:{len(pairs)}"
                    pairs.append((key, token))
                    key = token
            edges.append((e.from_node, e.to_node, idx, key))
        for idx, pairs in tokens.items():
            self._conditions[idx] = _keyed_condition(self._conditions[idx], pairs)
        self._edges = edges
        self._native = self._build_native()

    def _build_native(self) -> Any:
        """The Rust loop's topology. Which nodes are tool nodes is part of it: the loop drives a
        tool node through the ledger (begin_tools) and any other node through run_node."""
        return _core.NativeGraph(
            list(self._nodes),
            self._edges,
            self._builder.entry_point,
            self.interrupt_before,
            self.interrupt_after,
            [n for n, node in self._nodes.items() if _is_tool_node(node.func)],
            self._checkpointer._native,
            starts_with_messages=bool(self._prototype.context),
        )

    # -- running ---------------------------------------------------------------------------

    def _prepare_config(self, config: dict[str, Any] | None) -> tuple[dict[str, Any], _core.RunOptions]:
        """The run's config dict with 10xGraph's defaults filled in (what nodes see), and the
        run's settings resolved and validated from it by the engine (``_core.RunOptions``: the
        rules for timeouts, limits, leases and failpoints live there, once)."""
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        cfg = dict(config or {})
        # Only a missing id is generated: a falsy one (0, False) is the caller's and is checked
        # like any other (a generated id would silently start a new thread).
        if cfg.get("thread_id") is None or cfg.get("thread_id") == "":
            cfg["thread_id"] = self._new_id()
            _log.warning(
                "no thread_id in config: generated %s; this run can be neither resumed nor stopped",
                cfg["thread_id"],
                extra={"thread_id": cfg["thread_id"]},
            )
        cfg["user_id"] = user_id_of(cfg)  # the checkpointer's calls read it by the same rule
        if "run_id" not in cfg:
            # 10xGraph takes a missing run id (and thread id) from the id generator too.
            cfg["run_id"] = self._new_id()
        cfg.setdefault("timestamp", datetime.now().isoformat())
        cfg.setdefault("is_stream", False)
        return cfg, _core.RunOptions(cfg)

    async def ainvoke(
        self,
        input_data: dict[str, Any],
        config: dict[str, Any] | None = None,
        response_granularity: ResponseGranularity | str = ResponseGranularity.LOW,
    ) -> dict[str, Any]:
        """Runs the graph on ``config["thread_id"]`` until END, a pause, a stop or an error.

        After every node the state and the node's new messages are committed in one
        transaction; a crashed run resumes with ``ainvoke({}, config)`` at the node in flight.
        """
        granularity = ResponseGranularity(response_granularity).value
        cfg, options = self._prepare_config(config)
        run = Run(self, cfg, input_data)
        run.options = options
        key = (str(cfg["thread_id"]), str(cfg["user_id"]))
        await self._validate_input(run, cfg)
        run.known = self._live.take(key)
        outcome = await self._execute(run, cfg)
        # "low" hands out copies of its messages only, so nobody else can change the live state.
        # A stopped run's node was cancelled, not awaited: its cleanup may still change the state.
        # A state a load would not give back as it is (Run.reshaped) is not kept either.
        response = run.response(granularity)
        if (granularity == ResponseGranularity.LOW.value and outcome.get("mark") and run.state is not None
                and not outcome.get("stopped") and not run.reshaped):
            self._live.keep(key, int(outcome["version"]), str(outcome["mark"]), run.state, run._index, run.kept_row,
                            run.committed_as)
        return response

    async def _validate_input(self, run: Run, cfg: dict[str, Any]) -> None:
        """The config's authz policy, then the callback manager's input validators on the run's
        new messages, before anything is merged or persisted: a refused input leaves the thread
        as it was."""
        await check_authz(self._checkpointer, cfg)
        # Input the input commit would refuse, refused before anything: by then an
        # ``on_busy="interrupt"`` request had stopped the running turn for input that never ran.
        for m in run.input_messages:
            _core.text_id("message_id", m.message_id)
        if run.state_update:
            # Copied first: the encoding below would consume a generator that the copy refuses.
            fields = type(self._prototype).model_fields
            for key, value in run.state_update.items():
                if key in fields:
                    copy_update_value(key, value)
            check_state_update(self._prototype, run.state_update)
        if run.options is not None and run.options.on_busy == "interrupt" and run.input_messages:
            # The messages as the input commit will write them (NaN, what JSON cannot hold, two
            # ids that are one as stored): only here, where a refusal after the stop request would
            # have cut the running turn short; elsewhere the commit refuses them, writing nothing.
            refuse_id_twins(run.input_messages, {m.message_id for m in run.input_messages})
            for m in run.input_messages:
                encode_message_shaped(m)
        bare = not run.input_messages and not run.state_update
        if (run.has_resume or bare) and run.options is not None and run.options.on_busy == "interrupt":
            # An answer is for a thread paused at interrupt(); a running turn stopped short is not
            # paused there, so stopping it could only make the answer "nothing to resume". The
            # answer waits for the holder instead (which may pause for it). So does an input with
            # nothing in it: it stopped the running turn and then resumed nothing of it, the
            # turn's reply lost for a request that had nothing to say.
            run.options = _core.RunOptions({**cfg, "on_busy": "wait"})
        if run.has_lifecycle_hooks:
            await self._refuse_other_owner(cfg)
        if run.input_messages and self._callbacks._validators:
            await self._run_validators(run, cfg)

    async def _run_validators(self, run: Run, cfg: dict[str, Any]) -> None:
        """The input validators, given the run's ``node_timeout`` like a node: one that never
        returned hung ``ainvoke`` for good, before anything was stored, where neither a deadline
        nor ``stop()`` reaches (red-team, session 35; 10xGraph the same). One that runs out
        refuses the input (a validator that cannot say yes is not a yes)."""
        limit = resolve_timeout(cfg, "node_timeout", DEFAULT_NODE_TIMEOUT_SECONDS)
        checks = self._callbacks.execute_validators(run.input_messages, config=cfg)
        if limit is None:
            await checks
            return
        try:
            await within(checks, limit)
        except TimeoutError:
            raise ValidationError(
                f"the input validators did not return within node_timeout ({limit:g}s); the input was refused "
                "and nothing of it was stored", "validator_timeout", {"node_timeout": limit}) from None

    async def _refuse_other_owner(self, cfg: dict[str, Any]) -> None:
        """With user isolation, a run on another user's thread is refused by the store at its
        first commit, which comes after ``on_graph_start``: checked here first, so no hook fires
        for a run that cannot happen. Only with lifecycle hooks (one owner read per run); the
        store's refusal stays the guarantee."""
        if not getattr(self._checkpointer, "enforce_user_isolation", False):
            return
        try:
            owner = await thread_owner(self._checkpointer, str(cfg["thread_id"]))
        except StorageError as exc:
            if exc.error_code != "STORAGE_FORBIDDEN_003":
                raise
            return  # a checkpointer of the user's that cannot tell: its own refusal decides
        if owner is not None and owner != str(cfg["user_id"]):
            raise StorageError(f"Thread '{cfg['thread_id']}' belongs to another user", "STORAGE_FORBIDDEN_001",
                               {"thread_id": str(cfg["thread_id"])})

    def _new_id(self) -> str:
        """A fresh id from this graph's generator (else the process-wide one, else a uuid4)."""
        token = _use_run_id_generator(self._id_fn)
        try:
            return str(generate_id(None))
        finally:
            _reset_run_id_generator(token)

    async def _execute(self, run: Run, cfg: dict[str, Any], streaming: bool = False,
                       resume_only: bool = False) -> dict[str, Any]:
        """One pass of the Rust loop for ``run``; returns the outcome (exec, version, stopped)."""
        if self._closed:
            raise RuntimeError("this graph was closed with aclose()")
        # Every tenxgraph log line of this run, here and in the node and tool tasks started from
        # this context, carries the run's fields.
        with log_fields(thread_id=cfg["thread_id"], run_id=cfg["run_id"]):
            # And every message made in them gets this graph's id generator (when it has one).
            token = _use_run_id_generator(self._id_fn)
            try:
                # Known as in flight on its checkpointer: closing waits for it (see _in_flight).
                with in_flight.tracked(self._checkpointer, str(cfg["thread_id"])):
                    return await self._execute_in_context(run, cfg, streaming, resume_only)
            finally:
                _reset_run_id_generator(token)

    async def _execute_in_context(self, run: Run, cfg: dict[str, Any], streaming: bool,
                                  resume_only: bool = False) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        if self._outbox is not None:
            run.events = RunEvents(self._outbox, loop, cfg)
            run.events.graph_start()
        # Nodes and tools of this run (started from the context copied below) reach the graph's
        # publisher through publish_event(event).
        token = activate_publisher(self._outbox, loop)
        try:
            outcome = await self._run_native(run, cfg, streaming, resume_only)
        except Exception as exc:
            if run.events is not None:
                run.events.graph_error(run.state, exc)
            raise
        finally:
            deactivate_publisher(token)
        if run.events is not None and not outcome.get("nothing_to_resume"):
            run.events.graph_end(run.state, run.response("full")["messages"], outcome)
        return outcome

    async def _aresume(self, config: dict[str, Any]) -> dict[str, Any]:
        """Recovery's ``ainvoke({}, config)``: under the lease, continues the thread only if it is
        still running; the outcome says ``nothing_to_resume`` otherwise (nothing ran or changed)."""
        cfg, options = self._prepare_config(config)
        run = Run(self, cfg, {})
        run.options = options
        run.known = self._live.take((str(cfg["thread_id"]), str(cfg["user_id"])))
        return await self._execute(run, cfg, resume_only=True)

    def invoke(
        self,
        input_data: dict[str, Any],
        config: dict[str, Any] | None = None,
        response_granularity: ResponseGranularity | str = ResponseGranularity.LOW,
    ) -> dict[str, Any]:
        """Blocking twin of ``ainvoke`` (same guarantees, same errors); callable from inside a running
        event loop too (the run then has a private loop in a worker thread)."""
        return run_sync(self._ainvoke_delivered(input_data, config, response_granularity))

    async def _ainvoke_delivered(self, input_data: dict[str, Any], config: dict[str, Any] | None,
                                 response_granularity: ResponseGranularity | str) -> dict[str, Any]:
        """Sync ``invoke`` ends its private loop with the run: the run's last events get a short,
        bounded chance to reach the publisher first (a hung publisher costs at most that)."""
        try:
            return await self.ainvoke(input_data, config, response_granularity)
        finally:
            if self._outbox is not None:
                await self._outbox.flush(SYNC_EVENT_FLUSH_SECONDS)

    def attach_remote_tools(self, tools: list[dict[str, Any] | RemoteToolConfig], node_name: str | None = None) -> None:
        """Declares tools the client runs (10xGraph's client-side tools) on a ToolNode.

        ``tools``: ``RemoteToolConfig`` values (or their flat dict form, each naming its
        ``node``) when ``node_name`` is None; otherwise OpenAI function schemas for ``node_name``.
        When the model calls one, the tool node answers its other calls, the run pauses after the
        node (``interrupt_reason == "remote_tool_call"``) and returns a ``RemoteToolCallBlock``
        message per client call; invoke the thread again with ``{"messages": [tool results]}``
        to go on. The pause is a committed state: it survives a restart."""
        attach_remote_tools(self._builder, tools, node_name)

    async def astop(self, config: dict[str, Any]) -> dict[str, Any]:
        """Asks the run on this thread (and user) to stop; a node in flight is cancelled."""
        cfg, _ = self._prepare_config(config)
        cp = self._checkpointer
        thread_id, user_id = str(cfg["thread_id"]), str(cfg["user_id"])
        # The lease before the state: the request names the last token seen, and a run that
        # starts after this read is never the one stopped (a request landing after its run ended
        # stopped the thread's next turn: red-teams, sessions 35 and 36).
        token = await stop_token(cp._native, thread_id, user_id)
        python_store = hasattr(cp, "_python_store")
        if python_store:
            # A checkpointer written in Python is called as a run calls it: on its own loop, within
            # its call_timeout (a hung store hung stop() for good).
            from tenxgraph.storage.checkpointer.python_store import bounded_call

            state = await bounded_call(cp, "aget_state", lambda: cp.aget_state(cfg))
        else:
            state = await cp.aget_state(cfg)
        if state is None:
            return {"ok": False, "running": False, "reason": "no-state"}
        if state.execution_meta.status == ExecutionStatus.RUNNING:
            if python_store:
                await bounded_call(cp, "arequest_stop", lambda: cp.arequest_stop(cfg))
                # A checkpointer written in Python keeps its own cache: the loop is told directly.
                await cp._native.request_stop(thread_id, user_id, token)
            else:
                await cp.arequest_stop({**cfg, "_stop_token": token})
            return {"ok": True, "running": True}
        return {"ok": True, "running": False, "reason": "not-running"}

    def stop(self, config: dict[str, Any]) -> dict[str, Any]:
        """Blocking twin of ``astop``."""
        return run_sync(self.astop(config))

    def override_node(self, name: str, func: Any) -> CompiledGraph[StateT]:
        """Replaces the body of an existing node for later runs (KeyError when there is none);
        the topology compiled into the Rust loop stays as it is. Returns self."""
        from tenxgraph.core.graph.node import Node

        if name not in self._nodes:
            raise KeyError(f"Node '{name}' does not exist")
        # A new dict and, when the node's kind changes, a new topology: a run holds the pair it
        # started with (Run.nodes, Run.native), so a run in flight never drives a plain function
        # as a tool node, nor a ToolNode as a plain node (which would run its tools unrecorded).
        nodes = dict(self._nodes)
        nodes[name] = Node(name, func)
        kind_changed = _is_tool_node(self._nodes[name].func) != _is_tool_node(func)
        self._nodes = nodes
        if kind_changed:
            self._native = self._build_native()
        return self

    def generate_graph(self) -> dict[str, Any]:
        """The topology as a dict: ``info`` (counts, entry point, state class, checkpointer class,
        interrupt lists), ``nodes`` and ``edges`` (a conditional edge without a path map has no
        target)."""
        b = self._builder
        return {
            "info": {
                "node_count": len(b.nodes),
                "edge_count": len(b.edges),
                "entry_point": b.entry_point,
                "state_type": self._state_type.__name__,
                "checkpointer": type(self._checkpointer).__name__,
                "interrupt_before": self.interrupt_before,
                "interrupt_after": self.interrupt_after,
            },
            "nodes": [{"id": n, "name": n} for n in b.nodes],
            "edges": [
                {"id": f"{e.from_node}->{e.to_node or '?'}:{i}", "source": e.from_node, "target": e.to_node}
                for i, e in enumerate(b.edges)
            ],
        }
