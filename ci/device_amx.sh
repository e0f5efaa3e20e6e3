#!/usr/bin/env bash
# What only an AMX CPU can tell (issue #26, and #25's settings there), in one call of about
# 7 minutes on a lent device machine (16 cores). Build the kit here first (ci/device_kit.sh),
# then run, from the device tool:
#
#   run(command="bash ci/device_amx.sh", carry=[".dev"], timeout_s=590)
#
# Writes to $OUT (or ./device-out): suite.log (the whole suite, AMX on, 12 workers on cores
# 4-15), measure.txt (one bench_worker process per line on cores 0-3 meanwhile: ResNet-50 O2
# and converted inference under default memory settings and without each, the Transformer
# block's backward segments, MobileNet's BatchNorm steering, bench_bn_steering.py's variants),
# then cpu_class-*.log (the
# cpu_class tests with AMX off and under each ISA cap, three at once on 4 cores each) and,
# beside them on cores 0-3, probe-backward.txt (ci/probe_bf16_kernels.py --backward),
# probe-speed.txt, channel-blocks-verbose.txt (the kernels of tests/test_channel_blocks.py) and
# se-pooling-verbose.txt (those of tests/test_pooling_graphs.py).
# Timings share the machine with the suite: read ratios within one file, to about +-15%.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-device-out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
PY=${PY:-python3}
# A rehearsal here, without AMX or the kit (tiny batches, the CPUs this machine has):
#   DRY=1 PY=.venv/bin/python SUITE_CPUS=0-1 MEASURE_CPUS=0-1 CLASS_CPUS=0-1 SUITE_S=5 bash ci/device_amx.sh
if [ -z "${DRY:-}" ]; then
  grep -q amx_bf16 /proc/cpuinfo || { echo "NO_AMX: $(grep -m1 'model name' /proc/cpuinfo)"; exit 0; }
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/.dev:$PWD
fi
export XDG_CACHE_HOME=/tmp/xdg PYTHONWARNINGS=ignore::FutureWarning
head="# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores; $(grep -o 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); Python $($PY -c 'import sys; print(sys.version.split()[0])') with numpy 2 through .dev/numpy2_shim.py"
W=benchmark/results/native-amd-epyc-zen4/storage-plans-worker.py

( export OMP_NUM_THREADS=1
  { echo "$head"; echo "# OMP_NUM_THREADS=1 taskset -c 4-15 pytest -n 12 --doctest-modules tests mxamp (AMX on: the default)"
    timeout ${SUITE_S:-300} taskset -c ${SUITE_CPUS:-4-15} $PY -m pytest -q -p no:cacheprovider -n 12 -rfE --doctest-modules tests mxamp; echo "rc=$?"
  } > "$OUT/suite.log" 2>&1 ) &
suite=$!

measure() {   # TAG WORKLOAD MODE [VAR=VALUE ...]
  local tag=$1 wl=$2 mode=$3; shift 3
  env TAG="$tag" "$@" timeout 90 taskset -c ${MEASURE_CPUS:-0-3} $PY "$W" "$wl" "$mode" --steps 4 --warmup 2 ${DRY:+--quick} 2>/tmp/m.err \
    || echo "$tag $wl $mode failed: $(tail -c 300 /tmp/m.err | tr '\n' ' ')"
}
{ echo "$head"; echo "# one process per line, OMP_NUM_THREADS=4 on cores 0-3 while the suite runs on 4-15; A/B/B/A per setting"
  export OMP_NUM_THREADS=4
  for setting in MXNET_MKLDNN_CACHE_NUM=0 MALLOC_ARENA_MAX=64 NNVM_EXEC_MATCH_RANGE=16; do
    for run in default $setting $setting default; do
      if [ "$run" = "default" ]; then measure "default" resnet50_train mxamp_o2
      else measure "$setting" resnet50_train mxamp_o2 "$setting"; fi
    done
  done
  for run in default MXNET_MKLDNN_CACHE_NUM=0 MALLOC_ARENA_MAX=64; do
    if [ "$run" = "default" ]; then measure "default" resnet50_infer mxamp
    else measure "$run" resnet50_infer mxamp "$run"; fi
  done
  for run in default MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD=15 MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD=15 default; do
    if [ "$run" = "default" ]; then measure "default" transformer_train mxamp
    else measure "$run" transformer_train mxamp "$run"; fi
  done
  for mode in fp32 mxamp mxamp_auto mxamp_o2; do measure "$mode" mobilenet_train "$mode"; done
  # where to steer BatchNorm: mxamp's Reshape before it against clip / x*1 after it (and verbose)
  for flag in "" --kernels; do
    OMP_NUM_THREADS=4 timeout 150 taskset -c ${MEASURE_CPUS:-0-3} $PY benchmark/bench_bn_steering.py $flag | grep '^|'
  done
} > "$OUT/measure.txt" 2>&1
wait $suite

# the bfloat16 backward kernels under AMX, on cores 0-3 while the class runs use 4-15
( timeout 150 taskset -c ${MEASURE_CPUS:-0-3} $PY ci/probe_bf16_kernels.py --backward \
    ${DRY:+--ops gather_nd,relu} --out "$OUT/probe-backward.txt" > /dev/null 2>&1
  echo "probe-backward rc=$?: $(head -1 "$OUT/probe-backward.txt" 2>/dev/null)"
  # MXNet's generic bf16 kernels against oneDNN's there (SLOW_BF16 was measured on a Zen 4)
  timeout 60 taskset -c ${MEASURE_CPUS:-0-3} $PY ci/probe_bf16_speed.py --ops \
    _plus_scalar,_mul_scalar,clip,relu,sigmoid,elemwise_mul,broadcast_mul,broadcast_add,Activation,LeakyReLU,Pooling,elemwise_add,Flatten \
    --out "$OUT/probe-speed.txt" > /dev/null 2>&1
  echo "probe-speed rc=$?: $(head -1 "$OUT/probe-speed.txt" 2>/dev/null)"
  # the 16-channel-block cases (tests/test_channel_blocks.py skips them on 'amx'): which
  # convolution and BatchNorm kernels AMX trains them on, raw and under AMP
  for script in GRID_SCRIPT "GROUPED_SCRIPT fp32" "GROUPED_SCRIPT amp" \
      "GROUPED_SCRIPT fp32 shuffle" "GROUPED_SCRIPT amp shuffle"; do
    set -- $script
    $PY -c "import sys; sys.path.insert(0, 'tests'); import test_channel_blocks as t; print(t.$1)" \
      > "$OUT/channel-blocks.py"
    echo "# $script"
    DNNL_VERBOSE=1 timeout 60 taskset -c ${MEASURE_CPUS:-0-3} $PY "$OUT/channel-blocks.py" ${2:-} ${3:-} 2>&1 |
      grep -E "^(RAW|AMP|INFERENCE|DTYPES)|exec,cpu,(convolution|batch_normalization)" | cut -d, -f4-7,9-
  done > "$OUT/channel-blocks-verbose.txt" 2>&1
  # the SE gate's global pooling (tests/test_pooling_graphs.py skips it on 'amx', where the
  # treatment is off): does AMX train its backward on oneDNN's reference kernel too?
  $PY -c "import sys; sys.path.insert(0, 'tests'); import test_pooling_graphs as t; print(t.SE_SCRIPT)" \
    > "$OUT/se-pooling.py"
  DNNL_VERBOSE=1 timeout 60 taskset -c ${MEASURE_CPUS:-0-3} $PY "$OUT/se-pooling.py" 2>&1 |
    grep -E "^(RAW|AMP|DTYPE)|exec,cpu,(pooling|batch_normalization)" | cut -d, -f4-7,9- \
    > "$OUT/se-pooling-verbose.txt" 2>&1 ) &
c=4
for s in MXAMP_AMX=0 DNNL_MAX_CPU_ISA=AVX512_CORE DNNL_MAX_CPU_ISA=AVX2; do
  { echo "$head"; echo "# $s OMP_NUM_THREADS=1 taskset -c $c-$((c+3)) pytest -n 4 -m cpu_class tests"
    env $s OMP_NUM_THREADS=1 timeout 150 taskset -c ${CLASS_CPUS:-$c-$((c+3))} $PY -m pytest -q -p no:cacheprovider -n 4 -rfE -m cpu_class tests; echo "rc=$?"
  } > "$OUT/cpu_class-${s//[=\/]/-}.log" 2>&1 &
  c=$((c+4))
done
wait
grep -h "^rc=\| passed\| failed" "$OUT"/*.log | tail -12
grep -v '^#' "$OUT/measure.txt"
