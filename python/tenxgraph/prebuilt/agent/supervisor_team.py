"""SupervisorTeamAgent: SUPERVISOR (a model turn that names the next worker, or FINISH) ->
WORKER (its Agent; ``WORKER_TOOL`` loop when it has a ToolNode) -> PRE_SUPERVISOR (counts the
round) -> SUPERVISOR ... -> END. 10xGraph's constructor, node names and routing.

The supervisor's one-word decision never enters the conversation: the node returns
``Command(goto=...)``, and its past decisions are kept in
``state.execution_meta.internal_data["sta_route_history"]`` (shown to the supervisor model
only). Rounds are counted in ``internal_data["sta_rounds"]``. Both are committed with their
step, so a crash after the supervisor decided does not ask it again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tenxgraph.core.graph.agent import Agent
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.prebuilt.agent._base import PrebuiltGraph, check_agent_names, text_of, this_turns, wants_tools
from tenxgraph.prebuilt.errors import PrebuiltConfigError
from tenxgraph.utils.command import Command
from tenxgraph.utils.constants import END

__all__ = ["SupervisorTeamAgent", "WorkerConfig"]

_log = logging.getLogger("tenxgraph.prebuilt.supervisor_team")
StateT = TypeVar("StateT", bound=AgentState)
ROUNDS_KEY = "sta_rounds"
HISTORY_KEY = "sta_route_history"
TURN_KEY = "sta_turn"  # the user message the rounds belong to (see this_turns)
FINISH = "FINISH"
SUPERVISOR = "SUPERVISOR"
PRE_SUPERVISOR = "PRE_SUPERVISOR"


@dataclass
class WorkerConfig:
    """One worker: a ready :class:`Agent` (or any BaseAgent) and the ``description`` the
    supervisor's prompt shows for it. A worker whose Agent has a ToolNode gets a
    ``<NAME>_TOOL`` node, run through the replay-safe tool handler."""

    agent: Any
    description: str = ""


_PROMPT = """\
You supervise a team of workers and decide who acts next on the user's task.

Workers:
{workers}
- {finish}: the task is complete; nobody else needs to act.

Reply with one word only: the name of the next worker, or {finish} when the task is complete. \
No explanation and no other text.
"""


def _supervisor_prompt(workers: dict[str, WorkerConfig]) -> list[dict[str, str]]:
    lines = "\n".join(f"- {name}: {cfg.description or f'Specialist worker {name}.'}" for name, cfg in workers.items())
    return [{"role": "system", "content": _PROMPT.format(workers=lines, finish=FINISH)}]


def decide(raw: str, worker_names: list[str]) -> str:
    """The node a supervisor reply names: END for FINISH or nothing recognisable, else the
    first worker named as a whole word (so CODE does not match DECODE)."""
    if FINISH in raw:
        return END
    for name in worker_names:
        if re.search(rf"\b{re.escape(name.upper())}\b", raw):
            return name
    _log.warning("supervisor reply %r names no worker; ending", raw)
    return END


async def _count_round(state: AgentState) -> list[Message]:
    data = state.execution_meta.internal_data
    data[ROUNDS_KEY] = data.get(ROUNDS_KEY, 0) + 1
    return []


def _supervisor_node(agent: Agent, worker_names: list[str], max_rounds: int) -> Callable[..., Any]:
    async def supervisor(state: AgentState, config: dict[str, Any]) -> Command:
        data = this_turns(state, (ROUNDS_KEY, HISTORY_KEY), TURN_KEY)
        if data.get(ROUNDS_KEY, 0) >= max_rounds:
            _log.warning("SupervisorTeam reached max_rounds=%d; ending", max_rounds)
            return Command(goto=END)
        history: list[str] = list(data.get(HISTORY_KEY) or [])
        full = state.context
        if history:
            # Its past decisions, seen by the supervisor model only: without them it cannot tell
            # a worker already ran (they are not in the conversation).
            state.context = [*full, *(Message.text_message(n, role="assistant") for n in history)]
        try:
            # Not streamed: the routing word is not an answer the caller should see.
            reply = await agent.execute(state, {**config, "is_stream": False})
        finally:
            state.context = full
        decision = decide(text_of(reply).strip().strip("`.,:;'\"").upper(), worker_names)
        if decision != END:
            data[HISTORY_KEY] = [*history, decision]
        return Command(goto=decision)

    return supervisor


def _worker_route(tool_node_name: str) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        return tool_node_name if wants_tools(state) else PRE_SUPERVISOR

    return route


class SupervisorTeamAgent(PrebuiltGraph, Generic[StateT]):
    """A supervisor model picks which worker acts next until it answers FINISH or
    ``max_rounds`` worker turns have run. ``workers`` maps node names (upper case) to
    :class:`WorkerConfig`; the supervisor's prompt lists them unless
    ``supervisor_system_prompt`` is given. Keyword arguments go to the supervisor's Agent.
    No workers, or a worker named SUPERVISOR, raises :class:`PrebuiltConfigError`."""

    def __init__(
        self,
        supervisor_model: str,
        workers: dict[str, WorkerConfig],
        supervisor_system_prompt: list[dict[str, Any]] | None = None,
        max_rounds: int = 10,
        state: StateT | None = None,
        context_manager: Any = None,
        publisher: Any = None,
        id_generator: Any = None,
        container: Any = None,
        **supervisor_kwargs: Any,
    ) -> None:
        if not workers:
            raise PrebuiltConfigError("SupervisorTeamAgent requires at least one worker.")
        # The supervisor's own nodes, and its word for "done".
        check_agent_names("SupervisorTeamAgent", "worker", workers, reserved=(SUPERVISOR, PRE_SUPERVISOR, FINISH))
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 0:
            raise PrebuiltConfigError(f"SupervisorTeamAgent max_rounds must be an int >= 0, got {max_rounds!r}",
                                      context={"max_rounds": repr(max_rounds)})
        self._workers = dict(workers)
        self._max_rounds = max_rounds
        self._supervisor_agent = Agent(
            model=supervisor_model,
            system_prompt=supervisor_system_prompt if supervisor_system_prompt is not None
            else _supervisor_prompt(workers),
            **supervisor_kwargs)
        self._init_graph(state, context_manager, publisher, id_generator, container)

    def _configure_graph(self) -> None:
        g = self._graph = self._new_graph()
        names = list(self._workers)
        g.add_node(SUPERVISOR, _supervisor_node(self._supervisor_agent, names, self._max_rounds))
        g.add_node(PRE_SUPERVISOR, _count_round)
        g.add_edge(PRE_SUPERVISOR, SUPERVISOR)
        for name, cfg in self._workers.items():
            g.add_node(name, cfg.agent)
            tool_node = cfg.agent.get_tool_node()
            if tool_node is None:
                g.add_edge(name, PRE_SUPERVISOR)
                continue
            tool_name = f"{name}_TOOL"
            g.add_node(tool_name, tool_node)
            g.add_edge(tool_name, name)
            g.add_conditional_edges(name, _worker_route(tool_name),
                                    {tool_name: tool_name, PRE_SUPERVISOR: PRE_SUPERVISOR})
        g.set_entry_point(SUPERVISOR)
