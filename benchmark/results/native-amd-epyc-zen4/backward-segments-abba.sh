cd /tmp
W=/work/main/benchmark/results/native-amd-epyc-zen4/trim-growth-worker.py
for wl in $WLS; do for c in 1 2 3; do for m in mxamp mxamp_o2; do for b in 15 1 1 15; do
  MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD=$b /work/main/.venv/bin/python $W $wl $m --steps $STEPS --warmup 2 2>/dev/null | sed "s/^/c$c bwd=$b /"
done; done; done; done
