#!/usr/bin/env bash
# The main job: build the extension and run the example support agent on the embedded SQLite
# default. No API key: the model is scripted. Extra arguments go to the example.
set -euo pipefail
. "$(dirname "$0")/setup_env.sh"
maturin develop -q
python examples/support_agent.py "$@"
