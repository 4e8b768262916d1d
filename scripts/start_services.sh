# Sourced: starts the throwaway PostgreSQL and Redis of the test machinery (`python -m
# tenxgraph.testing serve`) with interpreter $1 (default: python), exports their
# TENXGRAPH_TEST_PG_DSN / TENXGRAPH_TEST_REDIS_URL, and stops them when the calling script exits.
start_test_services() {
  local py="${1:-python}"
  envfile="$(mktemp -u)"
  "$py" -m tenxgraph.testing serve "$envfile" >/dev/null &
  serve_pid=$!
  trap 'kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; rm -f "$envfile"' EXIT
  for _ in $(seq 1 600); do
    [ -s "$envfile" ] && break
    kill -0 "$serve_pid" 2>/dev/null || { echo "test services failed to start" >&2; exit 1; }
    sleep 0.2
  done
  [ -s "$envfile" ] || { echo "test services did not start in time" >&2; exit 1; }
  set -a; . "$envfile"; set +a
}
