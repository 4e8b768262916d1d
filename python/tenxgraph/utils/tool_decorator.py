"""The ``@tool`` decorator: tool metadata stored as ``_py_tool_*`` attributes on the function.

ToolNode reads these attributes to build the schema it advertises to the model; the
function itself is returned unchanged, so it stays directly callable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, overload

__all__ = ["ON_UNKNOWN", "SIDE_EFFECTS", "OnUnknown", "SideEffects", "get_tool_metadata", "has_tool_decorator", "tool"]

F = TypeVar("F", bound=Callable[..., Any])

SideEffects = Literal["idempotent", "at_most_once", "pure"]
# What running the tool twice would do. "idempotent" (default): a call whose outcome is unknown
# (it started, the process died before its result was recorded) runs again. "at_most_once": it
# does not; the model is told the outcome is unknown, or a human decides (on_unknown="interrupt").
# "pure": no ledger at all.
SIDE_EFFECTS: frozenset[str] = frozenset({"idempotent", "at_most_once", "pure"})
OnUnknown = Literal["error", "interrupt"]
ON_UNKNOWN: frozenset[str] = frozenset({"error", "interrupt"})


@overload
def tool(_func: F, /) -> F: ...


@overload
def tool(
    _func: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    tags: Iterable[str] | str | None = None,
    provider: str | None = None,
    capabilities: Iterable[str] | None = None,
    metadata: dict[str, Any] | None = None,
    parameters: dict[str, Any] | None = None,
    side_effects: SideEffects = "idempotent",
    on_unknown: OnUnknown = "error",
) -> Callable[[F], F]: ...


def tool(
    _func: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    tags: Iterable[str] | str | None = None,
    provider: str | None = None,
    capabilities: Iterable[str] | None = None,
    metadata: dict[str, Any] | None = None,
    parameters: dict[str, Any] | None = None,
    side_effects: SideEffects = "idempotent",
    on_unknown: OnUnknown = "error",
) -> F | Callable[[F], F]:
    """Mark a function as a tool. Usable bare (``@tool``) or with options (``@tool(name=...)``).

    ``parameters`` is a JSON schema that replaces the one generated from the signature.
    ``description`` left as None lets ToolNode fall back to the docstring.
    """
    if side_effects not in SIDE_EFFECTS:
        raise ValueError(
            f"side_effects must be one of {sorted(SIDE_EFFECTS)}, got {side_effects!r}"
        )
    if on_unknown not in ON_UNKNOWN:
        raise ValueError(f"on_unknown must be one of {sorted(ON_UNKNOWN)}, got {on_unknown!r}")
    if on_unknown != "error" and side_effects != "at_most_once":
        raise ValueError(
            f"on_unknown={on_unknown!r} only applies to side_effects='at_most_once' tools "
            f"(got side_effects={side_effects!r}): other tools are re-run or never recorded"
        )
    # A bare string would otherwise become a set of its characters.
    tag_set = {tags} if isinstance(tags, str) else set(tags or ())

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(f"@tool can only decorate a callable, got {type(func).__name__}")
        attrs: dict[str, Any] = {
            "_py_tool_name": name or getattr(func, "__name__", type(func).__name__),
            "_py_tool_description": description,
            "_py_tool_tags": set(tag_set),
            "_py_tool_provider": provider,
            "_py_tool_capabilities": list(capabilities) if capabilities is not None else None,
            "_py_tool_metadata": dict(metadata) if metadata else {},
            "_py_tool_parameters": parameters,
            "_py_tool_side_effects": side_effects,
            "_py_tool_on_unknown": on_unknown,
        }
        for attr, value in attrs.items():
            setattr(func, attr, value)
        return func

    if _func is not None:
        return decorate(_func)
    return decorate


def has_tool_decorator(func: Callable[..., Any]) -> bool:
    return hasattr(func, "_py_tool_name")


def get_tool_metadata(func: Callable[..., Any]) -> dict[str, Any]:
    """The tool metadata of ``func``, with the defaults an undecorated function gets."""
    fallback_name = getattr(func, "__name__", type(func).__name__)
    return {
        "name": getattr(func, "_py_tool_name", None) or fallback_name,
        "description": getattr(func, "_py_tool_description", None) or inspect.getdoc(func),
        "tags": set(getattr(func, "_py_tool_tags", None) or ()),
        "provider": getattr(func, "_py_tool_provider", None),
        "capabilities": getattr(func, "_py_tool_capabilities", None),
        "metadata": dict(getattr(func, "_py_tool_metadata", None) or {}),
        "parameters": getattr(func, "_py_tool_parameters", None),
        "side_effects": getattr(func, "_py_tool_side_effects", "idempotent"),
        "on_unknown": getattr(func, "_py_tool_on_unknown", "error"),
    }
