"""The errors a model call can end in. Each carries an ``error_code`` (see docs/error-codes.md).

Raised inside an ``Agent`` node, they reach the caller of ``invoke``/``ainvoke`` as the
``__cause__`` of the run's ``NodeError`` (``NODE_001``), like any error a node raises.
"""

from __future__ import annotations

from typing import Any

from tenxgraph.core.exceptions import GraphError

__all__ = ["ModelCallError", "ModelConfigError", "ProviderNotInstalledError", "UnreadableReplyError"]


class _ModelError(GraphError):
    default_code = "LLM_000"

    def __init__(self, message: str, error_code: str | None = None, context: dict[str, Any] | None = None) -> None:
        # GraphError's own default code would win over the class's.
        super().__init__(message, error_code or self.default_code, context)


class ModelConfigError(_ModelError, ValueError):
    """The agent cannot call its model as configured, found before any request is sent:
    ``LLM_CONFIG_001`` no API key, ``LLM_CONFIG_002`` a provider tenxgraph does not support yet,
    ``LLM_CONFIG_003`` an invalid option (``api_style``, ``output_type``, ``output_schema``).
    A ``ValueError`` too, which is what 10xGraph raises for the invalid options."""

    default_code = "LLM_CONFIG_000"


class ProviderNotInstalledError(ModelConfigError, ImportError):
    """The provider's SDK is not installed (``LLM_CONFIG_004``); the message names the extra."""

    default_code = "LLM_CONFIG_004"


class ModelCallError(_ModelError):
    """Every attempt failed: the model and each fallback, after the retries ``retry_config``
    allows (``LLM_PROVIDER_001``: the provider answered with an error, e.g. HTTP 429 or 500;
    ``LLM_PROVIDER_002``: no answer in time; ``LLM_PROVIDER_003``: it could not be reached).
    ``context`` holds ``provider``, ``model``, ``status_code`` and ``attempts`` (one entry per
    request sent: model and error); the last SDK exception is the ``__cause__``."""

    default_code = "LLM_PROVIDER_000"


class UnreadableReplyError(ConnectionError):
    """The provider's endpoint answered with something that is not a reply of its API (not
    JSON of that shape, a stream without a single completion event: a proxy's page, a wrong base
    URL). Retried like a dropped connection under ``retry_config``; when every attempt ends so,
    the node fails with ``ModelCallError`` ``LLM_PROVIDER_005`` (never an empty answer stored as
    the model's turn)."""
