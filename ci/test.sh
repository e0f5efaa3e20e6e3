#!/usr/bin/env bash
# The test command: builds the environment from nothing (python3 -m venv), then runs the tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/ci/setup_env.sh" cpu,test
cd "$ROOT"
exec "$PY" -m pytest -q -p no:cacheprovider --doctest-modules tests mxamp "$@"
