"""Which provider a model string names, and the SDK client for it.

``"provider/model"``: a known prefix (``openai``, ``gpt``, ``gemini``, ``google``, ``anthropic``,
``claude``) picks the provider and is stripped; an unknown prefix stays part of the name (e.g.
``"meta-llama/Llama-3-70b"`` on an OpenAI-compatible server). Without a prefix the name decides:
``gpt-``/``o1-``/``o3-``/``o4-`` OpenAI, ``gemini-``... Google, ``claude-`` Anthropic, anything
else OpenAI (10xGraph's rules).
"""

from __future__ import annotations

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
    "resolve_provider_and_model",
]

_PREFIXES = {"gemini": "google", "google": "google", "openai": "openai", "gpt": "openai",
             "anthropic": "anthropic", "claude": "anthropic"}
SUPPORTED_PROVIDERS = ("openai",)
# Client constructor options; never sent with a request.
CLIENT_KWARGS = frozenset({"organization", "project", "timeout", "max_retries", "default_headers",
                           "default_query", "http_client"})
DEFAULT_LLM_TIMEOUT_SECONDS = 600.0


def detect_provider(model: str, use_vertex_ai: bool = False) -> str:
    """The provider a model name belongs to, as 10xGraph decides it: a known ``provider/`` prefix,
    else ``claude-``/``anthropic.`` is anthropic, ``gemini-`` and the other Google families (or
    ``use_vertex_ai``) google, anything else openai."""
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
    """``(provider, model name without a known provider prefix)``. ``ModelConfigError``
    LLM_CONFIG_003 for an empty or non-string model."""
    if not isinstance(model, str) or not model.strip():
        raise ModelConfigError(f"model must be a non-empty string such as 'openai/gpt-4o-mini', got {model!r}",
                               "LLM_CONFIG_003")
    provider = detect_provider(model, use_vertex_ai)
    if "/" in model and model.split("/", 1)[0].lower() in _PREFIXES:
        model = model.split("/", 1)[1]
    return provider, model


def default_timeout() -> float:
    """10xGraph's default request timeout (600 s), or ``AGENTFLOW_LLM_TIMEOUT`` seconds."""
    raw = os.environ.get("AGENTFLOW_LLM_TIMEOUT", "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = 0.0
    return value if value > 0 else DEFAULT_LLM_TIMEOUT_SECONDS


def check_supported(provider: str, model: str) -> None:
    if provider not in SUPPORTED_PROVIDERS:
        raise ModelConfigError(
            f"model {model!r} needs the {provider!r} provider, which tenxgraph does not support yet "
            f"(supported: {', '.join(SUPPORTED_PROVIDERS)}); use an OpenAI or OpenAI-compatible model, "
            "e.g. 'openai/gpt-4o-mini' (with base_url= for other servers)",
            "LLM_CONFIG_002", {"provider": provider, "model": model},
        )


def create_client(provider: str, *, model: str, base_url: str | None, api_key: str | None,
                  options: dict[str, Any]) -> Any:
    """The async SDK client. A missing API key is refused here, before any request is sent."""
    check_supported(provider, model)
    try:
        from openai import AsyncOpenAI
    except ImportError as exc:
        raise ProviderNotInstalledError(
            "the OpenAI provider needs the openai SDK: pip install \"10xgraph[openai]\"", "LLM_CONFIG_004",
            {"provider": provider},
        ) from exc
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        raise ModelConfigError(
            f"no API key for model {model!r}: set OPENAI_API_KEY or pass api_key= to the agent "
            "(a local server without authentication still needs a placeholder key)",
            "LLM_CONFIG_001", {"provider": provider, "model": model},
        )
    kwargs = {k: v for k, v in options.items() if k in CLIENT_KWARGS}
    kwargs.setdefault("timeout", default_timeout())
    # retry_config is the retry policy; the SDK's own silent retries would multiply it.
    kwargs.setdefault("max_retries", 0)
    if base_url:
        kwargs["base_url"] = base_url
    return AsyncOpenAI(api_key=key, **kwargs)
