#!/usr/bin/env bash
# The main job: builds the environment, then trains a small ResNet on real MNIST digits in fp32 and
# with mxamp mixed precision, and prints the comparison table.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/ci/setup_env.sh" cpu,example
cd "$ROOT"
exec "$PY" example/train_mnist.py "$@"
