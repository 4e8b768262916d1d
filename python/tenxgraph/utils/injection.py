"""``fresh()``: resolve an ``Inject[Service]`` default now, from the active InjectQ container.

InjectQ's ``Inject[...]`` default is one proxy made when the function is defined, and it keeps the
first object it resolved: a node or tool not wrapped in ``@inject`` would go on using the first
checkpointer or publisher the process ever resolved, even after another graph activated its own
container. ``fresh(value)`` looks the service up again on each call.

injectq is the ``di`` extra and is imported only when ``fresh`` runs: without it no value can be
an ``Inject`` proxy, and ``fresh`` returns its argument unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

__all__ = ["fresh"]

T = TypeVar("T")


def fresh(value: T) -> T:
    """``value`` unchanged, unless it is an unresolved ``Inject[Service]`` default: then the service
    bound in the active container now, or None when it is not bound (an optional service stays
    absent instead of raising), as in 10xGraph 0.10."""
    try:
        from injectq import Inject, InjectQ
        from injectq.utils.exceptions import InjectQError
    except ImportError:
        return value
    if type(value) is not Inject:
        return value
    service: Any = value.service_type  # type: ignore[attr-defined]
    container = InjectQ.get_instance()
    # Asking injectq to build an unbound abstract class leaves a failed factory behind that breaks
    # later lookups of that type, so an abstract base is answered None without asking.
    if not container.has(service) and inspect.isabstract(service):
        return None  # type: ignore[return-value]
    try:
        return container.try_get(service)  # type: ignore[no-any-return]
    except InjectQError:
        return None  # type: ignore[return-value]
