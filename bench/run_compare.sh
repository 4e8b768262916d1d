#!/usr/bin/env bash
# tenxgraph next to LangGraph 1.2 (InMemorySaver, AsyncPostgresSaver), the runtime it replaces
# (10xGraph 0.10.0: InMemoryCheckpointer, PgCheckpointer with Redis, in a Python 3.12 venv built by
# scripts/oracle_venv.py; where no Python 3.12 exists the column says why) and a plain-client floor
# making the contract's 4 durable commits per turn, in one run, from one command:
#
#   bash bench/run_compare.sh            # the full benchmark (release wheel): bench/results/compare.{json,md}
#   bash bench/run_compare.sh --smoke    # K=2, 2 and 4 threads, 1 repeat: checks that it works (CI)
#
# Creates .venv-bench (LangGraph 1.2, langgraph-checkpoint-postgres, psycopg, psycopg-pool and, in
# the full run, the tenxgraph release wheel built here with `maturin build --release`), starts a
# throwaway PostgreSQL with the test machinery (`python -m tenxgraph.testing serve`, unless
# TENXGRAPH_TEST_PG_DSN points at a server), runs bench/compare.py, and stops the server.
# --smoke uses the development build in .venv (what scripts/test.sh installed; built with
# `maturin develop` if missing) instead of building a release wheel.
# --no-build (full run) keeps the tenxgraph already installed in .venv-bench.
# Other arguments go to bench/compare.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

smoke=0
build=1
args=()
for a in "$@"; do
  case "$a" in
    --smoke) smoke=1; args+=("$a") ;;
    --no-build) build=0 ;;
    *) args+=("$a") ;;
  esac
done

started=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - started ))s)"; }

step "bench virtualenv .venv-bench"
if [ ! -x .venv-bench/bin/python ]; then
  python3 -m venv .venv-bench
fi
BENCH_PY="$ROOT/.venv-bench/bin/python"
"$BENCH_PY" -m pip install -q --disable-pip-version-check \
  "langgraph>=1.2,<1.3" "langgraph-checkpoint-postgres>=3,<4" "psycopg[binary]>=3.2,<4" "psycopg-pool>=3.2,<4"

if [ "$smoke" = 1 ]; then
  TENX_PY="$ROOT/.venv/bin/python"
  if ! { [ -x "$TENX_PY" ] && "$TENX_PY" -c "import tenxgraph._core" 2>/dev/null; }; then
    step "development build into .venv (maturin develop)"
    ( . scripts/setup_env.sh && maturin develop -q )
  fi
else
  TENX_PY="$BENCH_PY"
  if [ "$build" = 1 ]; then
    step "release wheel (maturin build --release)"
    "$BENCH_PY" -m pip install -q --disable-pip-version-check "maturin>=1.9.4,<2"
    wheels="$ROOT/dist/bench"
    rm -rf "$wheels"
    "$ROOT/.venv-bench/bin/maturin" build --release -i "$BENCH_PY" -o "$wheels" 2>&1 | grep -vE '^\s*(Compiling|Downloaded|Downloading)' || true
    whl=$(ls "$wheels"/10xgraph-*.whl 2>/dev/null | head -n 1)
    [ -n "$whl" ] || { echo "maturin build did not produce a wheel" >&2; exit 1; }
    "$BENCH_PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$whl"
    "$BENCH_PY" -m pip install -q --disable-pip-version-check "pydantic>=2,<3"
  fi
fi
"$TENX_PY" -c "import tenxgraph._core" || { echo "tenxgraph is not installed for $TENX_PY" >&2; exit 1; }

if [ -z "${TENXGRAPH_TEST_PG_DSN:-}" ]; then
  step "throwaway PostgreSQL (python -m tenxgraph.testing serve)"
  . "$ROOT/scripts/start_services.sh"
  start_test_services "$TENX_PY"
fi

step "10xGraph 0.10.0 venv (scripts/oracle_venv.py; needs Python 3.12+)"
xgraph=()
if XGRAPH_PY=$(python3 scripts/oracle_venv.py 2>/tmp/oracle-venv.$$); then
  xgraph=(--xgraph-python "$XGRAPH_PY")
else
  xgraph=(--xgraph-missing "$(tr '\n' ' ' </tmp/oracle-venv.$$)")
  echo "10xGraph column not run: $(cat /tmp/oracle-venv.$$)" >&2
fi
rm -f /tmp/oracle-venv.$$

step "benchmark"
BENCH_COMMAND="bash bench/run_compare.sh $*" "$TENX_PY" bench/compare.py --tenx-python "$TENX_PY" --langgraph-python "$BENCH_PY" \
  ${xgraph[@]+"${xgraph[@]}"} ${args[@]+"${args[@]}"}
step "done"
