#!/usr/bin/env bash
# The main job: build the extension and run the example support agent on the embedded SQLite
# default. No API key: the model is scripted. Extra arguments go to the example.
set -euo pipefail
started=$SECONDS
echo "== set up .venv (Python build and test tools; quick when already there)"
. "$(dirname "$0")/setup_env.sh"
. "$ROOT/scripts/build_progress.sh"
build_extension
echo "== run examples/support_agent.py (a child process is killed with SIGKILL mid-run, then resumed)"
python examples/support_agent.py "$@"
echo "== done in $((SECONDS - started)) s"
