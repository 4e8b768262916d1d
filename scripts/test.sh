#!/usr/bin/env bash
# The whole test suite: Rust engine/store tests, then the extension and the pytest suite.
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"
echo "== cargo test (engine and store, no Python) =="
cargo test --tests --no-fail-fast -q 2>&1 | tail -n 40
echo "== build the extension =="
maturin develop -q
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
