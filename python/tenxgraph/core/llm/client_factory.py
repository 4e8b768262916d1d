"""10xGraph's ``create_llm_client``: the provider's native async SDK client, built by tenxgraph's
provider layer (:mod:`tenxgraph.core.llm.providers`), with the default request timeout of
:func:`get_default_llm_timeout`.

Differences from 10xGraph 0.10, each a clear error instead of a client that fails later: a missing
API key is a ``ModelConfigError`` ``LLM_CONFIG_001`` here (10xGraph built the client with a
warning, and OpenAI's SDK then refused it); Gemini on Vertex AI and Claude on Vertex/Bedrock
(``anthropic_backend``) are ``LLM_CONFIG_002`` (not supported yet).
"""

from __future__ import annotations

from typing import Any

from tenxgraph.core.llm.providers import (
    DEFAULT_LLM_TIMEOUT_SECONDS,
    create_client,
    detect_provider,
    get_default_llm_timeout,
    resolve_provider_and_model,
    set_default_llm_timeout,
)

__all__ = [
    "DEFAULT_LLM_TIMEOUT_SECONDS",
    "create_llm_client",
    "detect_provider",
    "get_default_llm_timeout",
    "resolve_provider_and_model",
    "set_default_llm_timeout",
]

# The OpenAI and Anthropic SDKs' own default. A client the user asked for keeps the SDK's
# retries; only the Agent's clients turn them off (its retry_config is the policy there).
_SDK_DEFAULT_RETRIES = 2


def create_llm_client(provider: str, *, use_vertex_ai: bool = False, base_url: str | None = None,
                      api_key: str | None = None, anthropic_backend: str | None = None,
                      **extra_kwargs: Any) -> Any:
    """An async SDK client for ``provider`` (``"openai"``, ``"anthropic"`` or ``"google"``):
    ``AsyncOpenAI``, ``AsyncAnthropic`` or ``google.genai.Client``. ``api_key`` falls back to the
    provider's environment variable; constructor options in ``extra_kwargs`` (``timeout``,
    ``max_retries``, ``default_headers`` ...) are passed through. Raises ``ModelConfigError``
    (a ``ValueError``) for an unknown provider, a missing key or an unsupported backend, and
    ``ProviderNotInstalledError`` (an ``ImportError``) when the SDK is not installed."""
    options = dict(extra_kwargs)
    options.setdefault("max_retries", _SDK_DEFAULT_RETRIES)
    if anthropic_backend:
        options["anthropic_backend"] = anthropic_backend
    return create_client(provider, model=f"<{provider} client>", base_url=base_url, api_key=api_key,
                         options=options, use_vertex_ai=use_vertex_ai)
