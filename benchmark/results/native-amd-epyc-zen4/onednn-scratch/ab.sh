cd /work/main; export OMP_NUM_THREADS=2
W=benchmark/results/native-amd-epyc-zen4/trim-growth-worker.py
for round in 1 2; do
for wl in resnet50_train mlp_train mobilenet_train transformer_train resnet50_infer; do
 steps=8; [ $wl = resnet50_train ] && steps=6
 for mode in fp32 mxamp mxamp_o2; do
  [ $wl = resnet50_infer ] && [ $mode = mxamp_o2 ] && continue
  for c in unset 0; do
   if [ $c = unset ]; then r=$(.venv/bin/python $W $wl $mode --steps $steps --warmup 2 2>/dev/null | tail -1)
   else r=$(MXNET_MKLDNN_CACHE_NUM=$c .venv/bin/python $W $wl $mode --steps $steps --warmup 2 2>/dev/null | tail -1); fi
   echo "r$round cache=$c $r"
  done
 done
done
done
