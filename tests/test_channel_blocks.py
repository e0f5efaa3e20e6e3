"""oneDNN 2.4's 16-channel blocks: where a bfloat16 convolution's channels, or its groups,
are off them, training falls to slow kernels, and mxamp computes in float32 around them.

* A dense or pointwise convolution with input or output channels off 16-channel blocks (a
  3-channel stem too) trains on ``gemm:jit`` in plain layout, and the BatchNorm after it on
  ``ncsp_bnorm``: a speed rule of the classes without AMX (``mxamp/lists/bfloat16.py``).
* A grouped convolution with groups off 16-channel blocks (ResNeXt) lays its data and gradient
  out in 4- or 8-channel blocks, and the BatchNorms next to it train on ``bnorm_ref``: a
  treatment of hybridized graphs (``mxamp/runtime/depthwise_graphs.py``).

The kernel facts come from oneDNN's verbose output in a subprocess, checked first against
MXNet alone; the decision tests force a class and say so.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from trained_graphs import O2_GRAPH_INPUT, data_dtypes, trained_graph_nodes
from bf16_expect import BF16_KERNELS, CPU_CLASS, where
from mxamp import amp
from mxamp.dtypes import BFLOAT16


GRID_SCRIPT = r"""
import json, sys
import mxnet as mx
from mxnet import autograd, gluon
from mxamp import amp
from mxamp.dtypes import BFLOAT16

CHANNELS = (24, 32)                      # input channels: off and on oneDNN's 16-channel grid

def block(channels):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(48, 1, in_channels=channels, use_bias=False),
            gluon.nn.BatchNorm(in_channels=48))
    net.initialize()
    net.hybridize()
    return net

x = {c: mx.nd.random.uniform(shape=(2, c, 14, 14)) for c in CHANNELS}
print("RAW", flush=True)                 # oneDNN's own choice for bf16 training, no AMP
for c in CHANNELS:
    w = mx.nd.random.uniform(shape=(48, c, 1, 1))
    stats = [mx.nd.ones((48,)), mx.nd.zeros((48,)), mx.nd.zeros((48,)), mx.nd.ones((48,))]
    try:
        with autograd.record():
            y = mx.nd.Convolution(mx.nd.amp_cast(x[c], dtype=BFLOAT16),
                                  mx.nd.amp_cast(w, dtype=BFLOAT16), kernel=(1, 1),
                                  num_filter=48, no_bias=True)
            mx.nd.BatchNorm(y, *stats).wait_to_read()
    except mx.base.MXNetError:
        pass                             # class none: no bf16 kernel
amp.init("bfloat16")
print("AMP", flush=True)
with autograd.record():
    dtypes = {c: str(block(c)(x[c]).dtype) for c in CHANNELS}
mx.nd.waitall()
print("INFERENCE", flush=True)           # a graph built outside record(): no speed rule
dtypes["inference"] = str(block(24)(x[24]).dtype)
mx.nd.waitall()
print("DTYPES " + json.dumps(dtypes), flush=True)
"""


def _primitives(section, kind):
    """(implementation, source dtype, shape) of each ``kind`` primitive in verbose lines."""
    found = []
    for line in section:
        fields = line.split(",")
        if line.startswith("dnnl_verbose,exec,cpu," + kind) and len(fields) > 6:
            source = fields[6].split()[0].split(":")[0]       # e.g. 'src_bf16', 'data_f32'
            found.append((fields[4], source.split("_")[1], fields[-2]))
    return found


@pytest.mark.cpu_class
def test_convolutions_off_16_channel_blocks_compute_in_float32():
    """oneDNN's verbose output says which kernels ran. In MXNet alone, a bfloat16 1x1
    convolution from 24 channels trains on gemm:jit and the BatchNorm after it on the
    plain-layout ncsp_bnorm; one from 32 channels on a jit convolution and bnorm_jit. Under
    ``amp.init('bfloat16')`` the 24-channel pair computes in float32 on neither of those
    kernels when trained, and the 32-channel pair stays in bfloat16. A graph built for
    inference keeps the 24-channel convolution in bfloat16."""
    if CPU_CLASS == "amx":
        pytest.skip("the rule is for the classes without AMX: on 'amx' oneDNN's brgconv "
                    "kernels take any channel count (not measured); ci/device_amx.sh records it")
    run = subprocess.run([sys.executable, "-c", GRID_SCRIPT], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, DNNL_VERBOSE="1"))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    raw = lines[lines.index("RAW"):lines.index("AMP")]
    under_amp = lines[lines.index("AMP"):lines.index("INFERENCE")]
    dtypes = json.loads(next(l for l in lines if l.startswith("DTYPES "))[7:])
    amp_convs = {shape.split("_")[1][:4]: (impl, src)
                 for impl, src, shape in _primitives(under_amp, "convolution")}
    amp_norms = {shape.split("ih")[0].split("ic")[1]: (impl, src)
                 for impl, src, shape in _primitives(under_amp, "batch_normalization")}
    if not BF16_KERNELS:                 # class none: everything in float32
        assert {src for _, src in list(amp_convs.values()) + list(amp_norms.values())} == \
            {"f32"}, under_amp
        assert set(dtypes.values()) == {str(np.dtype(np.float32).type)}, dtypes
        return
    raw_convs = {shape.split("_")[1][:4]: impl
                 for impl, _, shape in _primitives(raw, "convolution")}
    raw_norms = [impl for impl, _, _ in _primitives(raw, "batch_normalization")]
    assert "gemm" in raw_convs["ic24"] and "gemm" not in raw_convs["ic32"] and \
        raw_norms[0].startswith("ncsp") and not raw_norms[1].startswith("ncsp"), (
            "oneDNN's bf16 convolution dispatch changed (%s, %s): the rule for channel counts "
            "off 16-blocks may no longer be needed %s" % (raw_convs, raw_norms, where()))
    assert amp_convs["ic24"][1] == "f32" and "gemm" not in amp_convs["ic24"][0], under_amp
    assert amp_convs["ic32"][1] == "bf16", under_amp
    norms = [(impl, src) for impl, src, _ in _primitives(under_amp, "batch_normalization")]
    assert norms[0][1] == "f32" and not norms[0][0].startswith("ncsp"), norms
    assert norms[1][1] == "bf16" and not norms[1][0].startswith("ncsp"), norms
    assert dtypes == {"24": str(np.dtype(np.float32).type), "32": str(BFLOAT16),
                      "inference": str(BFLOAT16)}, dtypes


@pytest.mark.parametrize("cls", ["emulated", "native", "amx"])
def test_channel_grid_speed_rule_decisions(forced_class, cls):
    """Checks decisions only (the class forced by ``forced_class``): a dense or pointwise
    convolution with input or output channels off oneDNN's 16-channel blocks (a stem's 3
    too) trains in float32 on the classes without AMX, natively up to 255 channels (the table's
    measurements: from 256 on bfloat16 gains), emulated at any count; for inference, on a
    multiple of 16, a grouped convolution, an unknown shape or on 'amx' it stays in bfloat16."""
    forced_class(cls)
    amp.init("bfloat16")
    rule_here = cls != "amx"
    cases = [((8, 24, 28, 28), dict(kernel=(1, 1), num_filter=144), rule_here),
             ((8, 96, 28, 28), dict(kernel=(1, 1), num_filter=24), rule_here),
             ((8, 3, 224, 224), dict(kernel=(7, 7), num_filter=64), rule_here),
             ((8, 232, 14, 14), dict(kernel=(1, 1), num_filter=232), rule_here),
             ((8, 728, 14, 14), dict(kernel=(1, 1), num_filter=728), cls == "emulated"),
             ((8, 64, 14, 14), dict(kernel=(1, 1), num_filter=728), cls == "emulated"),
             ((8, 64, 56, 56), dict(kernel=(3, 3), num_filter=64), False),
             ((8, 128, 28, 28), dict(kernel=(3, 3), num_filter=128, num_group=32), False),
             (None, dict(kernel=(3, 3), num_filter=24), False)]
    for shape, params, fp32 in cases:
        got, why = amp.precision_of("Convolution", data_shape=shape, training=True, **params)
        assert got == ("float32" if fp32 else "bfloat16"), (cls, shape, params, got, why)
        if fp32:
            assert "blocks of 16" in why, why
        assert amp.precision_of("Convolution", data_shape=shape, training=False,
                                **params)[0] == "bfloat16", "inference: %s %s" % (shape, params)
    with mx.autograd.record():          # training=None: as a call made here
        assert amp.precision_of("Convolution", data_shape=(8, 24, 28, 28), kernel=(1, 1),
                                num_filter=144)[0] == ("float32" if rule_here else "bfloat16")


GROUPED_SCRIPT = r"""
import sys
import mxnet as mx
from mxnet import autograd
from mxnet.gluon import nn

def block():
    mx.random.seed(0)
    net = nn.HybridSequential()
    if SHUFFLE:     # ShuffleNet V1's grouped 1x1 convolutions: 3 groups of 80 and 20 channels
        net.add(nn.Conv2D(60, 1, groups=3), nn.BatchNorm(), nn.Activation("relu"),
                nn.Conv2D(240, 1, groups=3), nn.BatchNorm())
    else:           # a ResNeXt bottleneck: 16 groups of 4 channels
        net.add(nn.Conv2D(64, 1, in_channels=64, use_bias=False), nn.BatchNorm(in_channels=64),
                nn.Activation("relu"),
                nn.Conv2D(64, 3, padding=1, groups=16, in_channels=64, use_bias=False),
                nn.BatchNorm(in_channels=64), nn.Activation("relu"),
                nn.Conv2D(64, 1, in_channels=64, use_bias=False), nn.BatchNorm(in_channels=64))
    net.initialize(mx.init.Xavier())
    if sys.argv[1] == "o2":
        net = amp.cast_model(net, "bfloat16", example_inputs=batch())
    net.hybridize()
    return net

SHUFFLE = sys.argv[2:] == ["shuffle"]

def batch():
    return mx.nd.random.uniform(shape=(2, 240, 14, 14) if SHUFFLE else (2, 64, 14, 14))

def step(net):
    x = batch()
    with autograd.record():
        y = net(x)
    y.backward(mx.nd.ones_like(y))
    mx.nd.waitall()

if sys.argv[1] in ("amp", "o2"):
    from mxamp import amp
    amp.init("bfloat16")
step(block())
"""


def _batchnorm_kernels(mode, unit=""):
    """(implementation, data dtype) of each BatchNorm primitive one training step of a ResNeXt
    bottleneck (``unit`` 'shuffle': a ShuffleNet V1 unit) ran, from oneDNN's verbose output;
    ``mode`` 'fp32' (MXNet alone), 'amp' or 'o2' (``amp.cast_model`` too)."""
    run = subprocess.run([sys.executable, "-c", GROUPED_SCRIPT, mode, unit], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, DNNL_VERBOSE="1"))
    assert run.returncode == 0, run.stderr[-2000:]
    found = []
    for line in run.stdout.splitlines():
        fields = line.split(",")
        if line.startswith("dnnl_verbose,exec,cpu,batch_normalization") and len(fields) > 6:
            found.append((fields[4], fields[6].split()[0].split(":")[0].split("_")[1]))
    return found


@pytest.mark.cpu_class
def test_batchnorm_at_grouped_convolutions_leaves_the_reference_kernel():
    """oneDNN's verbose output says which BatchNorm kernels ran. In MXNet alone, float32, a
    ResNeXt bottleneck (groups of 4 channels) trains its BatchNorms next to the grouped
    convolution on ``bnorm_ref`` (a layout of 4-channel blocks no jit kernel takes). Under
    ``amp.init('bfloat16')`` on a class with bfloat16 kernels, those BatchNorms compute in
    float32 off the reference kernel, and the last one in bfloat16."""
    if CPU_CLASS == "amx":
        pytest.skip("on 'amx' mxamp steers these BatchNorms instead (tests/test_depthwise_graphs"
                    ".py); the grouped case is not measured there")
    if not BF16_KERNELS:             # class none: AMP computes in float32, nothing to treat
        assert {dtype for _, dtype in _batchnorm_kernels("amp")} == {"f32"}
        return
    alone = _batchnorm_kernels("fp32")
    assert any(impl.startswith("bnorm_ref") for impl, _ in alone), (
        "oneDNN no longer runs these BatchNorms on its reference kernel (%s): the treatment "
        "may no longer be needed %s" % (alone, where()))
    under_amp = _batchnorm_kernels("amp")
    assert not any(impl.startswith("bnorm_ref") for impl, _ in under_amp), under_amp
    assert [dtype for _, dtype in under_amp].count("f32") == 4, under_amp   # 2 fwd + 2 bwd
    assert [dtype for _, dtype in under_amp].count("bf16") == 2, under_amp


@pytest.mark.cpu_class
@pytest.mark.parametrize("o2", [False, True], ids=["amp_init", "cast_model"])
def test_batchnorm_at_grouped_convolutions_in_graphs(o2):
    """The graph a hybridized ResNeXt bottleneck trains: under ``amp.init`` and under O2's
    ``cast_model`` (whose data reaches the graph in bfloat16), the two BatchNorms next to the
    grouped convolution sit between casts to float32 and back, on the classes without AMX; the
    last BatchNorm and, on 'none', every one, have none."""
    from mxnet.gluon import nn
    mx.random.seed(0)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(64, 1, in_channels=64, use_bias=False), nn.BatchNorm(in_channels=64),
            nn.Activation("relu"),
            nn.Conv2D(64, 3, padding=1, groups=16, in_channels=64, use_bias=False),
            nn.BatchNorm(in_channels=64), nn.Activation("relu"),
            nn.Conv2D(64, 1, in_channels=64, use_bias=False), nn.BatchNorm(in_channels=64))
    net.initialize()
    nodes = trained_graph_nodes(net, (2, 64, 14, 14), o2)
    casts = sorted(n["name"] for n in nodes if n["op"] in ("BatchNorm", "amp_cast")
                   and n["name"].startswith("batchnorm"))
    treated = CPU_CLASS in ("native", "emulated")
    bn = [n["name"] for n in nodes if n["op"] == "BatchNorm"]   # in the model's order
    expected = [b + suffix for b in bn[:2] for suffix in ("", "_bfloat16", "_float32")] + \
        [bn[2]] if treated else bn
    assert casts == sorted(expected), (casts, where())


@pytest.mark.cpu_class
def test_float32_batchnorm_at_grouped_convolutions_leaves_the_reference_kernel():
    """A ShuffleNet V1 unit: grouped 1x1 convolutions of 3 groups, 80 and 20 channels each, the
    input channels not declared (the graph infers them). In MXNet alone, float32, its
    BatchNorms train on ``bnorm_ref`` (4-channel blocks). Under ``amp.init('bfloat16')`` the
    channel rule keeps them in float32, and on the classes without AMX none runs on
    ``bnorm_ref``: the first, whose ReLU feeds the second grouped convolution, included (its
    gradient comes back in that convolution's layout). On 'none' (AVX2: no 4-channel blocks)
    mxamp runs the kernels MXNet alone does."""
    if CPU_CLASS == "amx":
        pytest.skip("not measured on 'amx'; ci/device_amx.sh records it")
    alone = _batchnorm_kernels("fp32", "shuffle")
    if CPU_CLASS == "none":     # no 4-channel blocks under AVX2 (ncsp_bnorm), nothing treated
        assert _batchnorm_kernels("amp", "shuffle") == alone, where()
        return
    assert [impl.split(":")[0] for impl, _ in alone] == ["bnorm_ref"] * 4, (
        "oneDNN no longer runs these BatchNorms on its reference kernel (%s): the treatment "
        "may no longer be needed %s" % (alone, where()))
    under_amp = _batchnorm_kernels("amp", "shuffle")
    assert [dtype for _, dtype in under_amp] == ["f32"] * 4, under_amp
    assert not any(impl.startswith("bnorm_ref") for impl, _ in under_amp), (under_amp, where())
    # O2 as well: its casts around these float32 layers fold, and the float32 BatchNorms get
    # the same treatment (folding after it handed them 4-channel blocks again: ShuffleNet V1)
    under_o2 = _batchnorm_kernels("o2", "shuffle")
    assert [dtype for _, dtype in under_o2] == ["f32"] * 4, under_o2
    assert not any(impl.startswith("bnorm_ref") for impl, _ in under_o2), (under_o2, where())


@pytest.mark.cpu_class
def test_o2_batchnorm_off_16_channel_blocks_trains_in_float32():
    """O2's BatchNorms take bfloat16 data. Under ``cast_model``, on the classes without AMX,
    one with 24 channels (off the blocks: its bfloat16 data is plain, which oneDNN trains on
    ``ncsp_bnorm``, GRID_SCRIPT's raw fact) gets float32 data in a training graph, straight
    from the convolution before it (24 filters: float32 there too, no round trip between);
    so does the 32-channel one after a convolution from those 24 channels (float32 by its
    input channels: its output is not rounded for the BatchNorm); the one after a 32 -> 32
    convolution gets bfloat16. On 'amx' all get bfloat16; on 'none', where the model
    computes in float32, all float32. The dtypes come from MXNet's type inference."""
    from mxnet.gluon import nn
    mx.random.seed(0)
    net = nn.HybridSequential()
    for cin, cout in ((16, 24), (24, 32), (32, 32)):
        net.add(nn.Conv2D(cout, 3, padding=1, in_channels=cin), nn.BatchNorm(in_channels=cout))
    net.initialize()
    nodes = trained_graph_nodes(net, (2, 16, 8, 8), o2=True)
    expected = {"native": ["float32", "float32", "bfloat16"],
                "emulated": ["float32", "float32", "bfloat16"],
                "amx": ["bfloat16"] * 3, "none": ["float32"] * 3}[CPU_CLASS]
    assert data_dtypes(nodes, "BatchNorm", O2_GRAPH_INPUT) == expected, where()
    first_bn = next(n for n in nodes if n["op"] == "BatchNorm")
    if CPU_CLASS in ("native", "emulated"):
        assert nodes[first_bn["inputs"][0][0]]["op"] == "Convolution", (first_bn, where())
