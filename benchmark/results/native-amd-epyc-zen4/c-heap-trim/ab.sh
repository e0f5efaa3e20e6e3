#!/bin/bash
# Alternating processes of two checkouts, OLD then NEW, per workload and mode; two cycles.
# usage: bash ab.sh OLD_TREE NEW_TREE > ab.txt   (from the repository root; OMP_NUM_THREADS=2)
OLD=$1; NEW=$2; F=$(dirname "$0")/faults.py
export OMP_NUM_THREADS=2
for i in 1 2; do
  for wm in mobilenet_train:fp32_mxamp_imported mobilenet_train:mxamp mobilenet_train:mxamp_o2 \
            transformer_train:mxamp transformer_train:mxamp_o2 \
            resnet50_train:mxamp resnet50_train:mxamp_o2; do
    wl=${wm%%:*}; mode=${wm##*:}; steps=8; [ $wl = resnet50_train ] && steps=3
    STEPS=$steps python "$F" "$OLD" $wl $mode old
    STEPS=$steps python "$F" "$NEW" $wl $mode new
  done
done
