"""Recorded casts that a zero gradient reaches (through comparisons, argmax, one_hot, numpy
var, or abs then a comparison): MXNet 1.9.1's imperative backward read an array the cast never
kept and crashed (segmentation fault) where the same code without AMP runs
(``mxamp.runtime.zero_grad``).

The models run in a child process: before the fix the crash took the whole process down.
Their gradients are held against the same model hybridized (a graph keeps every array, and
never crashed), bit for bit, and against what float32 gives the gate's weights: zero.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bf16_expect import where

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, sys
import mxnet as mx, numpy as onp
from mxnet import autograd, gluon
from mxamp import amp
amp.init(target_dtype="bfloat16")

class Gate(gluon.HybridBlock):
    def __init__(self, variant):
        super().__init__()
        self.variant = variant
        with self.name_scope():
            self.score = gluon.nn.Dense(6, in_units=8)
            self.value = gluon.nn.Dense(6, in_units=8)

    def hybrid_forward(self, F, x):
        s = self.score(x)
        if self.variant == "mask":                  # a hard gate
            return (s > 0) * self.value(x)
        if self.variant == "route":                 # top-1 routing
            return F.one_hot(F.argmax(s, axis=1), 6) * self.value(x)
        if self.variant == "abs":                   # a chain before the comparison
            return (F.abs(s) > 0.1) * self.value(x)
        return F.where(s > 0, self.value(x), F.zeros_like(s))

def grads(variant, hybridize):
    mx.random.seed(1)
    net = Gate(variant)
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    x = mx.nd.array(onp.random.RandomState(1).randn(4, 8))
    with autograd.record():
        loss = (net(x) ** 2).sum()
    loss.backward()
    return {k.split("_", 1)[1]: p.grad().asnumpy().astype("float64").tolist()
            for k, p in net.collect_params().items()}

out = {v: [grads(v, False), grads(v, True)] for v in sys.argv[1:]}
# numpy var has no gradient in MXNet 1.9.1: its input's is zero
mx.npx.set_np()
dense = gluon.nn.Dense(4, in_units=3)
dense.initialize()
with autograd.record():
    spread = mx.np.var(dense(mx.np.ones((2, 3))))
spread.backward()
out["var"] = float(abs(dense.weight.grad()).sum())
print("RESULT " + json.dumps(out))
'''

VARIANTS = ["mask", "route", "abs", "where"]


@pytest.mark.cpu_class
def test_gates_of_dense_outputs_run_backward_imperatively():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHILD] + VARIANTS, capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, "backward crashed (rc %d) %s: %s" % (
        proc.returncode, where(), proc.stderr[-1500:])
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    for variant in VARIANTS:
        imperative, hybridized = result[variant]
        assert imperative.keys() == hybridized.keys()
        for name in imperative:
            assert np.array_equal(imperative[name], hybridized[name]), (
                "%s: %s's gradient differs from the hybridized model's %s" % (
                    variant, name, where()))
        # the gate's comparison or argmax gives the score layer no gradient, as in float32
        assert not np.any(imperative["dense0_weight"]), variant
        assert np.any(imperative["dense1_weight"]), variant
    assert result["var"] == 0.0, "numpy var has no gradient in MXNet 1.9.1"
