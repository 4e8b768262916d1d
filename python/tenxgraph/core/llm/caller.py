"""10xGraph's ``call_llm``: one single-turn model call outside any agent, through tenxgraph's
provider adapters (the same request and reply code the Agent uses)."""

from __future__ import annotations

import inspect
from typing import Any, Literal

from tenxgraph.core.llm.anthropic_messages import call_anthropic
from tenxgraph.core.llm.client_factory import create_llm_client
from tenxgraph.core.llm.errors import ModelConfigError
from tenxgraph.core.llm.google_genai import call_google
from tenxgraph.core.llm.openai_chat import call_chat
from tenxgraph.core.llm.openai_responses import call_responses
from tenxgraph.core.llm.providers import resolve_provider_and_model

__all__ = ["call_llm"]

def _accepts(func: Any, name: str) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


_JSON_INSTRUCTION = "\n\nRespond with valid JSON only, no prose and no code fences."


async def call_llm(model: str, prompt: str, *, system_prompt: str | None = None, max_tokens: int = 1024,
                   temperature: float = 0.3, json_mode: bool = False, use_vertex_ai: bool = False,
                   api_style: Literal["responses", "chat"] = "responses",
                   **llm_kwargs: Any) -> tuple[str, int, int, int]:
    """Send ``prompt`` (after ``system_prompt``) to ``model`` once and return
    ``(text, input_tokens, output_tokens, cache_read_tokens)``, the text stripped, counts 0 when the
    provider reports none. The provider comes from the model name (a ``provider/`` prefix is
    stripped); ``api_style`` picks OpenAI's Responses (default) or Chat Completions API; extra
    keyword arguments go to the request. Not retried here beyond the SDK's own retries; the
    provider's error is raised as is. An ``api_style`` other than the two is a
    ``ModelConfigError`` ``LLM_CONFIG_003``, before any request."""
    if api_style not in ("responses", "chat"):
        raise ModelConfigError(f"api_style must be 'responses' or 'chat', got {api_style!r}", "LLM_CONFIG_003",
                               {"option": "api_style"})
    provider, name = resolve_provider_and_model(model, use_vertex_ai=use_vertex_ai)
    client = create_llm_client(provider, use_vertex_ai=use_vertex_ai,
                               anthropic_backend=llm_kwargs.pop("anthropic_backend", None))
    system = system_prompt or ""
    if json_mode and provider in ("anthropic", "google"):
        # Neither adapter takes a bare JSON switch without a schema; an instruction steers both.
        system += _JSON_INSTRUCTION
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    options: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, **llm_kwargs}
    if provider == "anthropic":
        if not _accepts(client.messages.create, "temperature"):
            # Anthropic's SDK 2.x has no sampling parameters (current models refuse them), so the
            # default 0.3 cannot be sent; 10xGraph 0.10 sent it and failed with a TypeError.
            options.pop("temperature", None)
        reply = await call_anthropic(client, model=name, messages=messages, tools=None, stream=False,
                                     options=options, reasoning=None)
    elif provider == "google":
        reply = await call_google(client, model=name, messages=messages, tools=None, stream=False,
                                  options=options, reasoning=None)
    elif api_style == "chat":
        if json_mode:
            options["response_format"] = {"type": "json_object"}
        reply = await call_chat(client, model=name, messages=messages, tools=None, stream=False,
                                call_kwargs=options)
    else:
        options["max_output_tokens"] = options.pop("max_tokens")
        if json_mode:
            options["text"] = {"format": {"type": "json_object"}}
        reply = await call_responses(client, model=name, messages=messages, tools=None, stream=False,
                                     call_kwargs=options, reasoning=None)
    usage = reply.usages
    if usage is None:
        return reply.text().strip(), 0, 0, 0
    return reply.text().strip(), usage.prompt_tokens, usage.completion_tokens, usage.cache_read_input_tokens
