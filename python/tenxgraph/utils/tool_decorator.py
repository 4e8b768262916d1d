"""The ``@tool`` decorator: tool metadata stored as ``_py_tool_*`` attributes on the function.

ToolNode reads these attributes to build the schema it advertises to the model; the
function itself is returned unchanged, so it stays directly callable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, overload

__all__ = ["NotCallableToolError", "ON_UNKNOWN", "SIDE_EFFECTS", "OnUnknown", "SideEffects", "get_tool_metadata", "has_tool_decorator", "tool"]

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
    side_effects: SideEffects | None = None,
    on_unknown: OnUnknown | None = None,
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
    side_effects: SideEffects | None = None,
    on_unknown: OnUnknown | None = None,
) -> F | Callable[[F], F]:
    """Mark a function as a tool. Usable bare (``@tool``) or with options (``@tool(name=...)``).

    ``parameters`` is a JSON schema that replaces the one generated from the signature; it must
    be a dict (ValueError otherwise, as in 10xGraph). ``description`` left as None lets ToolNode
    fall back to the docstring.

    ``side_effects`` (default ``"idempotent"``) and ``on_unknown`` (default ``"error"``) not
    given keep what an earlier ``@tool`` set: applied again (stacked, or to rename a library's
    tool) it used to reset an ``at_most_once`` tool to idempotent, which a replay runs again. A
    different value than the one set is a ValueError. On a ``staticmethod`` the function inside
    is marked (marked on the wrapper, the class's tool was a plain idempotent one).
    """
    if parameters is not None and not isinstance(parameters, dict):
        raise ValueError(f"@tool(parameters=...) must be a JSON Schema dict, got {type(parameters)}")
    _check_class(side_effects or "idempotent", on_unknown or "error")
    # A bare string would otherwise become a set of its characters.
    tag_set = {tags} if isinstance(tags, str) else set(tags or ())

    def decorate(func: F) -> F:
        if not callable(func):
            raise NotCallableToolError(f"@tool can only decorate a callable, got {type(func)}")
        target: Any = func.__func__ if isinstance(func, staticmethod) else func
        effects = _kept(target, "_py_tool_side_effects", side_effects, "side_effects")
        unknown = _kept(target, "_py_tool_on_unknown", on_unknown, "on_unknown")
        if on_unknown is None and unknown != "error" and effects != "at_most_once":
            unknown = "error"  # the class given now has no question to ask
        _check_class(effects or "idempotent", unknown or "error")
        attrs: dict[str, Any] = {
            "_py_tool_name": name or getattr(target, "__name__", type(target).__name__),
            "_py_tool_description": description,
            "_py_tool_tags": set(tag_set),
            "_py_tool_provider": provider,
            "_py_tool_capabilities": list(capabilities) if capabilities is not None else None,
            "_py_tool_metadata": dict(metadata) if metadata is not None else None,
            "_py_tool_parameters": parameters,
            "_py_tool_side_effects": effects or "idempotent",
            "_py_tool_on_unknown": unknown or "error",
        }
        for attr, value in attrs.items():
            setattr(target, attr, value)
        return func

    if _func is not None:
        return decorate(_func)
    return decorate


def _check_class(side_effects: Any, on_unknown: Any) -> None:
    if not isinstance(side_effects, str) or side_effects not in SIDE_EFFECTS:
        raise ValueError(
            f"side_effects must be one of {sorted(SIDE_EFFECTS)}, got {side_effects!r}"
        )
    if not isinstance(on_unknown, str) or on_unknown not in ON_UNKNOWN:
        raise ValueError(f"on_unknown must be one of {sorted(ON_UNKNOWN)}, got {on_unknown!r}")
    if on_unknown != "error" and side_effects != "at_most_once":
        raise ValueError(
            f"on_unknown={on_unknown!r} only applies to side_effects='at_most_once' tools "
            f"(got side_effects={side_effects!r}): other tools are re-run or never recorded"
        )


def _kept(target: Any, attr: str, given: str | None, what: str) -> str | None:
    """``given``, or what an earlier ``@tool`` set; a different value than that is refused."""
    earlier = getattr(target, attr, None) if hasattr(target, "_py_tool_name") else None
    if given is None:
        return earlier
    if earlier is not None and earlier != given and earlier != _DEFAULTS[what]:
        raise ValueError(
            f"@tool({what}={given!r}) on {getattr(target, '__name__', target)!r}, which an earlier @tool marked "
            f"{what}={earlier!r}: a tool's {what} is set once"
        )
    return given


_DEFAULTS = {"side_effects": "idempotent", "on_unknown": "error"}


class NotCallableToolError(TypeError, ValueError):
    """``@tool`` applied to something that is not callable. 10xGraph raises ValueError here; a
    TypeError is what the mistake is, so the error is both."""


def has_tool_decorator(func: Callable[..., Any]) -> bool:
    """Whether ``func`` was decorated with ``@tool``."""
    return hasattr(func, "_py_tool_name")


def get_tool_metadata(func: Callable[..., Any]) -> dict[str, Any]:
    """The tool metadata of ``func`` as 10xGraph reports it: an undecorated function has name,
    description and the rest None (tags an empty set); a decorated one without a description
    reports its docstring, or "No description provided."."""
    decorated = has_tool_decorator(func)
    description = getattr(func, "_py_tool_description", None)
    if description is None and decorated:
        description = getattr(func, "__doc__", None) or "No description provided."
    metadata = getattr(func, "_py_tool_metadata", None)
    return {
        "name": getattr(func, "_py_tool_name", None),
        "description": description,
        "tags": set(getattr(func, "_py_tool_tags", None) or ()),
        "provider": getattr(func, "_py_tool_provider", None),
        "capabilities": getattr(func, "_py_tool_capabilities", None),
        "metadata": dict(metadata) if metadata is not None else None,
        "parameters": getattr(func, "_py_tool_parameters", None),
        "side_effects": getattr(func, "_py_tool_side_effects", "idempotent"),
        "on_unknown": getattr(func, "_py_tool_on_unknown", "error"),
    }
