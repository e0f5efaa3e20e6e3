#!/usr/bin/env bash
# The full suite on two source trees, alternating, CYCLES times (suite-time-921cd8a.md).
# Usage: bash suite-time-ab.sh OLD_TREE NEW_TREE [CYCLES]   (e.g. a `git worktree add` of the
# old commit, and this checkout); the venv is this checkout's .venv.
set -u
PY="$(cd "$(dirname "$0")/../../.." && pwd)/.venv/bin/python"
for cycle in $(seq 1 "${3:-2}"); do
  for tree in "$1" "$2"; do
    cd "$tree" || exit 1
    log=$(mktemp)
    s=$(date +%s)
    "$PY" -m pytest -q -p no:cacheprovider --doctest-modules tests mxamp > "$log" 2>&1
    e=$(date +%s)
    echo "$cycle $tree $(git rev-parse --short HEAD) $((e-s)) s: $(tail -1 "$log")"
    rm -f "$log"
  done
done
