# Sourced after setup_env.sh: `build_extension` builds the Rust core into .venv (maturin develop)
# and, because a cold build is silent for many minutes, says what it does, how long it may take
# and, every 30 s, how far cargo got.

build_extension() {
  local log rc t0 compiled
  if [ -d "$ROOT/target/debug/build" ]; then
    echo "== build the Rust core into .venv (maturin develop): reuses target/, usually under a minute"
  else
    echo "== build the Rust core into .venv (maturin develop): first build, compiles ~300 crates;"
    echo "   5-10 min on an idle machine, up to ~25 min on a busy 2-core one. Progress every 30 s."
  fi
  log="$(mktemp)"
  t0=$SECONDS
  # cargo's own progress bar needs a terminal; its "Compiling" lines (on stderr) are counted instead.
  maturin develop >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
      compiled=$(grep -c 'Compiling ' "$log" || true)
      echo "   ... still building: $((SECONDS - t0)) s, $compiled crates compiled"
    fi
  done
  rc=0
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$log" >&2
    rm -f "$log"
    echo "the build failed (exit $rc); its output is above" >&2
    return "$rc"
  fi
  grep -v -e '^Requirement already satisfied' -e '^Ignoring ' -e '^Looking in links' -e '^ *Compiling ' -e '^ *Finished ' -e '^ *Building ' "$log" || true
  rm -f "$log"
  echo "   built in $((SECONDS - t0)) s"
}
