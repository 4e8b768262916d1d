"""Which provider a model string names, and the SDK client for it.

``"provider/model"``: a known prefix (``openai``, ``gpt``, ``gemini``, ``google``, ``anthropic``,
``claude``) picks the provider and is stripped; an unknown prefix stays part of the name (e.g.
``"meta-llama/Llama-3-70b"`` on an OpenAI-compatible server). Without a prefix the name decides:
``gpt-``/``o1-``/``o3-``/``o4-`` OpenAI, ``gemini-``... Google, ``claude-`` Anthropic, anything
else OpenAI (10xGraph's rules).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tenxgraph.core.llm.errors import ModelConfigError, ProviderNotInstalledError

__all__ = [
    "CLIENT_KWARGS",
    "DEFAULT_LLM_TIMEOUT_SECONDS",
    "SUPPORTED_PROVIDERS",
    "create_client",
    "default_timeout",
    "detect_provider",
    "get_default_llm_timeout",
    "resolve_provider_and_model",
    "set_default_llm_timeout",
]

_PREFIXES = {"gemini": "google", "google": "google", "openai": "openai", "gpt": "openai",
             "anthropic": "anthropic", "claude": "anthropic"}
SUPPORTED_PROVIDERS = ("openai", "anthropic", "google")
# Client constructor options; never sent with a request.
CLIENT_KWARGS = frozenset({"organization", "project", "timeout", "max_retries", "default_headers",
                           "default_query", "http_client"})
# Anthropic's constructor takes no organization/project, and takes an auth token.
_ANTHROPIC_CLIENT_KWARGS = frozenset({"timeout", "max_retries", "default_headers", "default_query", "http_client",
                                      "auth_token"})
DEFAULT_LLM_TIMEOUT_SECONDS = 600.0


def detect_provider(model: str, use_vertex_ai: bool = False) -> str:
    """The provider a model string names (``openai``, ``anthropic`` or ``google``), by 10xGraph's
    rules (see the module's docstring); ``use_vertex_ai`` makes a non-Claude model Google's."""
    if "/" in model:
        prefix, rest = model.split("/", 1)
        if prefix.lower() in _PREFIXES:
            return _PREFIXES[prefix.lower()]
        model = rest
    lower = model.lower()
    if lower.startswith(("claude-", "anthropic.")):
        return "anthropic"
    if use_vertex_ai or lower.startswith(("gemini-", "imagen-", "veo-", "chirp")):
        return "google"
    return "openai"


def resolve_provider_and_model(model: str, use_vertex_ai: bool = False) -> tuple[str, str]:
    """``(provider, model to send)``: a known prefix is stripped, an unknown one kept; an empty or
    non-string model is a ``ModelConfigError`` ``LLM_CONFIG_003``."""
    if not isinstance(model, str) or not model.strip():
        raise ModelConfigError(f"model must be a non-empty string such as 'openai/gpt-4o-mini', got {model!r}",
                               "LLM_CONFIG_003")
    provider = detect_provider(model, use_vertex_ai)
    if "/" in model and model.split("/", 1)[0].lower() in _PREFIXES:
        model = model.split("/", 1)[1]
    return provider, model


_timeout_override: dict[str, float | None] = {"value": None}
_log = logging.getLogger("tenxgraph.llm")


def _env_timeout() -> float | None:
    raw = os.environ.get("AGENTFLOW_LLM_TIMEOUT")
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        _log.warning("AGENTFLOW_LLM_TIMEOUT=%r is not a number of seconds; ignored", raw)
        return None
    if not value > 0 or value == float("inf"):
        _log.warning("AGENTFLOW_LLM_TIMEOUT=%r must be a positive number of seconds; ignored", raw)
        return None
    return value


def get_default_llm_timeout() -> float:
    """The request timeout (seconds) of every model client built without an explicit ``timeout``,
    10xGraph's resolution order: the :func:`set_default_llm_timeout` override, else
    ``$AGENTFLOW_LLM_TIMEOUT`` (ignored, with a warning, when not a positive number), else
    :data:`DEFAULT_LLM_TIMEOUT_SECONDS` (600). Read when a client is built, not at import."""
    override = _timeout_override["value"]
    if override is not None:
        return override
    env = _env_timeout()
    return env if env is not None else DEFAULT_LLM_TIMEOUT_SECONDS


def set_default_llm_timeout(seconds: float | None) -> None:
    """Override the default model request timeout process-wide; ``None`` removes the override.
    Anything but a positive finite number of seconds is a ``ModelConfigError`` ``LLM_CONFIG_003``
    (a ``ValueError``, as 10xGraph raises), and the previous setting stays."""
    if seconds is not None:
        numeric = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not numeric or not seconds > 0 or seconds == float("inf"):
            raise ModelConfigError(f"LLM timeout must be a positive number of seconds, got {seconds!r}",
                                   "LLM_CONFIG_003", {"option": "timeout"})
        seconds = float(seconds)
    _timeout_override["value"] = seconds


# The clients' one rule for their default timeout (kept under its older name too).
default_timeout = get_default_llm_timeout


def check_supported(provider: str, model: str) -> None:
    """Raises ``ModelConfigError`` ``LLM_CONFIG_002`` for a provider tenxgraph cannot call."""
    if provider not in SUPPORTED_PROVIDERS:
        raise ModelConfigError(
            f"model {model!r} needs the {provider!r} provider, which tenxgraph does not support yet "
            f"(supported: {', '.join(SUPPORTED_PROVIDERS)}); for other servers use an OpenAI-compatible "
            "model, e.g. 'openai/gpt-4o-mini' with base_url=",
            "LLM_CONFIG_002", {"provider": provider, "model": model},
        )


def create_client(provider: str, *, model: str, base_url: str | None, api_key: str | None,
                  options: dict[str, Any], use_vertex_ai: bool = False) -> Any:
    """The async SDK client. A missing API key is refused here, before any request is sent.

    Retries inside the SDKs are off: ``retry_config`` is the whole retry policy."""
    check_supported(provider, model)
    if provider == "anthropic":
        return _anthropic_client(model=model, base_url=base_url, api_key=api_key, options=options)
    if provider == "google":
        return _google_client(model=model, base_url=base_url, api_key=api_key, options=options,
                              use_vertex_ai=use_vertex_ai)
    return _openai_client(model=model, base_url=base_url, api_key=api_key, options=options)


def _missing_key(provider: str, model: str, where: str) -> ModelConfigError:
    return ModelConfigError(f"no API key for model {model!r}: {where}", "LLM_CONFIG_001",
                            {"provider": provider, "model": model})


def _openai_client(*, model: str, base_url: str | None, api_key: str | None, options: dict[str, Any]) -> Any:
    try:
        from openai import AsyncOpenAI
    except ImportError as exc:
        raise ProviderNotInstalledError(
            "the OpenAI provider needs the openai SDK: pip install \"10xgraph[openai]\"", "LLM_CONFIG_004",
            {"provider": "openai"},
        ) from exc
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        raise _missing_key("openai", model, "set OPENAI_API_KEY or pass api_key= to the agent "
                           "(a local server without authentication still needs a placeholder key)")
    kwargs = {k: v for k, v in options.items() if k in CLIENT_KWARGS}
    kwargs.setdefault("timeout", default_timeout())
    # retry_config is the retry policy; the SDK's own silent retries would multiply it.
    kwargs.setdefault("max_retries", 0)
    if base_url:
        kwargs["base_url"] = base_url
    return AsyncOpenAI(api_key=key, **kwargs)


def _anthropic_client(*, model: str, base_url: str | None, api_key: str | None, options: dict[str, Any]) -> Any:
    backend = options.get("anthropic_backend")
    if backend:
        raise ModelConfigError(
            f"anthropic_backend={backend!r} (Claude on Vertex AI or Bedrock) is not supported by tenxgraph yet; "
            "use the direct Anthropic API", "LLM_CONFIG_002", {"provider": "anthropic", "option": "anthropic_backend"})
    try:
        from anthropic import AsyncAnthropic
    except ImportError as exc:
        raise ProviderNotInstalledError(
            "the Anthropic provider needs the anthropic SDK: pip install \"10xgraph[anthropic]\"", "LLM_CONFIG_004",
            {"provider": "anthropic"},
        ) from exc
    key = api_key or os.environ.get("ANTHROPIC_API_KEY")
    token = options.get("auth_token") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
    if not key and not token:
        raise _missing_key("anthropic", model, "set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) or pass api_key= "
                           "to the agent")
    kwargs = {k: v for k, v in options.items() if k in _ANTHROPIC_CLIENT_KWARGS}
    kwargs.setdefault("timeout", default_timeout())
    kwargs.setdefault("max_retries", 0)
    if key:
        kwargs["api_key"] = key
    if base_url:
        kwargs["base_url"] = base_url  # else the SDK reads ANTHROPIC_BASE_URL
    return AsyncAnthropic(**kwargs)


def _google_client(*, model: str, base_url: str | None, api_key: str | None, options: dict[str, Any],
                   use_vertex_ai: bool) -> Any:
    if use_vertex_ai:
        raise ModelConfigError(
            "Gemini on Vertex AI (use_vertex_ai=True or GOOGLE_GENAI_USE_VERTEXAI=true) is not supported by "
            "tenxgraph yet; use the Gemini API with GEMINI_API_KEY", "LLM_CONFIG_002",
            {"provider": "google", "option": "use_vertex_ai"})
    try:
        from google import genai
        from google.genai import types
    except ImportError as exc:
        raise ProviderNotInstalledError(
            "the Google provider needs the google-genai SDK: pip install \"10xgraph[google-genai]\"",
            "LLM_CONFIG_004", {"provider": "google"},
        ) from exc
    key = api_key or os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY")
    if not key:
        raise _missing_key("google", model, "set GEMINI_API_KEY or GOOGLE_API_KEY, or pass api_key= to the agent")
    timeout = options.get("timeout")
    numeric = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    seconds = float(timeout) if numeric else default_timeout()
    # google-genai takes its timeout in milliseconds; its base URL is an HttpOptions field (else the
    # SDK reads GOOGLE_GEMINI_BASE_URL).
    http: dict[str, Any] = {"timeout": int(seconds * 1000)}
    if base_url:
        http["base_url"] = base_url
    # vertexai=False: else the SDK would read GOOGLE_GENAI_USE_VERTEXAI and switch backends.
    return genai.Client(vertexai=False, api_key=key, http_options=types.HttpOptions(**http))
