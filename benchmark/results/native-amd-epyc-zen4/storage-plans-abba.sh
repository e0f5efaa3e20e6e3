# Order-balanced processes of storage-plans-worker.py (A, B, B, A; CYCLES cycles, default 3):
# A = MXNet's match range 16 (its default, spelled out: import mxamp sets its own choice where
# none is set), B = the setting in $B (for example NNVM_AUTO_SEARCH_MATCH_RANGE=1).
# WLS, MODES and STEPS from the environment.
cd /tmp
W=/work/main/benchmark/results/native-amd-epyc-zen4/storage-plans-worker.py
for wl in $WLS; do for c in $(seq 1 ${CYCLES:-3}); do for m in $MODES; do for v in A B B A; do
  if [ $v = B ]; then E="$B"; T=${B%%=*}; else E="NNVM_EXEC_MATCH_RANGE=16"; T=range16; fi
  env TAG=$T NNVM_EXEC_MATCH_RANGE=16 $E /work/main/.venv/bin/python $W $wl $m --steps $STEPS --warmup 2 2>/dev/null | sed "s/^/c$c /"
done; done; done; done
