"""Global average pooling into a convolution (squeeze-excitation gates) trains on oneDNN's
reference kernels, in float32 as in bfloat16; where bfloat16 computes without AMX, mxamp's
graph treatment computes that pooling as a float32 ``mean`` (``mxamp/runtime/pooling_graphs.py``).

The kernel facts come from oneDNN's verbose output in a subprocess, checked first against
MXNet alone; the decision test names the classes it forces and checks decisions only.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from trained_graphs import trained_graph_nodes
from bf16_expect import CPU_CLASS, where
from mxamp.lists import get_op_lists
from mxamp.precision.device_plan import device_plan
from mxamp.runtime.pooling_graphs import STEER_POOLING, steer_global_pooling

TREATED = CPU_CLASS in ("native", "emulated")

SE_SCRIPT = r"""
import json, sys
import mxnet as mx
from mxnet import autograd, gluon
from mxamp import amp

class SEUnit(gluon.HybridBlock):
    # (channels, size): 16 at 28x28 gets mxamp's mean, 64 at 14x14 its Reshape (fewer
    # channels than pixels a row: a channels-last pooling gradient; pooling_graphs.py)
    def __init__(self, channels, **kwargs):
        super().__init__(**kwargs)
        self.conv = gluon.nn.Conv2D(channels, 3, padding=1, in_channels=channels, use_bias=False)
        self.bn = gluon.nn.BatchNorm(in_channels=channels)
        self.pool = gluon.nn.GlobalAvgPool2D()
        self.squeeze = gluon.nn.Conv2D(8, 1, in_channels=channels)
        self.excite = gluon.nn.Conv2D(channels, 1, in_channels=8)

    def hybrid_forward(self, F, x):
        y = F.relu(self.bn(self.conv(x)))
        gate = F.sigmoid(self.excite(F.relu(self.squeeze(self.pool(y)))))
        return F.broadcast_mul(y, gate)

def train_once():
    for channels, size in ((16, 28), (64, 14)):
        mx.random.seed(0)
        net = SEUnit(channels)
        net.initialize()
        net.hybridize()
        with autograd.record():
            y = net(mx.nd.random.uniform(shape=(4, channels, size, size)))
        y.backward()
        mx.nd.waitall()
    return str(y.dtype)

print("RAW", flush=True)                 # MXNet alone, float32
train_once()
amp.init("bfloat16")
print("AMP", flush=True)
print("DTYPE " + train_once(), flush=True)
"""


def _slow_kernels(section):
    """The verbose lines of pooling backward and BatchNorm on a reference kernel."""
    return [line for line in section if line.startswith("dnnl_verbose,exec,cpu,")
            and (",pooling" in line and ",ref:" in line and "backward" in line
                 or "bnorm_ref" in line)]


@pytest.mark.cpu_class
def test_se_gate_pooling_leaves_the_reference_kernels():
    """In MXNet alone, float32 SE units with 16 channels at 28x28 and 64 at 14x14 train their
    pooling backward on oneDNN's reference kernel. Under ``amp.init('bfloat16')``, where the
    class treats such graphs (native, emulated), no pooling backward and no BatchNorm runs on
    a reference kernel; on 'none' the graphs are MXNet's own, and the reference kernel stays."""
    if CPU_CLASS == "amx":
        pytest.skip("not treated on 'amx' (not measured there); ci/device_amx.sh records it")
    run = subprocess.run([sys.executable, "-c", SE_SCRIPT], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, DNNL_VERBOSE="1"))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    raw, under_amp = lines[lines.index("RAW"):lines.index("AMP")], lines[lines.index("AMP"):]
    raw_slow = _slow_kernels(raw)
    raw_pooling = " ".join(l.split(",")[-2] for l in raw_slow if "pooling" in l)
    assert "ic16_ih28" in raw_pooling and "ic64_ih14" in raw_pooling, (
        "oneDNN no longer trains the SE gate's pooling backward on its reference kernel: the "
        "treatment may no longer be needed %s\n%s" % (where(), "\n".join(raw_slow)))
    if TREATED:
        assert _slow_kernels(under_amp) == [], "\n".join(_slow_kernels(under_amp))
    else:
        assert len([l for l in _slow_kernels(under_amp) if "pooling" in l]) == 2, under_amp


def _se_and_head():
    """A hybridized SE unit with a classifier head: the SE pooling feeds a convolution, the
    head's a Dense layer."""
    from mxnet.gluon import nn

    class Net(nn.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = nn.Conv2D(32, 3, padding=1, in_channels=16, use_bias=False)
            self.bn = nn.BatchNorm(in_channels=32)
            self.se_pool = nn.GlobalAvgPool2D()
            self.squeeze = nn.Conv2D(16, 1, in_channels=32)
            self.excite = nn.Conv2D(32, 1, in_channels=16)
            self.head_pool = nn.GlobalAvgPool2D()
            self.out = nn.Dense(10, in_units=32)

        def hybrid_forward(self, F, x):
            y = F.relu(self.bn(self.conv(x)))
            y = F.broadcast_mul(y, F.sigmoid(self.excite(F.relu(self.squeeze(self.se_pool(y))))))
            return self.out(F.flatten(self.head_pool(y)))

    mx.random.seed(0)
    net = Net()
    net.initialize()
    return net


@pytest.mark.cpu_class
@pytest.mark.parametrize("size", [14, 40])
@pytest.mark.parametrize("o2", [False, True], ids=["amp.init", "cast_model"])
def test_only_the_gate_pooling_is_steered(o2, size):
    """The graph a hybridized SE unit (32 channels) with a classifier head trains, under
    ``amp.init`` and under O2's ``cast_model``. On native and emulated the SE pooling gets a
    Reshape before it at 14x14 (channels at least the size), and becomes a ``mean`` between
    casts to float32 and back to bfloat16 at 40x40; the head's pooling (into a Dense layer)
    stays as it is. Elsewhere both stay as they are."""
    net = _se_and_head()
    nodes = trained_graph_nodes(net, (2, 16, size, size), o2)
    pools = [(n["op"], n["name"]) for n in nodes if "pool" in n["name"]]
    gate, head = [name for op, name in pools if op in ("Pooling", "mean")]
    if not TREATED:
        expected = [("Pooling", gate), ("Pooling", head)]
    elif size == 14:
        expected = [("Reshape", gate + "_mxamp_layout"), ("Pooling", gate), ("Pooling", head)]
    else:
        expected = [("amp_cast", gate + "_float32"), ("mean", gate),
                    ("amp_cast", gate + "_bfloat16"), ("Pooling", head)]
    assert pools == expected and gate != head, (pools, where())


@pytest.mark.parametrize("adaptive", [False, True], ids=["Pooling", "AdaptiveAvgPooling2D"])
@pytest.mark.parametrize("shapes, steering", [(None, "mean"), ({"data": (2, 8, 7, 7)}, "Reshape")])
def test_steer_global_pooling_keeps_the_values(shapes, steering, adaptive):
    """Both steerings of a float32 graph (``mean`` where the shape is unknown, a Reshape where
    8 channels are at least the 7x7 size) give the original's output and input gradient: the
    same averages, possibly summed in another order (measured: a max difference of 0 for both
    from Pooling and 0 and 7.5e-9 from AdaptiveAvgPooling2D on a Zen 4, natively and under the
    AVX512_CORE and AVX2 caps; the bound 1e-6 leaves room for float32's rounding of another
    order at these magnitudes, values up to 0.53)."""
    x = mx.sym.var("data")
    pooled = mx.sym.contrib.AdaptiveAvgPooling2D(x, output_size=1, name="p") if adaptive else \
        mx.sym.Pooling(x, global_pool=True, pool_type="avg", kernel=(1, 1), name="p")
    gate = mx.sym.sigmoid(mx.sym.Convolution(pooled, kernel=(1, 1), num_filter=8, name="c"))
    out = mx.sym.broadcast_mul(x, gate)
    rewritten = steer_global_pooling(out, known_shapes=shapes)
    assert [n["op"] for n in json.loads(rewritten.tojson())["nodes"]].count(steering) == 1
    rng = np.random.RandomState(0)
    values = {"data": rng.uniform(-1, 1, (2, 8, 7, 7)),
              "c_weight": rng.normal(0, 0.3, (8, 8, 1, 1)), "c_bias": np.zeros(8)}
    head = rng.uniform(-1, 1, (2, 8, 7, 7))
    results = []
    for sym in (out, rewritten):
        args = {k: mx.nd.array(v) for k, v in values.items()}
        grads = {"data": mx.nd.zeros((2, 8, 7, 7))}
        run = sym.bind(mx.cpu(), args, args_grad=grads, grad_req={"data": "write"})
        y = run.forward(is_train=True)[0].asnumpy()
        run.backward(mx.nd.array(head))
        results.append((y, grads["data"].asnumpy()))
    assert np.abs(results[0][0] - results[1][0]).max() <= 1e-6
    assert np.abs(results[0][1] - results[1][1]).max() <= 1e-6


@pytest.mark.cpu_class
@pytest.mark.parametrize("size, steering", [(7, "Pooling"), (20, "mean")])
def test_adaptive_average_pooling_to_one_pixel_is_steered(size, steering):
    """An SE-ResNet gate as GluonCV writes it: ``contrib.AdaptiveAvgPooling2D`` to one pixel,
    then Dense layers. On native and emulated it becomes oneDNN's global Pooling after a
    Reshape (16 channels at 7x7) or a float32 ``mean`` (16 channels at 20x20); elsewhere it
    stays. The gate's output under AMP matches MXNet alone in float32 to bfloat16's precision
    (measured max difference relative to the largest value: 0.0036 at 7x7 and 0.0035 at 20x20
    natively and under AVX512_CORE, 0 under AVX2; bound 0.02, bfloat16's 8 bits with room)."""
    from mxnet.gluon import nn

    class Gate(nn.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.fc = nn.Dense(16, in_units=16)

        def hybrid_forward(self, F, x):
            return F.broadcast_mul(x, F.sigmoid(self.fc(
                F.contrib.AdaptiveAvgPooling2D(x, output_size=1))).reshape((0, 0, 1, 1)))

    mx.random.seed(0)
    net = Gate()
    net.initialize()
    x = mx.nd.random.uniform(shape=(2, 16, size, size))
    net.hybridize()
    expected = net(x).asnumpy()
    nodes = trained_graph_nodes(net, x.shape)
    ops = [n["op"] for n in nodes]
    if TREATED:
        assert "_contrib_AdaptiveAvgPooling2D" not in ops and steering in ops, (ops, where())
    else:
        assert "_contrib_AdaptiveAvgPooling2D" in ops, (ops, where())
    from mxamp import amp
    amp.init("bfloat16")
    try:
        net.hybridize()
        got = net(x).astype("float32").asnumpy()
    finally:
        amp.reset()
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 0.02


def test_a_pooling_of_unknown_dtype_stays():
    """Given the graph's input dtypes, a pooling whose data dtype MXNet cannot infer (an input
    left out) is left as it is: a mean without casts on bfloat16 data could not run."""
    x = mx.sym.var("data")
    pooled = mx.sym.Pooling(x, global_pool=True, pool_type="avg", kernel=(1, 1))
    out = mx.sym.Convolution(pooled, kernel=(1, 1), num_filter=4, name="c")
    assert steer_global_pooling(out, {}) is out
    assert steer_global_pooling(out, {"other": np.float32}) is out


def test_each_class_gets_its_pooling_treatment():
    """Decisions only (no kernel runs): the classes without AMX that compute bfloat16 get the
    treatment; 'amx' (not measured), 'none' (float32 compute) and GPUs do not."""
    lists = get_op_lists("bfloat16")
    treatment = {device: device_plan("bfloat16", lists, device).pooling_graphs
                 for device in ("native", "emulated", "amx", "none", "gpu")}
    assert treatment == {"native": STEER_POOLING, "emulated": STEER_POOLING, "amx": "",
                         "none": "", "gpu": ""}
    assert STEER_POOLING in device_plan("bfloat16", lists, "native").describe()
