#!/usr/bin/env bash
# The whole test suite: Rust engine/store tests and the pytest suite, against a throwaway
# PostgreSQL and Redis that this script starts (redis-server is apt-installed when missing).
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"
. "$ROOT/scripts/build_progress.sh"
build_extension
python -c "import tenxgraph._core"  # fail here, not later, if the build did not install

if [ -z "${TENXGRAPH_TEST_PG_DSN:-}" ] || [ -z "${TENXGRAPH_TEST_REDIS_URL:-}" ]; then
  echo "== start throwaway PostgreSQL and Redis =="
  . "$ROOT/scripts/start_services.sh"
  start_test_services python
fi

echo "== cargo fmt --check (rustfmt.toml) =="
# rustfmt's stable style does not change between releases of one edition, so a diff here is code
# that was not formatted, not a newer tool.
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --check >/dev/null || { echo "Rust sources are not formatted: run cargo fmt" >&2; exit 1; }
else
  echo "rustfmt is not installed (rustup component add rustfmt): format not checked"
fi
echo "== cargo test (engine and store, no Python; Postgres from TENXGRAPH_TEST_PG_DSN) =="
# A database is there now, so the PostgreSQL cases must run: without this a missing DSN would
# skip them and cargo would still say "passed".
TENXGRAPH_REQUIRE_PG=1 cargo test --tests --no-fail-fast -q 2>&1 | grep -v '^$' | tail -n 60
echo "== pytest =="
set +e
# Two workers (pytest-xdist): most tests wait on child processes and servers, so two share the
# 2-core CI machine well; TENXGRAPH_TEST_WORKERS=0 runs in this process (pdb, -x).
workers="${TENXGRAPH_TEST_WORKERS:-2}"
# --durations: the slowest tests in every log, so the CI run's time can be kept in check.
python -m pytest tests_py -q -p no:cacheprovider -n "$workers" --durations=25 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
