"""How a run call meets a thread that is not free, on the Python side of ``CompiledGraph``: a turn
sent again into its own cut-off run (finished instead of refused), a thread failed at a tool node
(its calls answered before the new turn), and with ``idempotent_turns`` a turn sent again while
its own run still runs (waits for it instead of interrupting it). The engine decides under the
lease; these read the thread when it refused, and call again with what the reading allows."""

from __future__ import annotations

import asyncio
import contextvars
import json
from typing import TYPE_CHECKING, Any, cast

from tenxgraph import _core, _in_flight as in_flight, _turn_request as turn_request
from tenxgraph._runtime import Run, stored_as_sent
from tenxgraph.core.exceptions import ThreadBusyError
from tenxgraph.core.state.execution_state import ExecutionStatus
from tenxgraph.logs import run_logger
from tenxgraph.storage.checkpointer.authz_guard import authz_owner_scoped
from tenxgraph.utils.interrupt import pending_interrupt

if TYPE_CHECKING:
    from tenxgraph.core.graph.compiled_graph import CompiledGraph
    from tenxgraph.storage.checkpointer import BaseCheckpointer

__all__ = ["BusyAnswers"]

_log = run_logger("tenxgraph.graph")


def _holds_as_sent(state: Any, run: Run) -> bool:
    """Whether the thread's state holds every input message of ``run`` as sent (id, role,
    content)."""
    if state is None:
        return False
    stored = {str(m.message_id): m for m in state.context}
    return all((kept := stored.get(str(m.message_id))) is not None and stored_as_sent(kept, m)
               for m in run.input_messages)


class BusyAnswers:
    """Mixin of ``CompiledGraph``: the native call of a run, and its answers to a busy thread."""

    _checkpointer: BaseCheckpointer

    async def _run_native(self, run: Run, cfg: dict[str, Any], streaming: bool, resume_only: bool) -> dict[str, Any]:
        options = run.options if run.options is not None else _core.RunOptions(cfg)
        # A run of this thread its caller just cancelled is let unwind first (see _in_flight).
        await in_flight.settle_cancelled(self._checkpointer, str(cfg["thread_id"]), options.busy_timeout)
        try:
            raw = await self._call_beside_its_own_turn(run, cfg, options, streaming, resume_only)
        except ThreadBusyError as exc:
            if exc.error_code == "STORAGE_BUSY_001" and run.input_messages:
                await self._refuse_messages_at_a_tool_pause(run, cfg)
            if not exc.context.get("failed_tool_node"):
                if exc.error_code != "STORAGE_BUSY_001" or not await self._resent_into_a_cut_off_turn(run, cfg):
                    raise
                # The turn was sent again after its run was cut off (a client's retry after a
                # crash, a second worker given the same request): every input message is stored
                # already, so this is that turn's `{}`, and it is finished instead of refused.
                _log.info("every input message of thread %s is stored, in a turn its run left unfinished; "
                          "that turn is resumed", cfg["thread_id"], extra={"event": "resent_turn_resumed"})
                run.input_messages, run.state_update = [], {}  # both in the stored turn already
                run.known = None
                raw = await self._native_call(run, cfg, options, streaming, resume_only)
            else:
                raw = await self._answer_failed_tools(run, cfg, options, streaming, resume_only, exc)
        text, run.kept_row = raw
        outcome: dict[str, Any] = json.loads(text)
        _log.debug("run %s ended at version %s", cfg["run_id"], outcome["version"])
        return outcome

    async def _refuse_messages_at_a_tool_pause(self, run: Run, cfg: dict[str, Any]) -> None:
        """The engine refuses new messages at a pause at interrupt() inside a tool node (they
        would land between the calls and their results). Without an answer the caller is told
        what 10xGraph tells it, and what a pause in any other node gets: answer the question;
        with one, to send the messages after it. Both were "resume it with ainvoke({})", which
        led to the first ValueError (red-team, session 35). Nothing is written either way."""
        state = await self._checkpointer.aget_state(cfg)
        paused = pending_interrupt(state) if state is not None else None
        if paused is None:
            return
        if not run.has_resume:
            try:
                run._check_resume(state)
            except ValueError as refused:
                raise refused from None
        raise ValueError(f"Thread is paused at interrupt '{paused.id}' inside tool node '{paused.node}': new messages "
                         "cannot come with the answer there (they would land between the tool calls and their "
                         "results). Send {'resume': value} alone, then the messages; nothing was written.")

    async def _call_beside_its_own_turn(self, run: Run, cfg: dict[str, Any], options: Any, streaming: bool,
                                        resume_only: bool) -> Any:
        """``on_busy="interrupt"`` with ``idempotent_turns``: a turn sent again while its own run
        still runs (a client's retry, two workers given one request at once) must wait for that
        run, not stop it: stopped, the turn was cut short, its reply never made, for both callers
        (red-team, session 25). Whether the holder's turn is this one is read once the thread is
        found held (a holder's lease and its input are one commit), by a first try that does not
        wait; a turn of its own then waits, any other input interrupts as asked."""
        if not (options.on_busy == "interrupt" and cfg.get("idempotent_turns") is True and run.input_messages):
            return await self._native_call(run, cfg, options, streaming, resume_only)
        try:
            return await self._native_call(run, cfg, _core.RunOptions({**cfg, "on_busy": "reject"}), streaming,
                                           resume_only)
        except ThreadBusyError as exc:
            if exc.error_code != "STORAGE_BUSY_002":
                raise
        if _holds_as_sent(await self._checkpointer.aget_state(cfg), run):
            options = _core.RunOptions({**cfg, "on_busy": "wait"})
        run.known = None
        return await self._native_call(run, cfg, options, streaming, resume_only)

    async def _answer_failed_tools(self, run: Run, cfg: dict[str, Any], options: Any, streaming: bool,
                                   resume_only: bool, exc: ThreadBusyError) -> Any:
        """The thread failed at a tool node (a node timeout, say), its calls unanswered: the new
        turn cannot land between those calls and their results, and `{}` would fail the same way
        again. Each call is answered first (from the ledger, or "not run again"), the thread is
        completed, and the turn goes on."""
        if any(m.role == "tool" for m in run.input_messages):
            # Tool results sent as the new input would land after the close's own answers to the
            # same calls (two results for one call): refused as before the close existed.
            raise exc
        await self._close_failed_tools(cfg, options, str(exc.context.get("current_node", "")))
        run.known = None  # the close committed after the state this process kept
        return await self._native_call(run, cfg, options, streaming, resume_only)

    async def _resent_into_a_cut_off_turn(self, run: Run, cfg: dict[str, Any]) -> bool:
        """Whether the thread's run was cut off mid-turn (a crash, a cancel: status running) and
        every input message is stored in it already, as sent (role and content: a changed text
        under a stored id is new input, refused there). A thread paused or stopped mid-turn is
        not resumed by a resend: there `{}` would answer a reviewer's question nobody answered."""
        idempotent = cfg.get("idempotent_turns") is True
        if (not run.input_messages or (run.state_update and not idempotent) or run.has_resume
                or run.start_node is not None):
            return False
        state = await self._checkpointer.aget_state(cfg)
        if state is None or state.execution_meta.status != ExecutionStatus.RUNNING or not _holds_as_sent(state, run):
            return False
        # With idempotent_turns the turn's record says whether a state update sent with it is the
        # one the turn was asked with (then the resend finishes it, as one without an update does).
        return not run.state_update or turn_request.recorded(
            state, run.input_messages[-1].message_id, run.state_update) is True

    async def _close_failed_tools(self, cfg: dict[str, Any], options: Any, node: str) -> None:
        """The run that answers a failed tool node's calls without running any (see
        ``RunConfig::closing_failed_tools``); nothing when, under the lease, there is none left."""
        closer = Run(cast("CompiledGraph[Any]", self), cfg, {})
        closer.closing_failed_tools = True
        raw = await self._native_call(closer, cfg, options, False, False)
        outcome = json.loads(raw[0])
        if not outcome.get("nothing_to_resume"):
            _log.warning("thread %s had failed at tool node '%s' with its calls unanswered; they were answered "
                         "(recorded results, or 'not run again') before the new turn",
                         cfg["thread_id"], node,
                         extra={"event": "failed_tool_node_closed"})

    async def _native_call(self, run: Run, cfg: dict[str, Any], options: Any, streaming: bool, resume_only: bool) -> Any:
        known = run.known
        try:
            result = await run.native.run(
                run,
                asyncio.get_running_loop(),
                contextvars.copy_context(),
                options.for_run(
                    has_messages=bool(run.input_messages),
                    # A resume answer is committed before the node, like a state update.
                    has_state_update=bool(run.state_update) or run.has_resume,
                    start_node=run.start_node,
                    streaming=streaming,
                    known_version=known[0] if known else None,
                    known_mark=known[1] if known else None,
                    known_state=known[4] if known else None,
                    resume_only=resume_only,
                    # The store checks the owner again in the run's own reads and writes: a thread
                    # another user creates after check_authz looked is still refused.
                    owner_scoped=authz_owner_scoped(cfg),
                    close_failed_tools=run.closing_failed_tools,
                ),
            )
        except BaseException as exc:
            # Cancelled (a client's timeout, a stream closed, the loop ending), or an interrupt
            # raised on the loop: the results of tools that returned are recorded first.
            if not isinstance(exc, Exception):
                try:
                    await run.record_finished_tools()
                finally:
                    # The dropped run's lease was parked until now: a resume that took the thread
                    # before these writes landed would fire a returned tool again.
                    _core.release_abandoned(str(cfg["thread_id"]), str(cfg["run_id"]), run.entered)
            elif run.cut_off_tools():
                await run.record_finished_tools()
            raise
        if run.cut_off_tools():
            # The engine dropped a tool node that was running (node_timeout, stop(), a lost
            # lease): a call that had returned, cut off in an after-invoke callback or with its
            # record in flight, was fired again by the resume (red-team, session 31).
            await run.record_finished_tools()
        return result
