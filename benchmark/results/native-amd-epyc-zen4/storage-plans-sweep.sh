# One process per workload, mode and planner setting: MXNet's match range 16 (its default),
# its own search over 1..16 (NNVM_AUTO_SEARCH_MATCH_RANGE) and 1. WLS, MODES, STEPS from the environment.
cd /tmp
for wl in $WLS; do for m in $MODES; do
  TAG=default NNVM_EXEC_MATCH_RANGE=16 /work/main/.venv/bin/python /work/main/benchmark/results/native-amd-epyc-zen4/storage-plans-worker.py $wl $m --steps $STEPS --warmup 2 2>/dev/null
  TAG=auto NNVM_AUTO_SEARCH_MATCH_RANGE=1 /work/main/.venv/bin/python /work/main/benchmark/results/native-amd-epyc-zen4/storage-plans-worker.py $wl $m --steps $STEPS --warmup 2 2>/dev/null
  TAG=range1 NNVM_EXEC_MATCH_RANGE=1 /work/main/.venv/bin/python /work/main/benchmark/results/native-amd-epyc-zen4/storage-plans-worker.py $wl $m --steps $STEPS --warmup 2 2>/dev/null
done; done
