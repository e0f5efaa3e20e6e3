"""bench_worker's 'mxamp' cell, with amp.init given tune's 'stem in float32' policy (untuned)."""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import bench_worker
from mxamp import amp
from mxamp.tuning import STEM
policy = amp.Policy("bfloat16, stem in float32", "bfloat16",
                    conditional_fp32_ops=[["Convolution"] + list(STEM)])
orig = amp.init
amp.init = lambda target_dtype=None, **kw: orig(policy=policy)
sys.argv = ["bench_worker.py", sys.argv[1], "mxamp"]
bench_worker.main()
