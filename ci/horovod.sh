#!/usr/bin/env bash
# Horovod check: builds a venv with Horovod 0.28.1 (MXNet + Gloo, CPU, no MPI) from nothing,
# installs mxamp into it and runs the distributed tests there, Horovod's included (2 ranks on
# loopback through horovodrun --gloo). Horovod compiles from source: 3-9 minutes on 2 cores.
#
# Usage: bash ci/horovod.sh [extra pytest args]   (venv: $MXAMP_HVD_VENV, default .venv-hvd)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MXAMP_HVD_VENV:-$ROOT/.venv-hvd}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
"$PY" -m pip install -q --disable-pip-version-check mxnet==1.9.1 numpy==1.23.5 wheel pytest
if ! "$PY" -c "import horovod.mxnet" 2>/dev/null; then
  # --no-build-isolation: Horovod's build imports the installed mxnet to find its headers.
  HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
  HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo \
    "$PY" -m pip install -q --disable-pip-version-check --no-cache-dir --no-build-isolation \
      horovod==0.28.1
fi
"$PY" -m pip install -q --disable-pip-version-check --no-deps -e "$ROOT"
cd "$ROOT"
# MXAMP_REQUIRE_HOROVOD turns the test's "Horovod missing" skip into a failure.
MXAMP_REQUIRE_HOROVOD=1 OMP_NUM_THREADS=1 exec "$PY" -m pytest -q -rs tests/test_distributed.py "$@"
