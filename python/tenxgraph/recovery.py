"""Automatic recovery: finish the runs that died.

A run killed mid-node (a crash, a deploy, an OOM kill) leaves its thread ``running`` with nobody
holding its lease. ``await app.arecover()`` finds every such thread of the graph's checkpointer,
of every user, and continues each with ``ainvoke({}, config)`` as its owner, ``concurrency`` at
a time. Completed tools come from the ledger, so nothing that finished fires again.

Several workers may recover at once: each thread is resumed by exactly one of them. The lease
decides (``on_busy="reject"``: a worker that loses never waits), and the winner continues the
thread only if, under the lease, it is still running, so a thread another worker has just
finished is not run again. Threads that are paused (an interrupt), completed or failed are never
touched; a thread whose resume fails is reported and left for the next pass.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from tenxgraph.logs import run_logger

if TYPE_CHECKING:
    from tenxgraph.core.graph.compiled_graph import CompiledGraph

__all__ = ["FailedThread", "RecoveryReport", "ResumedThread", "SkippedThread", "recover"]

_log = run_logger("tenxgraph.recovery")
DEFAULT_CONCURRENCY = 4
PAGE_SIZE = 100
# Keys recovery sets for each thread itself; a base config naming them would be ignored or
# would make a worker wait for a busy thread.
_RESERVED = ("thread_id", "user_id", "run_id", "on_busy", "busy_timeout")


class ResumedThread(BaseModel):
    """A thread this pass continued: its status when the resumed run ended (``completed``,
    ``interrupted_before`` for an ``interrupt()``, ``interrupted_after`` when stopped)."""

    thread_id: str
    user_id: str
    status: str
    version: int


class SkippedThread(BaseModel):
    """A thread this pass left alone. ``busy``: a live run holds its lease (another worker is
    on it, or it never died), named by ``holder_run_id``. ``not_running``: by the time this
    worker held the lease the thread was no longer running (another worker finished it first);
    ``status`` is what it found."""

    thread_id: str
    user_id: str
    reason: Literal["busy", "not_running"]
    holder_run_id: str | None = None
    holder_pid: int | None = None
    status: str | None = None


class FailedThread(BaseModel):
    """A thread whose resume raised. ``status`` is the thread's stored status afterwards
    (``error`` when a node failed; ``running`` when the store failed: the next pass retries it);
    None when it could not be read."""

    thread_id: str
    user_id: str
    error: str
    error_type: str
    error_code: str | None = None
    status: str | None = None


class RecoveryReport(BaseModel):
    """What one recovery pass did, thread by thread, in the order the resumes finished."""

    resumed: list[ResumedThread] = Field(default_factory=list)
    skipped: list[SkippedThread] = Field(default_factory=list)
    failed: list[FailedThread] = Field(default_factory=list)
    #: Sources of unfinished runs the pass could not read, and why: 10xGraph 0.10's Redis entries
    #: (a run it left only there) when that Redis did not answer. Their runs are still there; a
    #: later pass (or the thread's ``ainvoke({})``) resumes them.
    unlisted: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No resume failed, and every unfinished run could be listed."""
        return not self.failed and not self.unlisted


def _check(concurrency: Any, limit: Any, config: Any) -> dict[str, Any]:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    reserved = [k for k in _RESERVED if k in config]
    if reserved:
        raise ValueError(f"config must not set {', '.join(map(repr, reserved))}: recovery sets them per thread "
                         "(each thread's owner, a fresh run id, and on_busy='reject' so it never waits)")
    return dict(config)


async def recover(
    graph: CompiledGraph[Any],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    limit: int | None = None,
    config: dict[str, Any] | None = None,
) -> RecoveryReport:
    """One recovery pass over ``graph``'s checkpointer (see the module docstring).

    ``concurrency``: resumes in flight at once. ``limit``: look at no more than this many
    running threads (None: all). ``config``: run settings for every resume (``node_timeout``,
    ``tool_timeout``, ``recursion_limit``, ``lease_ttl``, ...), checked before any thread is
    touched. Raises only for bad arguments, or when the store cannot list the threads at all;
    a failing thread goes to ``failed``.
    """
    base = _check(concurrency, limit, config)
    # Bad run settings fail the pass up front, not once per thread.
    graph._prepare_config({**base, "thread_id": "recovery-config-check", "on_busy": "reject"})
    native = graph._checkpointer._native
    report = RecoveryReport()
    queue: asyncio.Queue[tuple[str, str, str | None, str | None] | None] = asyncio.Queue(maxsize=concurrency)

    async def worker() -> None:
        while (item := await queue.get()) is not None:
            await _recover_one(graph, base, item, report)

    # Started as threads are found, up to `concurrency`: made up front, a large value (the CLI
    # takes up to 2**63-1) cost ~1.5 KB per task before a thread was looked at (red-team, session 31).
    workers: list[asyncio.Task[None]] = []
    try:
        after: str | None = None
        seen = 0
        while limit is None or seen < limit:
            size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - seen)
            page = await native.recovery_candidates(after, size)
            unlisted = native.recovery_unlisted()
            if unlisted is not None and unlisted not in report.unlisted:
                report.unlisted.append(unlisted)
                _log.warning("recovery: unfinished runs could not all be listed: %s", unlisted,
                             extra={"event": "recovery_unlisted"})
            for item in page:
                if len(workers) < concurrency:
                    workers.append(asyncio.create_task(worker()))
                await queue.put(item)
            seen += len(page)
            if len(page) < size:
                break
            after = page[-1][0]
    except Exception:
        # The listing failed (the store is down): the resumes already handed out finish first.
        await _drain(queue, workers)
        raise
    except BaseException:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    await _drain(queue, workers)
    _log.info("recovery pass: %d resumed, %d skipped, %d failed",
              len(report.resumed), len(report.skipped), len(report.failed),
              extra={"event": "recovery_pass"})
    return report


async def _drain(queue: asyncio.Queue[Any], workers: list[asyncio.Task[None]]) -> None:
    for _ in workers:
        await queue.put(None)
    await asyncio.gather(*workers)


async def _recover_one(graph: CompiledGraph[Any], base: dict[str, Any],
                       item: tuple[str, str, str | None, str | None], report: RecoveryReport) -> None:
    from tenxgraph.core.exceptions import ThreadBusyError

    thread_id, user_id, holder_json, refused = item
    fields = {"thread_id": thread_id, "event": "recovery"}
    if refused is not None:
        # An id this store's id type refuses (10xGraph stored 0 and negative ids on int schemas):
        # no run here can take it, so it is reported every pass and the others go on.
        report.failed.append(FailedThread(thread_id=thread_id, user_id=user_id, error=refused,
                                          error_type="InvalidConfigError", error_code="STORAGE_CONFIG_002",
                                          status="running"))
        _log.warning("recovery: thread %s cannot be resumed here: %s", thread_id, refused, extra=fields)
        return
    if holder_json is not None:
        holder = json.loads(holder_json)
        report.skipped.append(SkippedThread(thread_id=thread_id, user_id=user_id, reason="busy",
                                            holder_run_id=holder.get("holder"), holder_pid=holder.get("pid")))
        _log.info("recovery: thread %s is held by live run %s; left alone", thread_id, holder.get("holder"),
                  extra=fields)
        return
    cfg = {**base, "thread_id": thread_id, "user_id": user_id, "on_busy": "reject"}
    try:
        outcome = await graph._aresume(cfg)
    except ThreadBusyError as exc:
        ctx = exc.context if isinstance(getattr(exc, "context", None), dict) else {}
        report.skipped.append(SkippedThread(thread_id=thread_id, user_id=user_id, reason="busy",
                                            holder_run_id=ctx.get("holder_run_id"), holder_pid=ctx.get("holder_pid")))
        _log.info("recovery: thread %s was taken by another run first; left to it", thread_id, extra=fields)
        return
    except Exception as exc:  # one thread's failure is reported, never raised: the pass goes on
        status = await _stored_status(graph, thread_id, user_id)
        code = getattr(exc, "error_code", None)
        report.failed.append(FailedThread(thread_id=thread_id, user_id=user_id, error=str(exc),
                                          error_type=type(exc).__name__,
                                          error_code=code if isinstance(code, str) else None, status=status))
        _log.warning("recovery: resuming thread %s failed (%s: %s); status now %s", thread_id,
                     type(exc).__name__, exc, status, extra=fields)
        return
    status = str(outcome["exec"]["status"])
    if outcome.get("nothing_to_resume"):
        report.skipped.append(SkippedThread(thread_id=thread_id, user_id=user_id, reason="not_running",
                                            status=status))
        _log.info("recovery: thread %s is no longer running (%s); nothing to resume", thread_id, status,
                  extra=fields)
        return
    report.resumed.append(ResumedThread(thread_id=thread_id, user_id=user_id, status=status,
                                        version=int(outcome["version"])))
    _log.info("recovery: resumed thread %s; it ended %s", thread_id, status, extra=fields)


async def _stored_status(graph: CompiledGraph[Any], thread_id: str, user_id: str) -> str | None:
    try:
        row = await graph._checkpointer._native.load(thread_id, user_id)
        if row is None:
            return None
        meta = json.loads(row[1]).get("execution_meta") or {}
        return str(meta.get("status")) if meta.get("status") is not None else None
    except Exception:  # noqa: BLE001 - the status is a courtesy; the failure is what is reported
        return None
