#!/usr/bin/env bash
# Interleaved A/B of two builds of the Rust core on the Postgres throughput scenario: the
# benchmark's child (bench/compare_child.py --scenario throughput, 3 rounds) at 16 and 64 threads,
# alternating the two `_core` shared objects in .venv-bench, PAIRS times. One line per child: the
# rounds' turns/s, CPU per turn (client / server) and the statement gate's counters. Not a
# benchmark of record (bench/run_compare.sh is); a way to see whether a change to the hot path
# moved throughput beyond the run-to-run noise, which on a 2-core machine is large.
#
#   bash bench/ab_throughput.sh OLD.so NEW.so [PAIRS]     # needs TENXGRAPH_TEST_PG_DSN
#
# Build a `.so` with `maturin build --release -i .venv-bench/bin/python` and take it out of the
# wheel (unzip). The build installed in .venv-bench is put back at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OLD="$1" NEW="$2" PAIRS="${3:-3}"
: "${TENXGRAPH_TEST_PG_DSN:?set TENXGRAPH_TEST_PG_DSN}"
PY="$ROOT/.venv-bench/bin/python"
SO="$(ls "$ROOT"/.venv-bench/lib/python3*/site-packages/tenxgraph/_core.*.so)"
SAVED="$(mktemp)"
cp "$SO" "$SAVED"
trap 'cp "$SAVED" "$SO"; rm -f "$SAVED"' EXIT
OUT="$(mktemp -d)"
for pair in $(seq 1 "$PAIRS"); do
  for which in old new; do
    if [ "$which" = old ]; then cp "$OLD" "$SO"; else cp "$NEW" "$SO"; fi
    for threads in 16 64; do
      "$PY" "$ROOT/bench/compare_child.py" --system tenx --backend postgres --scenario throughput \
        --threads "$threads" --dsn "$TENXGRAPH_TEST_PG_DSN" --out "$OUT/r.json" >/dev/null 2>&1
      "$PY" - "$OUT/r.json" "$pair" "$which" "$threads" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
gate = {k.rsplit(".", 1)[-1]: int(v) for k, v in r["runtime_counters"].items() if ".gate_" in k}
print(sys.argv[2], sys.argv[3], sys.argv[4], "threads: rounds", [round(x) for x in r["rounds_turns_per_s"]],
      "median", round(r["turns_per_s"]), "cpu ms/turn", round(r["cpu"]["client_ms"], 2), "/",
      round(r["cpu"].get("server_ms") or 0, 2), gate)
EOF
    done
  done
done
