#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install mxamp into it.
# Usage: source ci/setup_env.sh [extras]   (default extras: cpu,test)
# Sets PY to the environment's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MXAMP_VENV:-$ROOT/.venv}"
EXTRAS="${1:-cpu,test}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[$EXTRAS]"
PY="$VENV/bin/python"
export PY
