"""A sync tool's call, on a worker thread (``_sync_calls``): what it returned or raised comes back
to the loop, and a result that arrives after the run stopped waiting is still recorded from the
worker thread, where no event loop is needed."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from tenxgraph import _sync_calls
from tenxgraph.core.graph.tool_outcome import ToolOutcome, failure, map_result, returned
from tenxgraph.logs import run_logger

__all__ = ["SyncCall", "exit_error", "run_sync", "run_sync_raw", "with_changes"]

_log = run_logger("tenxgraph.graph.tool_node")


@dataclass
class _Raw:
    value: Any
    changes: dict[str, Any] | None = None


def _changes(late_record: Any) -> dict[str, Any] | None:
    """The state fields the call changed in place, measured on the worker thread as the tool
    returns, where ``late_record`` can measure them (ToolStep's recorder does): on the state of
    the attempt that started the call. A later attempt that joins the call, and the late record
    of a call no attempt waits for any more, take them from here; the state they were made on
    is no longer the run's (the cut node's failure stored its start: session 37)."""
    measure = getattr(late_record, "changes", None)
    if measure is None:
        return None
    try:
        return measure()  # type: ignore[no-any-return]
    except Exception as exc:  # noqa: BLE001 - never the tool's failure: its result stands, unmeasured
        _log.warning("the state changes of sync tool call could not be measured: %r", exc)
        return None


def _drop_tracebacks(exc: BaseException | None) -> None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def with_changes(outcome: ToolOutcome, changes: dict[str, Any] | None) -> ToolOutcome:
    """``outcome`` with the fields its call changed in place under its ToolResult update."""
    if changes:
        outcome.state_update = {**changes, **(outcome.state_update or {})}
    return outcome


@dataclass
class _Raised:
    error: Exception
    changes: dict[str, Any] | None = None


@dataclass
class _Awaitable:
    """What a sync tool returned when it was an awaitable: finished on the loop, not the thread."""

    value: Any


@dataclass(frozen=True)
class SyncCall:
    """One call of a sync tool: the function and its bound arguments, the call it answers
    (``name``, ``tool_call_id``, ``meta`` for its result message), the key of a call already
    running it (``tenxgraph._sync_calls``), and where a result that arrives after the run
    stopped waiting is recorded."""

    fn: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    name: str
    tool_call_id: str
    meta: dict[str, Any]
    flight_key: Hashable | None
    late_record: Callable[[ToolOutcome], Any] | None
    # Filled by run_sync_raw before it returns or raises: ``"changes"``, the state fields the
    # call changed in place (see ``_changes``), for the outcome its callbacks end with.
    measured: dict[str, Any] | None = None


async def run_sync_raw(call: SyncCall) -> Any:
    """A sync tool in its thread, returning what it returned (after_invoke needs the raw
    value); the fields it changed in place go to ``call.measured``. A result that arrives after
    the run stopped waiting is recorded as it is: no callback can run for it any more."""
    fn, args, kwargs, name, tool_call_id, meta = call.fn, call.args, call.kwargs, call.name, call.tool_call_id, call.meta
    late_record = call.late_record

    def work() -> Any:
        try:
            value = fn(*args, **kwargs)
            return _Raw(value, _changes(late_record))
        except Exception as exc:  # noqa: BLE001 - raised again on the loop, for on_error
            return _Raised(exc, _changes(late_record))
        except SystemExit as exc:
            return _Raised(exit_error(exc), _changes(late_record))

    def late(out: Any) -> Any:
        if late_record is None or (isinstance(out, _Raw) and inspect.isawaitable(out.value)):
            return None
        try:
            if isinstance(out, _Raised):  # recorded like a late failure without callbacks
                return late_record(with_changes(failure(name, tool_call_id, meta, out.error), out.changes))
            return late_record(with_changes(map_result(out.value, tool_call_id, meta)[0], out.changes))
        except Exception as exc:  # noqa: BLE001 - off the loop, nobody to raise to
            _log.warning("late result of sync tool '%s' could not be recorded: %r", name, exc)
            return None
        finally:
            if isinstance(out, _Raised):
                # Kept joinable for a while (tenxgraph._sync_calls): its traceback held the tool's
                # frame, and with it the run's state (fifth red-team pass).
                _drop_tracebacks(out.error)

    out = await _sync_calls.run(call.flight_key, work, late if late_record is not None else None, name)
    if call.measured is not None:
        call.measured["changes"] = out.changes
    if isinstance(out, _Raised):
        raise out.error
    value = out.value
    if inspect.isawaitable(value):
        value = await value
    return value


async def run_sync(call: SyncCall, on_return: Callable[[Callable[[], ToolOutcome]], None] | None = None
                   ) -> tuple[ToolOutcome, bool]:
    """A sync tool in its thread, as its outcome (made on the worker thread); ``on_return`` is
    told as soon as it returned."""
    fn, args, kwargs, name, tool_call_id, meta = call.fn, call.args, call.kwargs, call.name, call.tool_call_id, call.meta
    late_record = call.late_record
    def work() -> Any:
        # The whole outcome is made on the worker thread: a result nobody waits for any more
        # must still be recordable without the event loop.
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                return _Awaitable(result)
            outcome, ok = map_result(result, tool_call_id, meta)
            return with_changes(outcome, _changes(late_record)), ok
        except Exception as exc:  # noqa: BLE001 - a tool error goes back to the model
            return with_changes(failure(name, tool_call_id, meta, exc), _changes(late_record)), False
        except SystemExit as exc:
            return with_changes(failure(name, tool_call_id, meta, exit_error(exc)), _changes(late_record)), False

    def late(out: Any) -> Any:
        if isinstance(out, _Awaitable):  # only a loop could finish it, and its run is gone
            _log.warning("sync tool '%s' returned an awaitable after its run stopped waiting; "
                         "it is dropped, nothing is recorded", name, extra={"tool": name})
            close = getattr(out.value, "close", None)
            if callable(close):
                close()
            return None
        return late_record(out[0]) if late_record is not None else None

    out = await _sync_calls.run(call.flight_key, work, late if late_record is not None else None, name)
    if isinstance(out, _Awaitable):
        try:
            value = await out.value
        except Exception as exc:  # noqa: BLE001
            return failure(name, tool_call_id, meta, exc), False
        returned(on_return, value, tool_call_id, meta)
        return map_result(value, tool_call_id, meta)
    if on_return is not None and out[1]:
        on_return(lambda: out[0])
    return out  # type: ignore[no-any-return]


def exit_error(exc: SystemExit) -> RuntimeError:
    """A sync tool's ``sys.exit()`` as the error the model reads. In the tool's worker thread it
    would end only that thread (an argparse or click CLI wrapped as a tool, given bad arguments by
    the model); raised again in the caller's thread it ended the process and left the run behind."""
    return RuntimeError(f"the tool called sys.exit({exc.code!r})")
