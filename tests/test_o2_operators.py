"""O2 alone (``amp.cast_model`` without ``amp.init``) and the operators ``hybrid_forward`` calls
directly: MXNet's bfloat16 ``transpose`` corrupts the heap, so where the model computes
bfloat16, ``amp.cast_model`` puts ``amp.init('bfloat16')`` in force after the cast.

Measured on the Zen 4 (class native) before that: this model under ``cast_model`` alone aborted
with glibc's "corrupted size vs. prev_size", hybridized or not. The model runs in a child
process, since a failure aborts the interpreter.
"""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from bf16_expect import BF16_KERNELS, where
from mxamp import amp

SCRIPT = """
import math
import mxnet as mx
from mxnet.gluon import nn
from mxamp import amp

class Net(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(16, flatten=False, in_units=8)

    def hybrid_forward(self, F, x):
        return F.transpose(self.fc(x), axes=(0, 2, 1))

net = Net()
net.initialize()
if HYBRIDIZE:
    net.hybridize()
amp.cast_model(net, "bfloat16")
with mx.autograd.record():
    out = net(mx.nd.ones((2, 4, 8)))
out.backward()
mx.nd.waitall()
total = float(out.sum().asscalar())
print("RESULT", amp.is_initialized(), out.shape, math.isfinite(total))
"""


@pytest.mark.cpu_class
@pytest.mark.parametrize("hybridize", [False, True], ids=["imperative", "hybridized"])
def test_cast_model_alone_keeps_transpose_off_bfloat16(hybridize):
    done = subprocess.run([sys.executable, "-c", SCRIPT.replace("HYBRIDIZE", str(hybridize))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, "the O2 model aborted %s: %s" % (where(), done.stderr[-600:])
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT")][-1]
    # amp.init is put in force exactly where the model computes bfloat16 (bf16_expect's table)
    assert result == "RESULT %s (2, 16, 4) True" % BF16_KERNELS, (result, where())


def test_cast_model_refused_leaves_amp_off(amp_off):
    """Bad input raises before anything is cast or patched."""
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize()
    with pytest.raises(ValueError):
        amp.cast_model(net, "bfloat16", exclude=["no_such_layer"])
    assert not amp.is_initialized(), "a refused cast_model leaves AMP off"


@pytest.mark.cpu_class
def test_cast_model_keeps_another_init_and_warns(amp_off, caplog):
    """An ``amp.init`` for another target stays in force (a process runs one configuration):
    ``cast_model`` finishes the cast and warns where the model computes bfloat16, instead of
    raising half-way through."""
    amp.init(target_dtype="float16")
    float16_transpose = mx.nd.transpose   # float16's wrapper: a second init would replace it
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize()
    with caplog.at_level("WARNING", logger="mxamp"):
        amp.cast_model(net, "bfloat16")
    assert mx.nd.transpose is float16_transpose and amp.target_dtype() == "float16"
    warned = [r.getMessage() for r in caplog.records if "without amp.init" in r.getMessage()]
    # the warning exactly where bfloat16 computes (bf16_expect's table); class none: float32
    assert len(warned) == (1 if BF16_KERNELS else 0), (warned, where())
    assert "amp.reset()" in "".join(warned) or not BF16_KERNELS


class _Plain(mx.gluon.nn.Block):
    """A block that is not hybrid: cast_model cannot wrap its forward, so its bfloat16 weight
    reaches ``dot`` as it is."""

    def __init__(self):
        super().__init__()
        self.weight = self.params.get("weight", shape=(8, 16))

    def forward(self, x):
        return mx.nd.dot(x, self.weight.data())


@pytest.mark.cpu_class
def test_cast_model_alone_runs_a_block_that_is_not_hybrid(amp_off):
    """Measured under ``DNNL_MAX_CPU_ISA=AVX2`` before the fix: MXNet refused the forward pass
    ("Incompatible attr ... expected float32, got bfloat16"), as ``dot`` got a float32 batch and
    the bfloat16 weight; with ``amp.init`` in force it runs on every class."""
    mx.random.seed(7)
    net = _Plain()
    net.initialize(mx.init.Uniform(1.0))
    amp.cast_model(net, "bfloat16")
    assert amp.is_initialized(), "cast_model leaves the operators of an unwrapped block unrouted"
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    out = net(mx.nd.array(x)).astype("float32").asnumpy()
    # the weight as stored (bfloat16 values, exact in float32), multiplied in float64 here
    weight = net.weight.data().astype("float32").asnumpy().astype(np.float64)
    expected = x.astype(np.float64) @ weight
    # max |error| / max |expected|, measured on the Zen 4: 0.00118 where bfloat16 computes
    # (native and emulated: the output's bfloat16 rounding), 7.9e-08 on class none (float32);
    # the bounds are about 3x and 13x that
    err = float(np.abs(out - expected).max() / np.abs(expected).max())
    assert err < (2 ** -8 if BF16_KERNELS else 1e-6), (err, where())
