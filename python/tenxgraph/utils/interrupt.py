"""Dynamic human-in-the-loop pauses: ``interrupt()`` inside a node or a tool.

The first call raises ``GraphInterrupt``; the run pauses and returns normally, and
``pending_interrupt(result["state"])`` tells what was asked. Resuming the thread with
``ainvoke({"resume": value}, config)`` runs the node again from its start; this time the same
``interrupt()`` call returns ``value``. Code before ``interrupt()`` therefore runs twice: put side
effects after it. In a tool node, sibling tools that finished before the pause are answered from
the ledger and do not run again.

Several calls in one node (or one tool) are answered in order: each has its own key,
``node:<name>:<n>`` or ``tool:<tool_call_id>:<n>``.
"""

from __future__ import annotations

import contextvars
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from tenxgraph.utils.constants import RESUME_KEY

__all__ = [
    "GraphInterrupt",
    "INTERRUPT_DATA_KEY",
    "INTERRUPT_REASON",
    "Interrupt",
    "RESUME_ANSWERS_KEY",
    "RESUME_KEY",
    "RESUME_VALUES_KEY",
    "SCOPE_CONFIG_KEY",
    "interrupt",
    "pending_interrupt",
]

# 10xGraph's names, with its values: ``execution_meta.interrupt_reason`` of a pause at
# ``interrupt()``, the key of ``interrupt_data`` that holds the question, the input key of a
# resume, and the ``internal_data`` key of the answers. SCOPE_CONFIG_KEY is the config key
# 10xGraph kept a node's interrupt scope under; ours is a context variable, so nothing reads it.
INTERRUPT_REASON = "interrupt"
INTERRUPT_DATA_KEY = "interrupt"
RESUME_VALUES_KEY = "interrupt_resume"
RESUME_ANSWERS_KEY = RESUME_VALUES_KEY
SCOPE_CONFIG_KEY = "_interrupt_scope"


class Interrupt(BaseModel):
    """One pending ``interrupt()`` of a thread: ``key`` (``"<prefix>:<n>"``, the n-th call with that
    prefix in the node, which is how a resume answer finds its call), ``node``, the ``value`` and
    ``message`` shown to the user, ``reason``, an optional ``response_schema`` the answer is checked
    against, and ``tool_call_id`` when raised inside a tool. Persisted in the state, so it survives
    a restart."""
    id: str = Field(default_factory=lambda: "int_" + uuid.uuid4().hex)
    key: str
    node: str
    value: Any = None
    message: str | None = None
    reason: str = "input_required"
    response_schema: dict[str, Any] | None = None
    tool_call_id: str | None = None


class GraphInterrupt(BaseException):  # noqa: N818 - 10xGraph's name
    """Control flow, not an error: a BaseException so ``except Exception`` in user code lets it
    through to the runtime."""

    def __init__(self, interrupt: Interrupt) -> None:
        super().__init__(interrupt.message or interrupt.key)
        self.interrupt = interrupt


@dataclass
class _Scope:
    node: str
    answers: dict[str, Any]
    counters: dict[str, int] = field(default_factory=dict)
    tool_call_id: str | None = None


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("tenxgraph_interrupt_scope", default=None)


def activate(node: str, answers: dict[str, Any], tool_call_id: str | None = None,
             asked: int = 0) -> contextvars.Token[_Scope | None]:
    """Opens the scope for one node (or one tool call) in the current context; ``asked``: the
    questions of a tool call's scope already answered and spent, so its next ``interrupt()`` is
    question ``asked``."""
    counters = {f"tool:{tool_call_id}": asked} if asked and tool_call_id else {}
    return _SCOPE.set(_Scope(node, answers, counters=counters, tool_call_id=tool_call_id))


def deactivate(token: contextvars.Token[_Scope | None]) -> None:
    _SCOPE.reset(token)


def interrupt(
    value: Any = None,
    *,
    message: str | None = None,
    reason: str = "input_required",
    response_schema: dict[str, Any] | None = None,
) -> Any:
    """Pauses the run for a human answer; returns the answer once the thread is resumed."""
    scope = _SCOPE.get()
    if scope is None:
        raise RuntimeError("interrupt() can only be called while a graph node or tool is running")
    prefix = f"tool:{scope.tool_call_id}" if scope.tool_call_id else f"node:{scope.node}"
    index = scope.counters.get(prefix, 0)
    scope.counters[prefix] = index + 1
    key = f"{prefix}:{index}"
    if key in scope.answers:
        return scope.answers[key]
    question = Interrupt(
        key=key,
        node=scope.node,
        value=value,
        message=message,
        reason=reason,
        response_schema=response_schema,
        tool_call_id=scope.tool_call_id,
    )
    try:  # the question is stored with the thread: it must survive a restart as JSON
        question.model_dump_json()
    except Exception as exc:
        raise TypeError(f"interrupt() value must be JSON-serialisable: {exc}") from exc
    raise GraphInterrupt(question)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def check_answer(value: Any, schema: dict[str, Any] | None, path: str = "resume") -> None:
    """A small JSON-schema check (type, required, properties, items, enum) of a resume value
    against the interrupt's ``response_schema``; raises ValueError naming the first mismatch."""
    if not schema:
        return
    expected = schema.get("type")
    if isinstance(expected, str) and expected in _JSON_TYPES:
        ok = isinstance(value, _JSON_TYPES[expected])
        if expected in ("integer", "number") and isinstance(value, bool):
            ok = False
        if not ok:
            raise ValueError(f"{path} must be of type {expected!r} (response_schema), got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise ValueError(f"{path} must be one of {schema['enum']!r} (response_schema), got {value!r}")
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                raise ValueError(f"{path} is missing required field {name!r} (response_schema)")
        for name, sub in (schema.get("properties") or {}).items():
            if name in value and isinstance(sub, dict):
                check_answer(value[name], sub, f"{path}.{name}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            check_answer(item, schema["items"], f"{path}[{i}]")


def pending_interrupt(state: Any) -> Interrupt | None:
    """The question a paused thread is waiting on, or None."""
    meta = getattr(state, "execution_meta", None)
    if meta is None or meta.interrupt_reason != INTERRUPT_REASON or not meta.is_interrupted():
        return None
    data = (meta.interrupt_data or {}).get(INTERRUPT_DATA_KEY)
    return Interrupt.model_validate(data) if data else None
