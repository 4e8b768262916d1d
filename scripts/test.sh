#!/usr/bin/env bash
# The whole test suite: Rust engine/store tests and the pytest suite, against a throwaway
# PostgreSQL and Redis that this script starts (redis-server is apt-installed when missing).
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"
echo "== build the extension =="
maturin develop -q 2>&1 | grep -v '^Requirement already satisfied' || true
python -c "import tenxgraph._core"  # fail here, not later, if the build did not install

if [ -z "${TENXGRAPH_TEST_PG_DSN:-}" ] || [ -z "${TENXGRAPH_TEST_REDIS_URL:-}" ]; then
  echo "== start throwaway PostgreSQL and Redis =="
  envfile="$(mktemp -u)"
  python -m tenxgraph.testing serve "$envfile" &
  serve_pid=$!
  trap 'kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; rm -f "$envfile"' EXIT
  for _ in $(seq 1 600); do
    [ -s "$envfile" ] && break
    kill -0 "$serve_pid" 2>/dev/null || { echo "test services failed to start" >&2; exit 1; }
    sleep 0.2
  done
  [ -s "$envfile" ] || { echo "test services did not start in time" >&2; exit 1; }
  set -a; . "$envfile"; set +a
fi

echo "== cargo test (engine and store, no Python; Postgres from TENXGRAPH_TEST_PG_DSN) =="
cargo test --tests --no-fail-fast -q 2>&1 | grep -v '^$' | tail -n 40
echo "== pytest =="
set +e
python -m pytest tests_py -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
