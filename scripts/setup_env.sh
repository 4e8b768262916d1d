# Sourced by the scripts below: a project virtualenv with the build and test tools, and the
# extension built into it. Safe to run again; each step is skipped when already done.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is required (install a Rust toolchain >= 1.94)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check \
  "maturin>=1.9.4,<2" "pydantic>=2,<3" "pytest>=8" "pytest-asyncio>=1.2,<2" "pytest-timeout" "pytest-xdist>=3.5" "mypy" \
  "prometheus_client>=0.17" "opentelemetry-api>=1.20" "opentelemetry-sdk>=1.20" "opentelemetry-exporter-otlp-proto-http>=1.20" "logfire>=3.0.0" "openai>=1.40" "anthropic>=1.0.0" "google-genai>=1.56.0" \
  "injectq>=0.4.0,<0.5" "redis>=4.2" "aio-pika>=9" \
  "fastmcp>=2.11.3,<5"
