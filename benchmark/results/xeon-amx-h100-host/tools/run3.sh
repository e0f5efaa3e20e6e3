set -u
export PYTHONUNBUFFERED=1
grep -q amx_bf16 /proc/cpuinfo || { echo NO_AMX; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/.dev:$PWD XDG_CACHE_HOME=/tmp/xdg
head="# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores; flags: $(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '); commit $(git rev-parse --short HEAD 2>/dev/null) + working tree; Python 3.12 + numpy 2 through .dev/numpy2_shim.py"
( export OMP_NUM_THREADS=1
  T="taskset -c 4-15 python3 -m pytest -q -p no:cacheprovider -n 12 -rfE"
  { echo "$head"; echo "# command: OMP_NUM_THREADS=1 pytest -n 12 --doctest-modules tests mxamp (default: AMX on)"; timeout 110 $T --doctest-modules tests mxamp; echo "rc=$?"; } > $OUT/suite-default.log 2>&1
  for s in MXAMP_AMX=0 DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 DNNL_MAX_CPU_ISA=AVX512_CORE DNNL_MAX_CPU_ISA=AVX2; do
    { echo "$head"; echo "# command: $s OMP_NUM_THREADS=1 pytest -n 12 -m cpu_class tests"; env $s timeout 60 $T -m cpu_class tests; echo "rc=$?"; } > $OUT/cpu_class-${s//[=\/]/-}.log 2>&1
  done ) &
export OMP_NUM_THREADS=4
{ echo "$head"; echo "# command: OMP_NUM_THREADS=4 taskset -c 0-3 python3 example/train_mnist.py --no-progress --epochs 2 --plot '' (AMX on: the default)"
  timeout 130 taskset -c 0-3 python3 example/train_mnist.py --no-progress --epochs 2 --plot ''; echo "rc=$?"; } > $OUT/main-job-default.txt 2>&1
{ echo "$head"; echo "# command: MXAMP_AMX=0 OMP_NUM_THREADS=4 taskset -c 0-3 python3 example/train_mnist.py --no-progress --epochs 2 --plot ''"
  MXAMP_AMX=0 timeout 100 taskset -c 0-3 python3 example/train_mnist.py --no-progress --epochs 2 --plot ''; echo "rc=$?"; } > $OUT/main-job-MXAMP_AMX-0.txt 2>&1
{ echo "$head"; echo "# one process per case, median of 5 steps after 2 warm-ups, OMP_NUM_THREADS=4 on cores 0-3 (the test suite ran on cores 4-15 meanwhile)"
  for c in mobilenet_train-fp32 mobilenet_train-bf16 mobilenet_train-bf16_nosteer mobilenet_train-auto rn50inf_fp32 rn50inf_mxamp rn50inf_ref resnet50_train-fp32 resnet50_train-bf16 mlp_train-fp32 mlp_train-bf16; do
    timeout 60 taskset -c 0-3 python3 .dev/explore.py $c > /tmp/c.log 2>&1; echo "rc=$? $(grep RESULT /tmp/c.log || tail -2 /tmp/c.log)"
  done
  DNNL_VERBOSE=1 timeout 40 taskset -c 0-3 python3 .dev/explore.py mobilenet_train-bf16 > /tmp/v.txt 2>&1
  echo "# DNNL_VERBOSE=1, MobileNet bf16 (steered): bnorm_ref lines $(grep -c bnorm_ref /tmp/v.txt)"; python3 .dev/verbose_sum.py < /tmp/v.txt 2>/dev/null | head -10
} > $OUT/steps.txt 2>&1
wait; grep -h "rc=\|passed\|failed" $OUT/*.log $OUT/*.txt | grep -v RESULT | tail -20; grep RESULT $OUT/steps.txt; grep -A12 "^| " $OUT/main-job-default.txt | head -14; grep "^| " $OUT/main-job-MXAMP_AMX-0.txt | head -8
