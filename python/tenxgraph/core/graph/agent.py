"""Agent: the graph node that calls a model (10xGraph's constructor and behaviour).

An Agent is a node like any other: the Rust loop commits its step, bounds it by ``node_timeout``,
cancels it on ``stop()`` and replays it after a crash (a replayed model turn asks the model
again; the tool calls it made before the crash were committed with it, and the ToolNode answers
those from the ledger). What a turn does:

1. the prompt: ``system_prompt`` (``{field}`` filled from the state), the thread's messages
   (trimmed by the graph's context manager when ``trim_context``), then ``extra_messages``;
2. the tools of its ToolNode (an instance, or the name of a ToolNode node of the graph), filtered
   by ``tools_tags``;
3. the request, with retries and fallbacks per ``retry_config`` / ``fallback_models``;
4. the reply as an assistant ``Message``: ``tools_calls`` for the ToolNode, ``usages`` for the
   token counts, ``parsed_content`` for ``output_schema``. Streamed runs (``astream``) show the
   model's text deltas as they come; the final message waits for its step to commit.
"""

from __future__ import annotations

import asyncio
import os
import contextlib
from typing import Any

from tenxgraph import _node_context
from tenxgraph.core.graph.base_agent import BaseAgent
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.llm import anthropic_messages, google_genai, openai_chat, openai_responses
from tenxgraph.core.llm.errors import ModelCallError, ModelConfigError, UnreadableReplyError
from tenxgraph.core.llm.unreadable import as_unreadable
from tenxgraph.core.llm.messages import to_provider_messages
from tenxgraph.core.llm.providers import CLIENT_KWARGS, check_supported, create_client, resolve_provider_and_model
from tenxgraph.core.llm.retry import (
    DEFAULT_RETRY_CONFIG,
    CircuitBreaker,
    RetryConfig,
    backoff_delay,
    describe,
    is_retryable,
    status_code,
)
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message, generate_id
from tenxgraph.logs import run_logger

__all__ = ["REASONING_DEFAULT", "Agent", "RetryConfig"]

_log = run_logger("tenxgraph.agent")

REASONING_DEFAULT: Any = object()
_OUTPUT_TYPES = ("text", "image", "video", "audio", "json")
_SUPPORTED_OUTPUT_TYPES = ("text", "json")
# Request options, never constructor ones.
_NOT_SENT = CLIENT_KWARGS | {"api_key", "base_url"}


def _not_yet(option: str, what: str) -> ModelConfigError:
    return ModelConfigError(f"Agent({option}=...): {what} is not supported by tenxgraph yet", "LLM_CONFIG_003",
                            {"option": option})


class Agent(BaseAgent):
    """A model call as a graph node.

    ``model``: ``"provider/model"`` or a bare name (the provider is detected as 10xGraph does;
    ``provider=`` overrides). ``base_url=`` / ``api_key=`` / ``timeout=`` / ``organization=``
    configure the client (else the SDK's env vars: ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``,
    ``ANTHROPIC_API_KEY`` / ``ANTHROPIC_BASE_URL``, ``GEMINI_API_KEY`` or ``GOOGLE_API_KEY`` /
    ``GOOGLE_GEMINI_BASE_URL``);
    other keyword arguments (``temperature``, ``max_tokens``, ...) go with every request.
    ``client=``: a ready SDK client to use as is.
    """

    def __init__(  # noqa: PLR0913 - 10xGraph's signature
        self,
        model: str,
        output_type: str = "text",
        system_prompt: list[dict[str, Any]] | None = None,
        tool_node: str | ToolNode | None = None,
        extra_messages: list[Message] | None = None,
        trim_context: bool = False,
        tools_tags: set[str] | None = None,
        reasoning_config: dict[str, Any] | bool | None = REASONING_DEFAULT,
        skills: Any = None,
        memory: Any = None,
        retry_config: RetryConfig | bool | None = True,
        fallback_models: list[str | tuple[str, str]] | None = None,
        multimodal_config: Any = None,
        output_schema: Any | None = None,
        **kwargs: Any,
    ) -> None:
        base_url: str | None = kwargs.pop("base_url", None)
        provider: str | None = kwargs.pop("provider", None)
        api_style: str = kwargs.pop("api_style", "chat")
        client: Any = kwargs.pop("client", None)
        self.use_vertex_ai = bool(kwargs.pop("use_vertex_ai", os.getenv("GOOGLE_GENAI_USE_VERTEXAI", "false").lower() == "true"))
        super().__init__(model=model, system_prompt=system_prompt or [], tool_node=tool_node, base_url=base_url, **kwargs)
        _check_prompts(system_prompt, extra_messages)
        for option, value, what in (("skills", skills, "skills"), ("memory", memory, "agent memory"),
                                    ("multimodal_config", multimodal_config, "multimodal input")):
            if value is not None:
                raise _not_yet(option, what)
        if not isinstance(output_type, str) or output_type.lower() not in _OUTPUT_TYPES:
            raise ModelConfigError(f"Invalid output_type {output_type!r}. Supported types: {list(_OUTPUT_TYPES)}",
                                   "LLM_CONFIG_003", {"option": "output_type"})
        self.output_type = output_type.lower()
        if self.output_type not in _SUPPORTED_OUTPUT_TYPES:
            raise _not_yet("output_type", f"{self.output_type} generation")
        if api_style not in ("chat", "responses"):
            raise ModelConfigError(f"Invalid api_style '{api_style}'. Supported: 'chat', 'responses'",
                                   "LLM_CONFIG_003", {"option": "api_style"})
        self.api_style = api_style
        self.output_schema = output_schema
        self.base_url = base_url
        if provider is not None:
            self.provider = provider.lower()
        else:
            self.provider, self.model = resolve_provider_and_model(model, self.use_vertex_ai)
        check_supported(self.provider, model)
        # Made now so that a missing key or SDK is reported here, before any request.
        self._own_client = client is None
        self.client = client if client is not None else self._new_client()
        # loop -> (client, the async generator that closes it when the loop shuts down)
        self._loop_clients: dict[tuple[asyncio.AbstractEventLoop, str], tuple[Any, Any]] = {}
        self._constructed_client_taken = False
        if tool_node is not None and not isinstance(tool_node, (str, ToolNode)):
            raise ModelConfigError(f"tool_node must be a ToolNode or the name of one, got {type(tool_node).__name__}",
                                   "LLM_CONFIG_003", {"option": "tool_node"})
        self.extra_messages = extra_messages
        self.trim_context = trim_context
        self.tools_tags = tools_tags
        self.tool_node_name: str | None = tool_node if isinstance(tool_node, str) else None
        self._tool_node: ToolNode | None = tool_node if isinstance(tool_node, ToolNode) else None
        if reasoning_config is REASONING_DEFAULT or reasoning_config is True:
            reasoning_config = {"effort": "medium"}
        self.reasoning_config: dict[str, Any] | None = reasoning_config or None  # type: ignore[assignment]
        if retry_config is True:
            self.retry_config: RetryConfig | None = DEFAULT_RETRY_CONFIG
        elif isinstance(retry_config, RetryConfig):
            self.retry_config = retry_config
        elif retry_config in (False, None):
            self.retry_config = None
        else:
            raise ModelConfigError(f"retry_config must be True, False, None or a RetryConfig, got {retry_config!r}",
                                   "LLM_CONFIG_003", {"option": "retry_config"})
        self.fallback_models: list[tuple[str, str | None]] = [self._fallback(e) for e in fallback_models or []]
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}
        _log.info("Agent initialized: model=%s, provider=%s, has_tools=%s", self.model, self.provider,
                  tool_node is not None)

    def _fallback(self, entry: Any) -> tuple[str, str | None]:
        if isinstance(entry, str):
            provider, name = resolve_provider_and_model(entry, self.use_vertex_ai)
            # A bare name inherits the agent's provider, as in 10xGraph.
            resolved = (name, provider) if "/" in entry and name != entry else (entry, None)
        elif isinstance(entry, (tuple, list)) and len(entry) == 2 and all(isinstance(x, str) for x in entry):
            resolved = (entry[0], entry[1].lower())
        else:
            raise ModelConfigError(f"fallback_models entries are 'model' or ('model', 'provider'), got {entry!r}",
                                   "LLM_CONFIG_003", {"option": "fallback_models"})
        check_supported(resolved[1] or self.provider, resolved[0])
        if resolved[1] not in (None, self.provider):
            # Another provider's SDK and key are checked now, before any request, like the agent's
            # own; the client itself is made per event loop when the fallback is first needed.
            self._new_client(resolved[1], resolved[0])
        return resolved

    # -- tools ---------------------------------------------------------------------------------

    def get_tool_node(self) -> ToolNode | None:
        """The ``ToolNode`` given as ``tool_node=``, else None (also when it was given by name: that
        one is looked up in the running graph at each turn, not kept here)."""
        return self._tool_node

    def _resolve_tool_node(self) -> ToolNode | None:
        if self._tool_node is not None or self.tool_node_name is None:
            return self._tool_node
        ctx = _node_context.current()
        node = ctx.graph._nodes.get(self.tool_node_name) if ctx is not None else None
        if node is None:
            raise ModelConfigError(
                f"ToolNode named '{self.tool_node_name}' was not found in the compiled graph. "
                "Register the named ToolNode in the graph before executing the Agent.",
                "LLM_CONFIG_003", {"option": "tool_node", "tool_node": self.tool_node_name})
        if not isinstance(node.func, ToolNode):
            raise ModelConfigError(f"Graph node '{self.tool_node_name}' is not a ToolNode.", "LLM_CONFIG_003",
                                   {"option": "tool_node", "tool_node": self.tool_node_name})
        # Not cached: the same Agent may sit in several graphs.
        return node.func

    # -- one turn ------------------------------------------------------------------------------

    async def _prompt_state(self, state: AgentState) -> AgentState:
        """The state the prompt is built from. Trimming works on a copy: the model sees fewer
        messages, the thread keeps its history."""
        if not self.trim_context:
            return state
        ctx = _node_context.current()
        manager = getattr(getattr(ctx.graph, "_builder", None), "context_manager", None) if ctx else None
        if manager is None:
            _log.warning("trim_context is enabled but the graph has no context manager")
            return state
        view = state.model_copy()
        view.context = list(state.context)
        return await manager.atrim_context(view)

    def _request_kwargs(self, style: str = "chat") -> dict[str, Any]:
        kwargs = {k: v for k, v in self.llm_kwargs.items() if k not in _NOT_SENT}
        if style == "responses":
            return kwargs  # the reasoning config goes as ``reasoning``
        if self.reasoning_config and self.reasoning_config.get("effort"):
            kwargs.setdefault("reasoning_effort", self.reasoning_config["effort"])
        if self.base_url and self.reasoning_config:
            kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "reasoning": self.reasoning_config}
        return kwargs

    async def execute(self, state: AgentState, config: dict[str, Any]) -> Message:
        view = await self._prompt_state(state)
        messages = to_provider_messages(list(self.system_prompt), view, self.extra_messages or [])
        tool_node = self._resolve_tool_node()
        tools = await tool_node.all_tools(tags=self.tools_tags, config=config) if tool_node is not None else []
        ctx = _node_context.current()
        on_delta = ctx.emit_delta if ctx is not None and config.get("is_stream") else None
        reply = await self._call_llm_with_retry(messages, tools or None, stream=on_delta is not None,
                                                on_delta=on_delta)
        # The reply's id is the provider's completion id. A server that repeats ids (some
        # OpenAI-compatible ones do) would make this turn look like an earlier message: dropped as
        # a duplicate, and its tool calls keyed like the earlier ones in the ledger.
        if any(m.message_id == reply.message_id for m in state.context):
            _log.warning("the provider reused completion id %s; the message gets a fresh id", reply.message_id)
            reply.message_id = generate_id(None)
        return reply

    async def _call_llm(self, messages: list[dict[str, Any]], tools: list | None = None, stream: bool = False,
                        **kwargs: Any) -> Message:
        return await self._request(self.model, await self._client_for(self.provider), messages, tools, stream,
                                   kwargs.pop("on_delta", None))

    async def _request(self, model: str, client: Any, messages: list[dict[str, Any]], tools: list | None,
                       stream: bool, on_delta: Any, provider: str | None = None) -> Message:
        provider = provider or self.provider
        if provider == "anthropic":
            return await anthropic_messages.call_anthropic(
                client, model=model, messages=messages, tools=tools, stream=stream, options=self.llm_kwargs,
                reasoning=self.reasoning_config, output_schema=self.output_schema, on_delta=on_delta)
        if provider == "google":
            return await google_genai.call_google(
                client, model=model, messages=messages, tools=tools, stream=stream,
                options={k: v for k, v in self.llm_kwargs.items() if k not in _NOT_SENT},
                reasoning=self.reasoning_config, output_schema=self.output_schema, on_delta=on_delta)
        # Structured output goes through chat completions' parse on either API style (10xGraph's rule).
        if self.api_style == "responses" and self.output_schema is None:
            try:
                return await openai_responses.call_responses(
                    client, model=model, messages=messages, tools=tools, stream=stream,
                    call_kwargs=self._request_kwargs("responses"), reasoning=self.reasoning_config,
                    on_delta=on_delta)
            except Exception as exc:
                # An OpenAI-compatible server without the Responses API: 10xGraph then uses chat
                # completions. Only "no such endpoint" counts here; other errors are retried as usual.
                if not (self.base_url and status_code(exc) in (404, 405, 501)):
                    raise
                _log.warning("the Responses API is not served at %s (%s); using chat completions", self.base_url,
                             exc)
        return await openai_chat.call_chat(client, model=model, messages=messages, tools=tools, stream=stream,
                                           call_kwargs=self._request_kwargs(), output_schema=self.output_schema,
                                           on_delta=on_delta)

    async def count_tokens(self, messages: list[dict[str, Any]], tools: list | None = None, **kwargs: Any) -> int:
        """The input tokens of a request, counted by the provider's own endpoint (Anthropic's
        ``messages.count_tokens``, Google's ``count_tokens``, as 10xGraph does); OpenAI has none:
        ``NotImplementedError``."""
        if self.provider in ("anthropic", "google"):
            client = await self._client_for(self.provider)
            if self.provider == "anthropic":
                request = anthropic_messages.build_request(
                    model=self.model, messages=messages, tools=tools, stream=False,
                    options={**self.llm_kwargs, **kwargs}, reasoning=self.reasoning_config, output_schema=None)
                for key in ("max_tokens", "stream", "output_config", "temperature", "top_p", "top_k"):
                    request.pop(key, None)  # generation options; count_tokens refuses them
                return getattr(await client.messages.count_tokens(**request), "input_tokens", 0) or 0
            contents, _ = google_genai.build_request(messages=messages, tools=None, options={}, reasoning=None,
                                                     output_schema=None)
            return getattr(await client.aio.models.count_tokens(model=self.model, contents=contents),
                           "total_tokens", 0) or 0
        raise NotImplementedError(
            f"Provider '{self.provider}' has no server-side token counting endpoint, so an exact count is not "
            "available. Read usage from the response after the call instead (Message.usages), or count "
            "client-side with the tokenizer matching your model.")

    def _new_client(self, provider: str | None = None, model: str | None = None) -> Any:
        provider = provider or self.provider
        # A fallback on another provider gets that provider's SDK defaults (its env vars), not
        # the agent's base URL and key, which belong to the agent's own provider.
        own = provider == self.provider
        return create_client(provider, model=model or self.model, base_url=self.base_url if own else None,
                             api_key=self.llm_kwargs.get("api_key") if own else None, options=self.llm_kwargs,
                             use_vertex_ai=self.use_vertex_ai)

    async def _client_for(self, provider: str) -> Any:
        """The agent's client on the running event loop. An SDK client's connections belong to
        the loop that opened them, and sync ``invoke`` runs each call on a loop of its own
        (``asyncio.run``): a client made by the agent gets one instance per loop, closed when
        that loop shuts down. A fallback on another provider gets a client of that provider."""
        check_supported(provider, self.model)
        if not self._own_client and provider == self.provider:
            return self.client
        loop = asyncio.get_running_loop()
        key = (loop, provider)
        entry = self._loop_clients.get(key)
        if entry is not None:
            return entry[0]
        for old in [k for k in self._loop_clients if k[0].is_closed()]:
            del self._loop_clients[old]  # a loop that closed without shutting its generators down
        if provider != self.provider:
            client = self._new_client(provider)
        else:
            # The first loop takes the client made by the constructor; later ones get their own.
            client = self._new_client() if self._constructed_client_taken else self.client
            self._constructed_client_taken = True
        closer = _close_at_loop_shutdown(client)
        await closer.__anext__()  # now known to the loop: asyncio.run closes it before closing the loop
        self._loop_clients[key] = (client, closer)
        return client

    def _breaker(self, provider: str, model: str) -> CircuitBreaker | None:
        cfg = self.retry_config
        if cfg is None or not cfg.circuit_breaker_enabled:
            return None
        return self._breakers.setdefault((provider, model), CircuitBreaker(cfg.circuit_breaker_threshold,
                                                                           cfg.circuit_breaker_reset_timeout))

    async def _call_llm_with_retry(self, messages: list[dict[str, Any]], tools: list | None = None,
                                   stream: bool = False, on_delta: Any = None) -> Message:
        """The model, then each fallback, each retried on transient errors; then ModelCallError."""
        cfg = self.retry_config
        retries = cfg.max_retries if cfg is not None else 0
        targets = [(self.model, self.provider), *((m, p or self.provider) for m, p in self.fallback_models)]
        attempts: list[dict[str, Any]] = []
        last: BaseException | None = None
        skipped = 0
        for index, (model, provider) in enumerate(targets):
            breaker = self._breaker(provider, model)
            if breaker is not None and not breaker.allow():
                _log.warning("circuit open for %s; skipped (retry in %.1fs)", model, breaker.retry_after())
                skipped += 1
                continue
            if index:
                _log.info("switching to fallback model %s", model)
            client = await self._client_for(provider)
            for retry in range(retries + 1):
                try:
                    reply = await self._request(model, client, messages, tools, stream, on_delta, provider)
                except Exception as raw:  # noqa: BLE001 - classified below; cancellation passes through
                    exc = as_unreadable(raw)
                    last = exc
                    attempts.append({"model": model, **describe(exc)})
                    if cfg is None or not is_retryable(exc, cfg):
                        _log.warning("non-retryable error from %s: %s", model, exc)
                        break
                    if retry < retries:
                        delay = backoff_delay(exc, cfg, retry)
                        _log.warning("retryable error from %s (attempt %d/%d): %s; retrying in %.1fs", model,
                                     retry + 1, retries + 1, exc, delay)
                        await asyncio.sleep(delay)
                    continue
                if breaker is not None:
                    breaker.success()
                if index or retry:
                    _log.info("model call succeeded on %s (attempt %d, model index %d)", model, retry + 1, index)
                return reply
            if breaker is not None:
                breaker.failure()
        raise self._final_error(last, attempts, skipped)

    def _final_error(self, last: BaseException | None, attempts: list[dict[str, Any]], skipped: int) -> BaseException:
        context = {"provider": self.provider, "model": self.model, "attempts": attempts,
                   "status_code": status_code(last) if last is not None else None}
        if last is None:
            return ModelCallError(f"every model of this agent is behind an open circuit breaker ({skipped} skipped)",
                                  "LLM_PROVIDER_004", context)
        if not _is_provider_error(last):
            return last  # a bug or a bad option of ours or the caller's: the original error
        name = type(last).__name__.lower()
        code = ("LLM_PROVIDER_005" if isinstance(last, UnreadableReplyError)
                else "LLM_PROVIDER_002" if "timeout" in name or isinstance(last, TimeoutError)
                else "LLM_PROVIDER_003" if context["status_code"] is None else "LLM_PROVIDER_001")
        err = ModelCallError(f"model call failed after {len(attempts)} request(s) to "
                             f"{', '.join(dict.fromkeys(a['model'] for a in attempts))}: {last}", code, context)
        err.__cause__ = last
        return err


async def _close_at_loop_shutdown(client: Any) -> Any:
    try:
        yield
    finally:
        # Without this a finished loop leaves the client's keep-alive sockets open (unclosed
        # transports) and the client itself referenced for ever.
        with contextlib.suppress(Exception):
            aio = getattr(client, "aio", None)  # google-genai: the async side closes on its own
            await (aio.aclose() if aio is not None else client.close())


def _check_prompts(system_prompt: Any, extra_messages: Any) -> None:
    if system_prompt is not None and not (
        isinstance(system_prompt, list)
        and all(isinstance(p, dict) and isinstance(p.get("role"), str) and "content" in p for p in system_prompt)
    ):
        raise ModelConfigError(
            "system_prompt must be a list of message dicts such as [{'role': 'system', 'content': '...'}], "
            f"got {type(system_prompt).__name__}", "LLM_CONFIG_003", {"option": "system_prompt"})
    if extra_messages is not None and not (
        isinstance(extra_messages, list) and all(isinstance(m, Message) for m in extra_messages)
    ):
        raise ModelConfigError("extra_messages must be a list of Message", "LLM_CONFIG_003",
                               {"option": "extra_messages"})


def _provider_error_types() -> tuple[type[BaseException], ...]:
    """The errors an installed SDK raises for a failed request (google-genai lets its HTTP
    library's transport errors through, so those count too)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (("openai", ("APIError",)), ("anthropic", ("APIError",)),
                          ("google.genai.errors", ("APIError",)), ("httpx", ("TransportError",)),
                          ("httpx2", ("TransportError",))):
        try:
            mod = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        found += [getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type)]
    return tuple(found)


def _is_provider_error(exc: BaseException) -> bool:
    return isinstance(exc, _provider_error_types())
