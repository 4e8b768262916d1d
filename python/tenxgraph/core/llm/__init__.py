"""The model layer under ``Agent``: provider detection and clients, the OpenAI (chat and
Responses), Anthropic (Messages) and Google GenAI adapters,
retries and fallbacks, and the errors a model call ends in."""

from tenxgraph.core.llm.errors import ModelCallError, ModelConfigError, ProviderNotInstalledError
from tenxgraph.core.llm.providers import detect_provider, resolve_provider_and_model
from tenxgraph.core.llm.retry import RetryConfig

__all__ = [
    "ModelCallError",
    "ModelConfigError",
    "ProviderNotInstalledError",
    "RetryConfig",
    "detect_provider",
    "resolve_provider_and_model",
]
