"""Merging parallel tool branches back into the node's state (10xGraph §5.4 rules).

With more than one tool call, each call works on its own deep copy of the state so two tools
writing different fields cannot clobber each other; afterwards only what a branch changed against
the baseline is merged, through the field's ``Annotated`` reducer when it has one.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tenxgraph.logs import run_logger

__all__ = ["merge_tool_state", "field_reducer"]

_log = run_logger("tenxgraph.tools")
_NEVER_MERGED = frozenset({"context", "context_summary", "execution_meta"})
_MISSING = object()


def field_reducer(model: type[BaseModel], name: str) -> Any:
    """The reducer declared on ``model``'s field ``name`` (the first callable in its ``Annotated``
    metadata), or None."""
    info = model.model_fields.get(name)
    if info is None:
        return None
    return next((m for m in info.metadata if callable(m)), None)


def merge_tool_state(target: Any, branch: Any, baseline: Any) -> None:
    """Applies what ``branch`` changed relative to ``baseline`` onto ``target`` in place."""
    for name in type(branch).model_fields:
        if name in _NEVER_MERGED:
            continue
        new = getattr(branch, name, _MISSING)
        base = getattr(baseline, name, _MISSING)
        if new is _MISSING or new == base:
            continue
        reducer = field_reducer(type(target), name)
        if reducer is not None:
            setattr(target, name, reducer(getattr(target, name), new))
            continue
        if getattr(target, name, _MISSING) != base:
            _log.warning(
                "parallel tool calls both changed state field %r and it has no reducer: the last write "
                "wins; declare Annotated[..., reducer] to combine them",
                name,
            )
        setattr(target, name, new)
    _merge_internal_data(target.execution_meta.internal_data, branch.execution_meta.internal_data,
                         baseline.execution_meta.internal_data)


def _merge_internal_data(target: dict[str, Any], branch: dict[str, Any], baseline: dict[str, Any]) -> None:
    for key, value in branch.items():
        base = baseline.get(key, _MISSING)
        if value == base:
            continue
        if isinstance(value, list) and isinstance(base, list) and value[: len(base)] == base:
            current = target.get(key)
            if isinstance(current, list):
                current.extend(value[len(base):])
            else:
                target[key] = list(value)
        elif isinstance(value, list) and base is _MISSING and isinstance(target.get(key), list):
            target[key].extend(value)
        else:
            target[key] = value
