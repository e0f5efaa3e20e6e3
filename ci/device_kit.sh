#!/usr/bin/env bash
# Builds .dev/, what ci/device_amx.sh needs on a lent device machine (an H100/H200 host whose
# CPU is an AMX Xeon, Python 3.12 with numpy 2, no internet): the MXNet 1.9.1 wheel, and
# ../shared/tools/numpy2_shim.py with a sitecustomize.py that imports it, because MXNet 1.9.1
# names numpy attributes numpy 2 removed. Not how users run mxamp (they have numpy<1.24):
# for measurements on that CPU only. .dev/ is kept out of git (.git/info/exclude); name it in
# the device call's carry (about 49 MB of the 64 MiB a call may send).
#
#   bash ci/device_kit.sh            # here, in the repository root, once per session
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .dev
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
ls .dev/mxnet-1.9.1-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps \
    --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .dev mxnet==1.9.1
cp ../shared/tools/numpy2_shim.py .dev/
echo 'import numpy2_shim  # noqa: F401  (MXNet 1.9.1 on numpy 2: measurements only)' > .dev/sitecustomize.py
du -sh .dev
