#!/usr/bin/env bash
# The release check: build the abi3 wheel (and the sdist), install the wheel into a clean
# virtualenv in a temp directory with no source tree around, and run from there the example
# (examples/support_agent.py, copied alone) and scripts/wheel_smoke.py. With --sdist, also
# `pip install` the sdist into a second clean virtualenv and run the smoke test there.
#
#   bash scripts/wheel_smoke.sh [--sdist] [--keep]
#
# Prints the wheel's size. CARGO_TARGET_DIR is honoured (a warm target dir saves minutes).
# TENXGRAPH_WHEEL_PROFILE=<cargo profile> (default release) builds the wheel and the sdist's wheel
# with that profile instead: CI uses dev, whose dependencies the test build already compiled.
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"   # cd to the repo, .venv with maturin
sdist=0
keep=0
for arg in "$@"; do
  case "$arg" in
    --sdist) sdist=1 ;;
    --keep) keep=1 ;;
    *) echo "usage: $0 [--sdist] [--keep]" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d "${TMPDIR:-/tmp}/tenxgraph-wheel.XXXXXX")"
if [ "$keep" -eq 0 ]; then
  trap 'rm -rf "$work"' EXIT
else
  echo "keeping $work"
fi
base_python="$(python -c 'import sys; print(sys._base_executable)')"
# One target dir for the wheel and the sdist build (pip builds an sdist in a temp copy, which
# would otherwise compile every dependency again).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
t0=$(date +%s)

profile="${TENXGRAPH_WHEEL_PROFILE:-release}"
# pip builds the sdist through maturin's PEP 517 backend, which reads its arguments here
# (`--profile release` is what `--release` sets).
export MATURIN_PEP517_ARGS="--profile $profile"
echo "== build the wheel (abi3, cargo profile $profile) and the sdist =="
maturin build --profile "$profile" --features abi3 -o "$work/dist" 2>&1 | grep -E '^(📦|⚠️|error|warning: unused)' || true
maturin sdist -o "$work/dist" 2>&1 | grep -E '^(📦|error)' || true
wheel="$(ls "$work"/dist/10xgraph-*-abi3-*.whl)"
sdist_file="$(ls "$work"/dist/10xgraph-*.tar.gz)"
t_build=$(date +%s)
python - "$wheel" <<'EOF'
import sys, zipfile
path = sys.argv[1]
z = zipfile.ZipFile(path)
installed = sum(i.file_size for i in z.infolist())
so = max((i for i in z.infolist() if i.filename.endswith(".so")), key=lambda i: i.file_size)
import os
print(f"wheel: {os.path.basename(path)}")
print(f"wheel size: {os.path.getsize(path) / 1e6:.1f} MB; installed: {installed / 1e6:.1f} MB "
      f"({so.filename}: {so.file_size / 1e6:.1f} MB)")
EOF

smoke() {  # $1: a virtualenv with 10xgraph installed; other args go to wheel_smoke.py
  local venv="$1" app="$1/app"
  shift
  mkdir -p "$app"
  cp examples/support_agent.py "$app/"
  cp scripts/wheel_smoke.py "$app/"
  # From the temp dir, without the repository; -I ignores PYTHONPATH and the script's directory.
  (cd "$app" && env -u PYTHONPATH SUPPORT_EFFECTS="$app/effects.jsonl" "$venv/bin/python" support_agent.py --db "$app/agent.db")
  (cd "$app" && env -u PYTHONPATH "$venv/bin/python" -I wheel_smoke.py "$@")
}

echo "== install the wheel into a clean virtualenv =="
"$base_python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
echo "== the example and the smoke test, from the installed wheel =="
smoke "$work/venv" --abi3
t_wheel=$(date +%s)

if [ "$sdist" -eq 1 ]; then
  echo "== pip install the sdist into a clean virtualenv (builds with the Rust toolchain) =="
  "$base_python" -m venv "$work/venv-sdist"
  "$work/venv-sdist/bin/python" -m pip install -q --disable-pip-version-check "$sdist_file"
  smoke "$work/venv-sdist"   # a build for this interpreter, not abi3
fi
t_end=$(date +%s)
echo "== wheel check passed: build $((t_build - t0))s, install + example + smoke $((t_wheel - t_build))s, total $((t_end - t0))s =="
