"""The model layer under ``Agent``: provider detection and clients, the OpenAI (chat and
Responses), Anthropic (Messages) and Google GenAI adapters,
retries and fallbacks, and the errors a model call ends in."""

from tenxgraph.core.llm.caller import call_llm
from tenxgraph.core.llm.client_factory import create_llm_client
from tenxgraph.core.llm.errors import ModelCallError, ModelConfigError, ProviderNotInstalledError
from tenxgraph.core.llm.providers import (
    DEFAULT_LLM_TIMEOUT_SECONDS,
    detect_provider,
    get_default_llm_timeout,
    resolve_provider_and_model,
    set_default_llm_timeout,
)
from tenxgraph.core.llm.retry import RetryConfig

__all__ = [
    "DEFAULT_LLM_TIMEOUT_SECONDS",
    "ModelCallError",
    "ModelConfigError",
    "ProviderNotInstalledError",
    "RetryConfig",
    "call_llm",
    "create_llm_client",
    "detect_provider",
    "get_default_llm_timeout",
    "resolve_provider_and_model",
    "set_default_llm_timeout",
]
