"""LangSmith and Logfire as the destination of the OpenTelemetry spans, as in 10xGraph 0.10.

Both are OpenTelemetry back ends: each attaches a span processor to a ``TracerProvider`` and the
graph gets an :class:`~tenxgraph.runtime.publisher.otel_publisher.OtelPublisher` feeding it.

    from tenxgraph.runtime.publisher import setup_langsmith, setup_logfire, setup_observability

    setup_langsmith(graph, project="my-agent")        # LANGSMITH_API_KEY in the environment
    setup_logfire(graph, service_name="my-agent")     # LOGFIRE_TOKEN in the environment
    setup_observability(graph, {"logfire": {"enabled": True}, "langsmith": {"enabled": True}})

Call them before ``graph.compile()``. Extras: ``langsmith`` (the OTLP/HTTP exporter and the SDK),
``logfire``, ``observability`` (both). Spans follow the publisher's delivery rules: a slow or
unreachable back end costs spans (the SDK's batch processor drops them), never a step.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from tenxgraph.runtime.publisher.otel_publisher import ObservabilityLevel, setup_tracing

if TYPE_CHECKING:
    from tenxgraph.core.graph.state_graph import StateGraph

__all__ = ["setup_langsmith", "setup_logfire", "setup_observability"]

LANGSMITH_ENDPOINT = "https://api.smith.langchain.com/otel"


def _require(module: str, what: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # ImportError, as 10xGraph raises: deployments catch it to make tracing optional.
        raise ImportError(f"{what} needs the '{module.split('.')[0]}' package: "
                          f"pip install \"10xgraph[{extra}]\"") from exc


def langsmith_processor(*, api_key: str | None = None, project: str | None = None,
                        endpoint: str = LANGSMITH_ENDPOINT) -> Any:
    """A ``BatchSpanProcessor`` exporting over OTLP/HTTP to ``<endpoint>/v1/traces`` with the
    ``x-api-key`` header (``api_key`` or ``$LANGSMITH_API_KEY``) and, when given, the
    ``Langsmith-Project`` header. Raises ``ValueError`` without a key (before anything is
    installed) and ``ImportError`` without the ``langsmith`` extra."""
    key = api_key if api_key is not None else os.environ.get("LANGSMITH_API_KEY")
    if not isinstance(key, str) or not key.strip():
        raise ValueError("A LangSmith API key is required: pass api_key= or set LANGSMITH_API_KEY")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"the LangSmith endpoint must be an http(s) URL, got {endpoint!r}")
    http = _require("opentelemetry.exporter.otlp.proto.http.trace_exporter", "LangSmith tracing", "langsmith")
    export = _require("opentelemetry.sdk.trace.export", "LangSmith tracing", "langsmith")
    headers = {"x-api-key": key}
    if project:
        headers["Langsmith-Project"] = str(project)
    exporter = http.OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces", headers=headers)
    return export.BatchSpanProcessor(exporter)


def install_provider(processor: Any, tracer_provider: Any = None) -> Any:
    """Attaches ``processor`` to ``tracer_provider``, or to a new provider set as the global one;
    returns the tracer an ``OtelPublisher`` should use (None: the global provider's)."""
    if tracer_provider is not None:
        tracer_provider.add_span_processor(processor)
        return tracer_provider.get_tracer("10xgraph")
    sdk = _require("opentelemetry.sdk.trace", "tracing", "langsmith")
    trace = _require("opentelemetry.trace", "tracing", "otel")
    provider = sdk.TracerProvider()
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    return None


def configure_logfire(*, token: str | None = None, service_name: str | None = None,
                      send_to_logfire: bool = True, console: Any = None,
                      additional_span_processors: list[Any] | None = None, **configure_kwargs: Any) -> None:
    """``logfire.configure(...)`` with 10xGraph's argument mapping (None means "not passed")."""
    logfire = _require("logfire", "Logfire tracing", "logfire")
    kwargs: dict[str, Any] = {"send_to_logfire": send_to_logfire, **configure_kwargs}
    for name, value in (("token", token), ("service_name", service_name), ("console", console)):
        if value is not None:
            kwargs[name] = value
    if additional_span_processors:
        kwargs["additional_span_processors"] = list(additional_span_processors)
    logfire.configure(**kwargs)


def setup_logfire(graph: StateGraph[Any] | None = None, *, token: str | None = None,
                  service_name: str | None = None, send_to_logfire: bool = True, console: Any = None,
                  level: ObservabilityLevel = ObservabilityLevel.STANDARD,
                  additional_span_processors: list[Any] | None = None, **configure_kwargs: Any) -> None:
    """Configures Logfire (its provider becomes the global one), then, when ``graph`` is given,
    adds an ``OtelPublisher`` to it (``setup_tracing``). Raises ``ImportError`` without the
    ``logfire`` extra."""
    level = ObservabilityLevel(level)
    configure_logfire(token=token, service_name=service_name, send_to_logfire=send_to_logfire, console=console,
                      additional_span_processors=additional_span_processors, **configure_kwargs)
    if graph is not None:
        setup_tracing(graph, level=level)


def setup_langsmith(graph: StateGraph[Any] | None = None, *, api_key: str | None = None,
                    project: str | None = None, endpoint: str = LANGSMITH_ENDPOINT,
                    level: ObservabilityLevel = ObservabilityLevel.STANDARD, tracer_provider: Any = None) -> None:
    """Sends spans to LangSmith (``langsmith_processor`` on ``tracer_provider`` or a new global
    provider), then, when ``graph`` is given, adds an ``OtelPublisher`` bound to that provider.
    Raises ``ValueError`` without an API key and ``ImportError`` without the extra; nothing is
    installed when it raises."""
    level = ObservabilityLevel(level)
    tracer = install_provider(langsmith_processor(api_key=api_key, project=project, endpoint=endpoint),
                              tracer_provider)
    if graph is not None:
        setup_tracing(graph, tracer=tracer, level=level)


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    section = config.get(name) or {}
    if not isinstance(section, dict):
        raise ValueError(f"observability.{name} must be an object, got {type(section).__name__}")
    return section


def setup_observability(graph: StateGraph[Any] | None, config: dict[str, Any]) -> None:
    """The ``observability`` block of ``10xgraph.json``: ``{"level": "standard", "logfire":
    {"enabled": ..., "service_name", "send_to_logfire", "console"}, "langsmith": {"enabled": ...,
    "project", "endpoint"}}``. Both enabled share Logfire's provider (LangSmith's processor is
    added to it). Secrets come from the environment. Raises ``ValueError`` for an unknown level
    or a section that is not an object (10xGraph fell back to "standard" / failed later)."""
    if not isinstance(config, dict):
        raise ValueError(f"the observability config must be an object, got {type(config).__name__}")
    raw_level = config.get("level", "standard")
    try:
        level = ObservabilityLevel(raw_level)
    except ValueError:
        raise ValueError(f"observability.level must be one of {[lv.value for lv in ObservabilityLevel]}, "
                         f"got {raw_level!r}") from None
    logfire_cfg, langsmith_cfg = _section(config, "logfire"), _section(config, "langsmith")
    logfire_on, langsmith_on = bool(logfire_cfg.get("enabled", False)), bool(langsmith_cfg.get("enabled", False))
    if langsmith_on:
        processor = langsmith_processor(project=langsmith_cfg.get("project"),
                                        endpoint=langsmith_cfg.get("endpoint") or LANGSMITH_ENDPOINT)
    if logfire_on:
        setup_logfire(graph, service_name=logfire_cfg.get("service_name"),
                      send_to_logfire=bool(logfire_cfg.get("send_to_logfire", True)),
                      console=logfire_cfg.get("console"), level=level,
                      additional_span_processors=[processor] if langsmith_on else None)
    elif langsmith_on:
        tracer = install_provider(processor)
        if graph is not None:
            setup_tracing(graph, tracer=tracer, level=level)
