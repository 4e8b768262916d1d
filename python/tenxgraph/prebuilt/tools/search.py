"""``google_web_search`` and ``vertex_ai_search``: search through Gemini's Google Search or
Vertex AI Search grounding. 10xGraph's names, signatures and tool schemas.

Both need a service (Google's API, with credentials, over the network) and the google-genai
SDK (``pip install "10xgraph[google-genai]"``). Without the SDK, or when the service cannot be
reached or refuses, the call returns a JSON ``{"error": ...}`` the model can read (naming the
extra when the SDK is missing); it never raises. Idempotent for the ledger (a read).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tenxgraph.utils.tool_decorator import tool

__all__ = ["google_web_search", "vertex_ai_search"]

DEFAULT_MODEL = "gemini-2.5-flash"
MAX_CHARS = 20_000


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for dump in ("model_dump", "to_json_dict"):
        if hasattr(value, dump):
            return _plain(getattr(value, dump)())
    return str(value)


def _payload(response: Any, max_chars: int) -> dict[str, Any]:
    text = getattr(response, "text", "") or ""
    candidates = getattr(response, "candidates", None) or []
    grounding = _plain(getattr(candidates[0], "grounding_metadata", None)) if candidates else None
    return {"content": text[:max_chars], "grounding_metadata": grounding, "truncated": len(text) > max_chars}


def _sdk(tool_name: str) -> tuple[Any, Any] | dict[str, str]:
    try:
        from google import genai
        from google.genai import types
    except ImportError:
        return {"error": f"google-genai is required for {tool_name}. Install with: pip install 10xgraph[google-genai]"}
    return genai, types


def _search(tool_name: str, query: str, model: str, max_chars: int, datastore: str | None) -> dict[str, Any]:
    sdk = _sdk(tool_name)
    if isinstance(sdk, dict):
        return sdk
    genai, types = sdk
    try:
        if datastore is None:
            client = genai.Client()
            grounding = types.Tool(google_search=types.GoogleSearch())
        else:
            client = genai.Client(http_options=types.HttpOptions(api_version="v1"))
            grounding = types.Tool(retrieval=types.Retrieval(
                vertex_ai_search=types.VertexAISearch(datastore=datastore)))
        response = client.models.generate_content(model=model, contents=query,
                                                  config=types.GenerateContentConfig(tools=[grounding]))
    except Exception as exc:  # noqa: BLE001 - no credentials, no network, a refusal: the model reads it
        return {"error": f"{tool_name} failed: {type(exc).__name__}: {exc}"}
    return _payload(response, max_chars)


@tool(
    name="google_web_search",
    description=("Search the public web with Gemini Google Search grounding and return the grounded "
                 "answer plus grounding metadata."),
    tags=["web", "search", "google"],
    capabilities=["network_access"],
)
async def google_web_search(query: str, model: str = DEFAULT_MODEL, max_chars: int = MAX_CHARS) -> str:
    """JSON ``{"content", "grounding_metadata", "truncated"}``; ``{"error": ...}`` for an empty
    query, a missing google-genai SDK (naming the extra) or a failed request."""
    if not query:
        return json.dumps({"error": "query is required"})
    limit = max(1, min(int(max_chars), MAX_CHARS))
    return json.dumps(await asyncio.to_thread(_search, "google_web_search", query, model, limit, None))


@tool(
    name="vertex_ai_search",
    description=("Search a configured Vertex AI Search datastore with Gemini grounding. "
                 "The datastore must be a full Vertex AI Search datastore resource path."),
    tags=["search", "google", "vertex_ai"],
    capabilities=["network_access"],
)
async def vertex_ai_search(query: str, datastore: str, model: str = DEFAULT_MODEL, max_chars: int = MAX_CHARS) -> str:
    """As :func:`google_web_search`, grounded on the Vertex AI Search ``datastore`` (a full
    resource path); ``{"error": "datastore is required"}`` without one."""
    if not query:
        return json.dumps({"error": "query is required"})
    if not datastore:
        return json.dumps({"error": "datastore is required"})
    limit = max(1, min(int(max_chars), MAX_CHARS))
    return json.dumps(await asyncio.to_thread(_search, "vertex_ai_search", query, model, limit, datastore))
