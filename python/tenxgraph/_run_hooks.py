"""10xGraph's graph lifecycle hooks (on_graph_start, on_resume, on_state_update, on_interrupt,
on_checkpoint, on_graph_end, on_graph_error) for a run: the Rust loop reaches a lifecycle point
and ``Run.lifecycle`` fires the hooks there."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from tenxgraph._abandon import within
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.reducers import add_messages
from tenxgraph.logs import run_logger
from tenxgraph.utils.callbacks import GraphLifecycleContext

if TYPE_CHECKING:
    from tenxgraph._core import ExecView
    from tenxgraph.core.graph.compiled_graph import CompiledGraph
    from tenxgraph.utils.callbacks import CallbackManager

__all__ = ["NOT_MERGED", "RunHooks"]

_log = run_logger("tenxgraph.graph")

# RunHooks._caller before the run's input was merged (or for a run without input).
NOT_MERGED: Any = object()


class StartEffect:
    """What ``on_resume``/``on_graph_start`` changed on the state: the fields they set (compared by
    their JSON dump; ``execution_meta`` is the loop's) and the messages they added. Kept so a start
    the loop prepares again (a refused optimistic input commit) gets the same changes without the
    hooks firing a second time for one call."""

    def __init__(self, dumped: dict[str, Any], ids: set[Any]) -> None:
        self._dumped = dumped
        self._ids = ids
        self.fields: dict[str, Any] = {}
        self.added: list[Message] = []

    @staticmethod
    def _dump(state: AgentState) -> dict[str, Any]:
        return state.model_dump(mode="json", exclude={"context", "execution_meta"})

    @classmethod
    def before(cls, state: AgentState) -> StartEffect:
        return cls(cls._dump(state), {m.message_id for m in state.context})

    def after(self, state: Any) -> StartEffect:
        if not isinstance(state, AgentState):
            return self  # ignored by _adopt, with its warning
        now = self._dump(state)
        self.fields = {k: copy.deepcopy(getattr(state, k)) for k, v in now.items() if self._dumped.get(k) != v}
        self.added = [m.model_copy(deep=True) for m in state.context if m.message_id not in self._ids]
        self._dumped = {}
        return self

    def apply(self, state: AgentState) -> AgentState:
        for key, value in self.fields.items():
            setattr(state, key, copy.deepcopy(value))
        if self.added:
            state.context = add_messages(state.context, [m.model_copy(deep=True) for m in self.added])
        return state


class RunHooks:
    """The lifecycle part of ``tenxgraph._runtime.Run`` (which sets these attributes)."""

    graph: CompiledGraph[Any]
    config: dict[str, Any]
    state: AgentState | None
    input_messages: list[Message]
    _caller: Any  # the response's user message, or NOT_MERGED (Run.prepare)
    produced: list[Message]
    _callbacks: CallbackManager
    _input_data: dict[str, Any]
    _resumed_node: str | None
    _before_node: AgentState | None
    _node_error: BaseException | None
    _initial_commit: bool
    _start_effect: StartEffect | None
    _committed: list[Message]
    _encoded: dict[int, tuple[Message, str]]

    if TYPE_CHECKING:  # Run's own

        def _log_fields(self, **more: str) -> dict[str, str]: ...

        def _apply_exec(self, state: AgentState, view: ExecView) -> None: ...

        def _settle_dropped_node(self) -> None: ...

    def lifecycle(self, point: str, node: str | None, kind: str | None, exec_view: ExecView) -> Any:
        """The loop reached a lifecycle point: fires the hooks (a coroutine, for the loop to
        await); returns the error message to persist at ``error`` (None keeps it)."""
        self._encoded.clear()
        self._settle_dropped_node()
        return self._bounded(point, self._fire_lifecycle(point, node, kind, exec_view))

    async def _bounded(self, point: str, hooks: Any) -> str | None:
        """The hooks of one point, given the run's ``node_timeout`` (default 900 s) like a node:
        a hook that never returned hung ``ainvoke`` for good, past any deadline and ``stop()``
        (10xGraph the same). One that runs out is abandoned, logged, and the run goes on, as
        for a hook that raises (10xGraph's rule: a hook never decides the run's outcome)."""
        from tenxgraph.core.graph.compiled_graph import resolve_timeout
        from tenxgraph.utils.constants import DEFAULT_NODE_TIMEOUT_SECONDS

        limit = resolve_timeout(self.config, "node_timeout", DEFAULT_NODE_TIMEOUT_SECONDS)
        if limit is None:
            return await hooks
        try:
            # Not wait_for: a hook that swallows its cancellation held the run for good.
            return await within(hooks, limit)
        except TimeoutError:
            _log.warning("lifecycle hooks at %s did not return within node_timeout (%gs); abandoned, the run goes on",
                         point, limit, extra=self._log_fields(event="lifecycle_hook_timeout"))
            return None

    async def _fire_lifecycle(self, point: str, node: str | None, kind: str | None, exec_view: ExecView) -> str | None:
        state = self.state
        if state is None:
            return None
        self._apply_exec(state, exec_view)
        mgr = self._callbacks
        ctx = GraphLifecycleContext(config=self.config)
        step = state.execution_meta.step
        message: str | None = None
        # The one commit between "start" and the next point is the run's input commit. 10xGraph
        # writes nothing there when the run brings no messages (a resume), so it fires no
        # on_checkpoint for it either.
        initial, self._initial_commit = self._initial_commit, point == "start"
        if point == "checkpoint" and initial and not self.input_messages:
            return None
        if point == "start":
            if self._start_effect is not None:
                # The loop prepared the run again after its optimistic input commit was refused
                # (another run took or moved the thread): the hooks ran once for this call; what
                # they changed is put on the state loaded again instead of calling them twice.
                state = self._start_effect.apply(state)
            else:
                before = StartEffect.before(state)
                if self._resumed_node is not None:
                    state = await mgr.fire_on_resume(ctx, self._resumed_node, state, dict(self._input_data))
                state = await mgr.fire_on_graph_start(ctx, state)
                self._start_effect = before.after(state)
        elif point == "node_done":
            old = self._before_node if self._before_node is not None else state
            self._before_node = None
            state = await mgr.fire_on_state_update(ctx, node or "", old, state, step)
        elif point == "interrupt":
            state = await mgr.fire_on_interrupt(ctx, node or "", kind or "", state)
        elif point == "checkpoint":
            # The messages this commit adds; a hook may change the state, not which messages
            # are written (the Rust loop writes the context as it is).
            done, context = len(self._committed), state.context
            fresh = list(context[done:]) if context[:done] == self._committed else list(context)
            state, _ = await mgr.fire_on_checkpoint(ctx, state, fresh, False)
        elif point == "end":
            state = await mgr.fire_on_graph_end(ctx, state, self._run_messages(state), step)
        elif point == "error":
            text = str(state.execution_meta.internal_data.get("error") or "")
            error = hook_error(text, self._node_error, node=state.execution_meta.current_node)
            state, message = await mgr.fire_on_graph_error(
                ctx, error, state, self._run_messages(state), step, state.execution_meta.current_node
            )
            if message == str(error):
                message = None  # unchanged: the loop keeps its own (fuller) message
        self._adopt(state, point)
        return message

    def _caller_message(self, state: AgentState) -> Message | None:
        """The user message a response starts with: with input, the context's last user message
        once the input was merged (10xGraph's; the caller's as sent, even when a node replaced
        it in the context later, RAGAgent's SYNTHESIZE); without input (a
        resume), the thread's last user message that no node of this run produced (a
        StructuredOutputAgent's repair prompt is listed in order among the produced ones)."""
        if self._caller is not NOT_MERGED:
            return self._caller  # type: ignore[no-any-return]
        produced = {id(m) for m in self.produced}
        return next((m for m in reversed(state.context) if m.role == "user" and id(m) not in produced), None)

    def _run_messages(self, state: AgentState) -> list[Message]:
        """The run's messages as 10xGraph hands them to hooks: the turn's user message, then
        what the run produced (the same list a response carries)."""
        last_user = self._caller_message(state)
        return ([last_user] if last_user is not None else []) + [m for m in self.produced if m is not last_user]

    def _adopt(self, state: Any, point: str) -> None:
        if state is self.state:
            return
        if not isinstance(state, AgentState):
            self.graph._log.warning("a lifecycle hook at %s returned %s, not a state; ignored",
                                    point, type(state).__name__, extra=self._log_fields())
            return
        self.state = state


def hook_error(text: str, raised: BaseException | None, node: str) -> Exception:
    """The error on_graph_error is given: for a node that raised, the NodeError the caller gets
    (10xGraph hands its hooks that wrapped error too), made without logging it a second time;
    for a failure of the loop itself (timeout, recursion limit, routing), an Exception with the
    loop's message."""
    if isinstance(raised, Exception) and text.startswith("Error in node"):
        from tenxgraph.core.exceptions import NodeError, _restore

        error = _restore(NodeError, text)
        assert isinstance(error, NodeError)
        error.message, error.error_code = text, "NODE_001"
        error.context = {"node_name": node, "error_type": type(raised).__name__}
        error.__cause__ = raised
        return error
    return Exception(text)
