"""amp.init patching: the dtype each op family produces, on NDArray, Symbol, Gluon and mx.np
(amp.init's state and its weight-cast cache: ``test_patching_state.py``).

bfloat16's low-precision ops (FullyConnected, Convolution) return ``LOW``: bfloat16 where this
CPU has bfloat16 kernels, float32 where it has none (class 'none'). The other families are
checked on explicitly bfloat16 tensors, whose ops have kernels on every CPU.
"""
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from bf16_expect import BF16_KERNELS, LOW, check_float32_casts, where
from mxamp import amp
from mxamp.patching import patcher as patching
from mxamp.dtypes import BFLOAT16

BF16 = BFLOAT16
F16 = np.float16
F32 = np.float32

pytestmark = pytest.mark.cpu_class


def _nd(shape, dtype=None):
    arr = mx.nd.random.uniform(-1, 1, shape=shape)
    return arr if dtype is None else mx.nd.amp_cast(arr, dtype=dtype)


# --- NDArray, bfloat16 --------------------------------------------------------------------

def test_bf16_ndarray_op_families(amp_bf16, seed):
    x, w = _nd((4, 8)), _nd((6, 8))
    y = mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=6)
    assert y.dtype == LOW, "FullyConnected gives %s %s, got %s" % (LOW, where(), y.dtype)
    check_float32_casts(y)
    y = mx.nd.amp_cast(y, dtype=BF16)    # a bfloat16 tensor, whatever the class
    assert mx.nd.Flatten(y).dtype == BF16, "Flatten is dtype-neutral: bf16 in, bf16 out"
    assert mx.nd.Activation(y, act_type="relu").dtype == LOW, \
        "Activation (oneDNN) runs in bf16 where the class has its kernel %s" % where()
    # MXNet's generic bf16 kernels are slow (ci/probe_bf16_speed.py): float32, with a cast;
    # relu, sigmoid and tanh run as oneDNN's Activation instead
    assert mx.nd.relu(y).dtype == LOW, "the relu op runs as Activation %s" % where()
    assert (y * 2).dtype == F32, "scalar arithmetic computes in float32"
    assert mx.nd.softmax(y).dtype == F32, "softmax runs in float32"
    assert mx.nd.sum(y).dtype == F32, "reductions run in float32"
    assert mx.nd.concat(y, x[:, :6], dim=1).dtype == F32, "Concat takes the widest input type"
    assert mx.nd.concat(y, y, dim=1).dtype == BF16, "Concat of bf16 inputs stays bf16"
    assert (y + x[:, :6]).dtype == F32, "a + b with mixed types widens to float32"
    assert mx.nd.elemwise_add(y, y).dtype == BF16, "elemwise_add of bf16 inputs stays bf16"
    # NDArray's + is broadcast_add: MXNet's generic bf16 kernel, computed in float32 (speed)
    assert (y + y).dtype == F32, "a + b of NDArrays computes in float32"


def test_bf16_results_match_fp32(amp_bf16, seed):
    x, w, b = _nd((16, 32)), _nd((8, 32)), _nd((8,))
    got = mx.nd.FullyConnected(x, w, b, num_hidden=8)
    with amp.disabled():
        want = mx.nd.FullyConnected(x, w, b, num_hidden=8)
    assert want.dtype == F32, "ops inside amp.disabled() run in float32"
    got = check_float32_casts(got)
    if not BF16_KERNELS:
        assert np.array_equal(got, want.asnumpy()), "float32 compute %s gives float32's " \
            "results bit for bit" % where()
        return
    err = np.abs(got - want.asnumpy()).max()
    # measured 0.0147 (outputs up to 5.5; Zen 4, native and emulated alike): 3.4x margin
    assert err < 0.05, "bf16 FullyConnected should match fp32 to bf16 precision, max err %g" % err


def test_bf16_ops_without_bf16_cpu_kernel_still_work(amp_bf16, seed):
    y = mx.nd.FullyConnected(_nd((4, 8)), _nd((8, 8)), no_bias=True, num_hidden=8)
    assert y.dtype == LOW
    check_float32_casts(y)
    y = mx.nd.amp_cast(y, dtype=BF16)
    d = mx.nd.dot(y, y, transpose_b=True)
    assert d.dtype == F32, "bf16 dot has no CPU kernel: it runs in float32"
    ln = mx.nd.LayerNorm(y, mx.nd.ones((8,)), mx.nd.zeros((8,)))
    assert ln.dtype == F32, "LayerNorm has no bf16 CPU kernel: it runs in float32"
    dr = mx.nd.Dropout(y, p=0.5)
    assert dr.dtype == F32 and dr.shape == (4, 8), "Dropout (bfloat16 list: float32) on bf16 input"
    qkv = mx.nd.amp_cast(mx.nd.ones((5, 2, 3 * 8)), dtype=BF16)
    att = mx.nd.contrib.interleaved_matmul_selfatt_qk(qkv, heads=2).asnumpy()
    assert att.shape == (4, 5, 5), "interleaved attention matmul must accept bf16 input"
    assert np.allclose(att, 2.0), "q.k of all-ones heads of dim 4, scaled by 1/sqrt(4), is 2"


def test_bf16_no_input_ops_and_explicit_casts_untouched(amp_bf16):
    assert mx.nd.zeros((2, 3)).dtype == F32, "ops without inputs keep their own dtype"
    assert mx.nd.arange(5).dtype == F32
    assert mx.nd.random.uniform(shape=(3,)).dtype == F32
    assert mx.nd.ones((2,)).astype("float16").dtype == F16, "astype must do what it says"
    assert mx.nd.Cast(mx.nd.ones((2,)), dtype="float16").dtype == F16


def test_backward_through_casts(amp_bf16, seed):
    x, w = _nd((4, 8)), _nd((6, 8))
    w.attach_grad()
    with autograd.record():
        loss = mx.nd.sum(mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=6))
    loss.backward()
    assert w.grad.dtype == F32, "gradients of fp32 weights stay fp32"
    want = np.tile(x.asnumpy().sum(axis=0), (6, 1))
    if not BF16_KERNELS:
        assert np.array_equal(w.grad.asnumpy(), want), "float32 compute %s: the gradient " \
            "is float32's bit for bit" % where()
        return
    err = np.abs(w.grad.asnumpy() - want).max() / np.abs(want).max()
    # measured 2.3e-3 relative (Zen 4, native and emulated alike): 4x margin
    assert err < 1e-2, "gradient through amp_cast is wrong by %g (relative)" % err


# --- NDArray, float16 on a CPU ------------------------------------------------------------

def test_fp16_on_cpu_keeps_gemms_in_fp32_with_one_warning(amp_fp16, seed):
    x, w = _nd((4, 8)), _nd((6, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y1 = mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=6)
        y2 = mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=6)
    assert y1.dtype == F32 and y2.dtype == F32, "no fp16 GEMM on CPU: FullyConnected stays fp32"
    msgs = [str(c.message) for c in caught if "FullyConnected" in str(c.message)]
    assert len(msgs) == 1, "the CPU fallback warns once per op, got %d: %s" % (len(msgs), msgs)


def test_fp16_casts_and_elementwise_on_cpu(amp_fp16, seed):
    h = _nd((4, 8), F16)
    x = _nd((4, 8))
    assert h.dtype == F16
    assert mx.nd.relu(h).dtype == F16, "relu keeps fp16"
    assert mx.nd.softmax(h).dtype == F32, "softmax of fp16 input runs in float32"
    assert mx.nd.log_softmax(h).dtype == F32
    assert (h + x).dtype == F32, "fp16 + fp32 widens to fp32"
    assert mx.nd.concat(h, h).dtype == F16
    assert mx.nd.add_n(h, x).dtype == F32, "add_n takes the widest input type"


def test_fp16_conditional_fp32_activation(amp_fp16):
    h = _nd((4, 8), F16)
    assert mx.nd.Activation(h, act_type="softrelu").dtype == F32, "softrelu runs in fp32"
    assert mx.nd.Activation(h, act_type="relu").dtype == F16, "relu stays in fp16"


# --- Symbols and the Module API -----------------------------------------------------------

def _internals(sym):
    return sym.get_internals().list_outputs()


def test_symbol_graph_has_memoized_casts(amp_bf16):
    data = mx.sym.var("data")
    net = mx.sym.FullyConnected(data, num_hidden=6, name="fc1")
    net = mx.sym.Activation(net, act_type="relu", name="act")
    a = mx.sym.softmax(net, name="sm1")
    b = mx.sym.log_softmax(net, name="sm2")
    outs = _internals(mx.sym.Group([a, b]))
    casts = [o for o in outs if "amp_cast" in o]
    if BF16_KERNELS:
        # data, fc1_weight, fc1_bias to bf16; act's output to fp32 ONCE for both softmaxes
        assert len(casts) == 4, "expected 4 casts (3 inputs + 1 shared), got %s" % casts
    else:
        assert not casts, "nothing is low precision %s: the graph needs no cast, got %s" % (
            where(), casts)
    # a bfloat16 variable feeding two float32 ops is cast once, on every class
    typed = mx.sym.var("typed", dtype=BF16)
    act = mx.sym.Activation(typed, act_type="relu", name="act2")
    outs = _internals(mx.sym.Group([mx.sym.softmax(act), mx.sym.log_softmax(act)]))
    casts = [o for o in outs if "amp_cast" in o]
    assert len(casts) == 1, "one shared float32 cast of the bf16 path, got %s" % casts


def test_symbol_module_api_keeps_fp32_params(amp_bf16, seed):
    data = mx.sym.var("data")
    net = mx.sym.FullyConnected(data, num_hidden=6, name="fc1")
    net = mx.sym.softmax(net)
    exe = net.simple_bind(mx.cpu(), data=(4, 8))
    assert exe.arg_dict["fc1_weight"].dtype == F32, "parameters stay fp32; casts are in the graph"
    exe.arg_dict["fc1_weight"][:] = mx.nd.random.uniform(shape=(6, 8))
    exe.forward(data=_nd((4, 8)))
    out = exe.outputs[0]
    # softmax rows sum to 1 within float32 rounding: measured 1.2e-7 on every class (Zen 4)
    assert out.dtype == F32 and np.allclose(out.sum(axis=1).asnumpy(), 1, rtol=0, atol=1e-6)


# --- Hybridized Gluon ---------------------------------------------------------------------

class ResBlock(gluon.HybridBlock):
    def __init__(self, channels, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv1 = gluon.nn.Conv2D(channels, 3, padding=1, use_bias=False)
            self.bn1 = gluon.nn.BatchNorm()
            self.conv2 = gluon.nn.Conv2D(channels, 3, padding=1, use_bias=False)
            self.bn2 = gluon.nn.BatchNorm()

    def hybrid_forward(self, F, x):
        # Activation, as Gluon's layers call it: oneDNN's bf16 kernel (F.relu is MXNet's
        # generic one, which computes in float32 for speed: a cast each side)
        y = F.Activation(self.bn1(self.conv1(x)), act_type="relu")
        y = self.bn2(self.conv2(y))
        return F.Activation(x + y, act_type="relu")


def _resnet_like(classes=10):
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(8, 3, padding=1, use_bias=False), gluon.nn.BatchNorm(),
                gluon.nn.Activation("relu"), ResBlock(8), ResBlock(8),
                gluon.nn.GlobalAvgPool2D(), gluon.nn.Flatten(), gluon.nn.Dense(classes))
    return net


def _cast_nodes(sym):
    """(name, dtype attribute) of every amp_cast / amp_multicast node in a graph."""
    import json
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    return [(n["name"], n.get("attrs", {}).get("dtype")) for n in nodes
            if n["op"] in ("amp_cast", "amp_multicast")]


def test_hybridized_resnet_block_has_no_cast_ping_pong(amp_bf16, seed):
    net = _resnet_like()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    out = net(_nd((2, 3, 16, 16)))
    assert out.dtype == LOW, "the last Dense runs in %s %s" % (LOW, where())
    check_float32_casts(out)
    casts = _cast_nodes(net._cached_graph[1])
    if not BF16_KERNELS:
        assert not casts, "float32 compute %s: the graph must have no cast, got %s" % (where(),
                                                                                     casts)
        return
    to_fp32 = [c for c in casts if c[1] == "float32"]
    assert not to_fp32, "no fp32 cast between bf16 layers, found %s" % to_fp32
    # one cast for the input, one per conv weight (5) and for the dense weight and bias
    assert len(casts) == 1 + 5 + 2, "expected 8 casts (input + 7 parameters), got %s" % casts


def test_init_after_hybridized_block_ran_rebuilds_graph(amp_off, seed):
    net = _resnet_like()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = _nd((2, 3, 16, 16))
    assert net(x).dtype == F32
    before = net._cached_graph
    amp.init(target_dtype="bfloat16")
    assert net(x).dtype == LOW, "a block hybridized before amp.init must rebuild with casts"
    assert net._cached_graph and net._cached_graph is not before, \
        "the block must rebuild its graph at its first call after amp.init"
    after = net._cached_graph
    net(x)
    assert net._cached_graph is after, "one rebuild only, not one per call"
    patching.reset()
    net(x)
    assert net._cached_graph is not after, "after reset the block rebuilds without AMP's casts"


def test_hybridized_block_with_no_input_ops_and_concat(amp_bf16, seed):
    class Head(gluon.HybridBlock):   # what YOLOv3/SSD heads do: zeros, arange, concat
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.dense = gluon.nn.Dense(4, flatten=False)

        def hybrid_forward(self, F, x):
            y = self.dense(x)                                     # bf16
            offsets = F.arange(4).reshape((1, 4))                 # fp32, no inputs
            noise = F.random.uniform(shape=(1, 4))
            pad = F.zeros(shape=(1, 4))
            return F.concat(y, F.broadcast_add(offsets, noise + pad), dim=0)

    head = Head()
    head.initialize()
    head.hybridize()
    out = head(_nd((3, 5)))
    assert out.shape == (4, 4) and out.dtype == F32, "mixed-type Concat must widen, got %s" % out.dtype


def test_bf16_conv_bn_dense_trains(amp_bf16, seed):
    net = _resnet_like(classes=4)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = _nd((16, 3, 8, 8))
    y = mx.nd.array(np.arange(16) % 4)
    losses = []
    for _ in range(20):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
        losses.append(float(loss.mean().asscalar()))
    assert np.isfinite(losses).all(), "losses must stay finite: %s" % losses
    # measured last/first 0.439 (Zen 4, native and emulated), 0.436 (none, float32 compute);
    # a model that does not learn stays near 1
    assert losses[-1] < 0.5 * losses[0], "loss must fall in 20 bf16 steps: %s" % losses


# --- numpy interface ----------------------------------------------------------------------

def test_numpy_interface(amp_bf16, seed):
    a = mx.np.random.uniform(size=(4, 8))
    w = mx.np.random.uniform(size=(6, 8))
    y = mx.npx.fully_connected(a, w, no_bias=True, num_hidden=6)
    assert y.dtype == LOW, "npx.fully_connected runs in %s %s" % (LOW, where())
    check_float32_casts(y)
    assert isinstance(y, mx.np.ndarray), "casts keep the numpy array type"
    from mxamp.runtime.casting import cast_ndarray
    y = cast_ndarray(y, "bfloat16")                 # a bf16 numpy array on every class
    assert mx.npx.activation(y, act_type="relu").dtype == LOW, where()
    assert mx.npx.relu(y).dtype == LOW, "npx.relu runs as npx.activation %s" % where()
    assert mx.np.exp(y).dtype == F32, "exp runs in float32"
    assert (y + a[:, :6]).dtype == F32, "np add widens mixed inputs"
    assert mx.np.matmul(a, w.T).dtype == F32, "np.matmul has no bf16 CPU kernel"


def test_numpy_hybridized_block(amp_bf16, seed):
    mx.npx.set_np()
    try:
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
        net.initialize()
        net.hybridize()
        out = net(mx.np.random.uniform(size=(4, 5)))
        assert out.shape == (4, 3) and out.dtype == LOW, \
            "numpy Gluon Dense runs in %s %s" % (LOW, where())
    finally:
        mx.npx.reset_np()



def test_fp16_hybridized_widest_runs_on_cpu(amp_fp16, seed):
    class Mix(gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            half = F.amp_cast(x, dtype="float16")
            prod = F.concat(F.broadcast_mul(half, x), x, dim=1)
            return F.concat(half, F.relu(x), dim=1) + prod

    block = Mix()
    block.hybridize()
    x = _nd((2, 3))
    out = block(x)
    got = out.asnumpy()
    assert out.dtype == F32 and got.shape == (2, 6), "widest of fp16 and fp32 is fp32"
    v = x.asnumpy()
    expected = np.concatenate([v + v * v, np.maximum(v, 0) + v], axis=1)
    # measured 3.3e-4 on every class (Zen 4; float16 rounds values up to 2 to 9.8e-4): 3x margin
    assert np.allclose(got, expected, rtol=0, atol=1e-3), \
        "float16 widest ops on CPU must compute right"


def test_fp16_families_on_symbol_numpy_and_gluon(amp_fp16, seed):
    # numpy interface: fp16 arrays made by hand
    h = mx.np.array(np.linspace(-1, 1, 8).reshape(2, 4), dtype="float16")
    assert mx.npx.relu(h).dtype == F16, "npx.relu keeps fp16"
    assert mx.np.exp(h).dtype == F32, "np.exp of fp16 runs in fp32"
    assert (h + mx.np.ones((2, 4))).dtype == F32, "np add of fp16 and fp32 widens"
    # symbols: an fp16 variable feeding an fp32 op gets exactly one cast
    x = mx.sym.var("x", dtype="float16")
    out = mx.sym.Group([mx.sym.softmax(x), mx.sym.log_softmax(x), mx.sym.relu(x)])
    casts = _cast_nodes(out)
    assert casts == [(casts[0][0], "float32")], "one shared fp32 cast of x, got %s" % casts
    # hybridized Gluon on a CPU without a GPU: Dense stays fp32 and the output is right
    net = gluon.nn.Dense(3, in_units=4)
    net.initialize(mx.init.Xavier())
    data = _nd((2, 4))
    with amp.disabled():
        want = net(data).asnumpy()
    net.hybridize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = net(data)
    assert got.dtype == F32 and np.array_equal(got.asnumpy(), want), \
        "fp16 Dense on a CPU must run (in fp32) and give fp32's results bit for bit"
