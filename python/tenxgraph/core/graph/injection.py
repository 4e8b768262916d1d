"""Dependency injection with InjectQ, as 10xGraph 0.10 wires it (``pip install "10xgraph[di]"``).

``StateGraph(container=...)`` activates that container; without one the process-wide
``InjectQ.get_instance()`` is used. ``compile()`` binds the graph's own objects there
(``BaseCheckpointer``, ``StateGraph``, ``CompiledGraph``, ``BackgroundTaskManager``,
``BaseIDGenerator``, ``"generated_id_type"``, the ``"generated_id"`` factory (a new id from the
graph's generator at each resolution), ``BasePublisher`` (the graph's, or None; a publisher
already bound in the container is kept when the graph has none, as in 10xGraph),
``CallbackManager`` (the compiled graph's own) and ``BaseContextManager`` (or None)), so a node or tool parameter with an
``Inject[Service]`` default gets the bound service when it uses it (the default is InjectQ's
proxy, resolved from the active container). Without injectq installed nothing is bound and a
``container`` argument is refused.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["activate_container", "bind_graph_services"]

_log = logging.getLogger("tenxgraph.graph")


def _injectq() -> Any:
    try:
        import injectq
    except ImportError:
        return None
    return injectq


def activate_container(container: Any) -> None:
    """Makes ``container`` (an ``injectq.InjectQ``) the active one; nothing for None. TypeError
    when injectq is not installed or ``container`` is not a container."""
    if container is None:
        return
    if _injectq() is None or not hasattr(container, "activate"):
        raise TypeError(
            f"container must be an injectq.InjectQ (pip install \"10xgraph[di]\"), got {type(container).__name__}"
        )
    container.activate()


def bind_graph_services(container: Any, *, checkpointer: Any, graph: Any, app: Any, id_generator: Any,
                        publisher: Any = None, callback_manager: Any = None, context_manager: Any = None) -> None:
    """Binds the graph's checkpointer, builder, compiled graph, background task manager, id
    generator, publisher, callback manager, context manager and the ``"generated_id"`` factory
    into ``container`` (the global InjectQ instance when None), as 10xGraph does. No-op without
    injectq; a container that refuses the bindings is logged, not raised."""
    injectq = _injectq()
    if injectq is None:
        return
    from tenxgraph.core.graph.compiled_graph import CompiledGraph
    from tenxgraph.core.graph.state_graph import StateGraph
    from tenxgraph.core.state.context_manager import BaseContextManager
    from tenxgraph.runtime.publisher.base_publisher import BasePublisher
    from tenxgraph.storage.checkpointer import BaseCheckpointer
    from tenxgraph.utils.background_task_manager import BackgroundTaskManager
    from tenxgraph.utils.callbacks import CallbackManager
    from tenxgraph.utils.id_generator import BaseIDGenerator, DefaultIDGenerator

    target = container if container is not None else injectq.InjectQ.get_instance()
    gen = id_generator if id_generator is not None else DefaultIDGenerator()
    try:
        target.bind_instance(BaseCheckpointer, checkpointer, allow_concrete=True)
        target.bind_instance(StateGraph, graph)
        target.bind_instance(CompiledGraph, app)
        target.bind_instance(BackgroundTaskManager, app._task_manager)
        target.bind_instance(BaseIDGenerator, gen, allow_concrete=True)
        target.bind("generated_id_type", gen.id_type)
        target.bind_factory("generated_id", gen.generate)
        # A publisher wired into the container before compile (an app's bootstrap) is kept when
        # the graph has none of its own; `has`, not a resolution, which would try to build the
        # abstract class.
        if publisher is not None or not target.has(BasePublisher):
            target.bind_instance(BasePublisher, publisher, allow_none=True, allow_concrete=True)
        if callback_manager is not None:
            target.bind_instance(CallbackManager, callback_manager, allow_concrete=True)
        target.bind_instance(BaseContextManager, context_manager, allow_none=True, allow_concrete=True)
    except Exception as exc:  # a frozen (compiled) container: the graph runs; Inject of these fails later
        _log.warning("could not bind the graph's services into the InjectQ container: %s", exc)
