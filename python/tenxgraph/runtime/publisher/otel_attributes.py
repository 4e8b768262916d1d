"""OpenTelemetry attribute names: 10xGraph 0.10's (GenAI semantic conventions, plus its
``tenxgraph.*`` span attributes), and tenxgraph's own additions at the end. The OTel, Langsmith and
Logfire publishers take every attribute name from here.

https://opentelemetry.io/docs/specs/semconv/gen-ai/
"""

from __future__ import annotations

GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_PROMPT = "gen_ai.prompt"
GEN_AI_COMPLETION = "gen_ai.completion"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
SESSION_ID = "session.id"
GRAPH_THREAD_ID = "tenxgraph.graph.thread_id"
GRAPH_RUN_ID = "tenxgraph.graph.run_id"
GRAPH_USER_ID = "tenxgraph.graph.user_id"
GRAPH_TOTAL_STEPS = "tenxgraph.graph.total_steps"
GRAPH_MODEL = "tenxgraph.graph.model"
NODE_NAME = "tenxgraph.node.name"
NODE_STEP = "tenxgraph.node.step"
TOOL_NAME = "tenxgraph.tool.name"
TOOL_TYPE = "tenxgraph.tool.type"
LIFECYCLE = "tenxgraph.lifecycle"

# 10xGraph's provider names -> the OTel ``gen_ai.system`` value.
PROVIDER_NAME_MAP: dict[str, str] = {
    "openai": "openai",
    "google": "google_generative_ai",
    "anthropic": "anthropic",
    "azure": "azure",
    "bedrock": "aws.bedrock",
    "cohere": "cohere",
    "mistral": "mistral_ai",
}

# tenxgraph's additions: what a replay skipped must be visible in a trace.
TOOL_CALL_ID = "tenxgraph.tool.call_id"
TOOL_FROM_LEDGER = "tenxgraph.tool.from_ledger"
TOOL_ARGUMENTS = "tenxgraph.tool.arguments"
TOOL_RESULT = "tenxgraph.tool.result"
GRAPH_INTERRUPTED = "tenxgraph.graph.interrupted"
