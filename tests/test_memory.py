"""Memory, by counting: tests that fail when a change makes mxamp hold more bytes.

Nothing here is timed. Expectations are computed from the parameters' sizes and the dtypes'
widths (the accounting of issue #25), never read from mxamp:

* O2 with SGD momentum holds 2 + 2 + 4 + 4 = 12 B per low-precision parameter (weight,
  gradient, float32 master, float32 momentum), float32's 4 + 4 + 4; Adam adds 4 B;
* the float32 copies of low-precision gradients that the update and the finite check need
  live in one shared buffer of at most the largest parameter's size: MXNet's storage profiler
  (its ``Memory: cpu/0`` counter) sees a training step grow by no more than that;
* patching mode (``amp.init``) keeps no cast after the step: no cache entry and no live
  low-precision array.

The dtypes held are bfloat16 on every CPU class (on class 'none' O2 stores bfloat16 and
computes in float32), so these tests run everywhere; only the storage side is checked, but
for the patching-mode test's check that casts were made at all (``cpu_class``).
"""
import gc
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon import nn

from bf16_expect import BF16_KERNELS, LOW_NAME, where
from mxamp import amp, dtypes
from side_by_side import map_side_by_side
from storage_counter import GROWTH_SOURCE

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def nbytes(array):
    return array.size * BYTES[dtypes.name_of(array.dtype)]


def arrays_in(state):
    """The NDArrays an updater state holds, however it nests them."""
    if isinstance(state, mx.nd.NDArray):
        return [state]
    if isinstance(state, (list, tuple)):
        return [a for item in state for a in arrays_in(item)]
    return []


def mlp(width=256, depth=6):
    net = nn.HybridSequential()
    for _ in range(depth):
        net.add(nn.Dense(width, activation="relu"))
    net.add(nn.Dense(10))
    return net


def train_o2(optimizer, steps=2, width=256, depth=6, hybridize=True):
    """An O2 bfloat16 MLP after ``steps`` steps: (net, trainer, batch, loss_fn)."""
    mx.random.seed(3)
    net = mlp(width, depth)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(32, width))
    y = mx.nd.array(np.arange(32) % 10)
    amp.cast_model(net, "bfloat16", example_inputs=x)
    if hybridize:
        net.hybridize(static_alloc=True)
    args = {"learning_rate": 0.01, "momentum": 0.9} if optimizer == "sgd" else {}
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, args, kvstore=None)
    amp.init_trainer(trainer)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        one_step(net, trainer, x, y, loss_fn)
    return net, trainer, (x, y), loss_fn


def held_by(trainer, param):
    """A parameter's optimizer state (its float32 master included) and the bytes it holds
    with its weight and gradient."""
    state = arrays_in(trainer._updaters[0].states[trainer._param2idx[param.name]])
    return state, nbytes(param.data()) + nbytes(param.grad()) + sum(nbytes(a) for a in state)


def one_step(net, trainer, x, y, loss_fn):
    with autograd.record():
        loss = loss_fn(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    trainer.step(x.shape[0])
    mx.nd.waitall()


@pytest.mark.parametrize("optimizer, state_bytes", [("sgd", 4), ("adam", 8)])
def test_o2_holds_12_bytes_per_parameter_with_momentum(amp_off, optimizer, state_bytes):
    net, trainer, _, _ = train_o2(optimizer)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    low = [p for p in params if dtypes.name_of(p.data().dtype) == "bfloat16"]
    assert len(low) == len(params) == 14, "every Dense weight and bias is bfloat16 in O2"
    held = 0
    for param in params:
        assert dtypes.name_of(param.grad().dtype) == "bfloat16", param.name
        state, param_bytes = held_by(trainer, param)
        assert all(dtypes.name_of(a.dtype) == "float32" for a in state), param.name
        held += param_bytes
    count = sum(p.data().size for p in params)
    expected = (2 + 2 + 4 + state_bytes) * count
    assert held == expected, (
        "O2 with %s holds %d B for %d parameters; the accounting says %d B (%d B each)"
        % (optimizer, held, count, expected, 2 + 2 + 4 + state_bytes))


class ScaledEmbedding(nn.HybridBlock):
    """An embedding times a learned per-feature scale: ops with float16 CPU kernels, so that
    O2's float16 path (the GPU's target) runs here too."""

    def __init__(self, rows, width, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(rows, width)
            self.scale = self.params.get("scale", shape=(width,), init=mx.init.One())

    def hybrid_forward(self, F, x, scale):
        return F.broadcast_mul(self.embed(x), scale)


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_o2_holds_12_bytes_per_parameter_for_either_target(amp_off, target):
    """Issue #25's item 7: float16, the GPU's target, follows O2's design. Every parameter
    holds 12 B with SGD momentum, whatever dtype cast_model left it in (2 + 2 + 4 + 4 low, 4 +
    4 + 4 float32), and a low-precision parameter's state is a float32 master and momentum:
    for float16 MXNet's own multi-precision state, turned on by amp.init_trainer although the
    optimizer was made without it."""
    mx.random.seed(3)
    net = ScaledEmbedding(4096, 64)
    net.initialize(mx.init.Xavier())
    x = mx.nd.array(np.arange(64).reshape(8, 8))
    y = mx.nd.random.uniform(shape=(8, 8, 64))
    amp.cast_model(net, target, example_inputs=x)
    net.hybridize(static_alloc=True)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.01, "momentum": 0.9}, kvstore=None)
    amp.init_trainer(trainer)
    for _ in range(2):
        one_step(net, trainer, x, y, mx.gluon.loss.L2Loss())
    low, held, count = 0, 0, 0
    for param in net.collect_params().values():
        state, param_bytes = held_by(trainer, param)
        if dtypes.name_of(param.data().dtype) == target:
            low += 1
            assert dtypes.name_of(param.grad().dtype) == target, param.name
            assert [dtypes.name_of(a.dtype) for a in state] == ["float32", "float32"], (
                "%s: state %s, expected a float32 master and momentum"
                % (param.name, [dtypes.name_of(a.dtype) for a in state]))
        held += param_bytes
        count += param.data().size
    assert low >= 1, "cast_model left no %s parameter" % target
    assert held == 12 * count, "%s O2 holds %d B for %d parameters, not 12 B each" % (
        target, held, count)


def live_arrays():
    gc.collect()
    found = {}
    for obj in gc.get_objects():
        if isinstance(obj, mx.nd.NDArray) and obj.handle is not None:
            found[obj.handle.value] = obj
    return list(found.values())


def test_o2_keeps_no_second_float32_copy_of_a_weight(amp_off):
    """The master and the momentum are the only float32 arrays of a weight's shape, and the
    gradients' float32 copies share one buffer, no larger than the largest parameter."""
    net, _, _, _ = train_o2("sgd", width=192)
    weights = [p for p in net.collect_params().values() if p.name.endswith("weight")]
    shapes = {p.shape for p in weights}
    per_shape = {shape: sum(1 for p in weights if p.shape == shape) for shape in shapes}
    float32 = [a for a in live_arrays() if dtypes.name_of(a.dtype) == "float32"]
    for shape, count in per_shape.items():
        found = sum(1 for a in float32 if a.shape == shape)
        assert found == 2 * count, (
            "%d float32 arrays of shape %s are alive for %d bfloat16 weights; expected "
            "2 each (master, momentum)" % (found, shape, count))
    largest = max(p.data().size for p in net.collect_params().values())
    flat = [a for a in float32 if a.ndim == 1 and a.size > 192]   # biases are 192 long
    # Measured on the Zen 4 (native, emulated and none alike): one buffer of 36864 values,
    # the 192 x 192 weights' size; none would mean the gradients were not copied at all.
    assert len(flat) == 1 and flat[0].size <= largest, (
        "float32 scratch buffers %s; exactly one, of at most %d elements"
        % ([a.size for a in flat], largest))


def test_o2_float32_scratch_stays_at_4_mb_for_weights_larger_than_that(amp_off):
    """1100 x 1100 weights (4.8 MB in float32): their update and finite check go through the
    workspace a slice at a time, so it holds at most the documented 4 MB (1 M values), not
    the largest weight. The update itself is checked against MXNet's in
    test_multi_precision.py."""
    net, _, _, _ = train_o2("sgd", width=1100, depth=2)
    largest = max(p.data().size for p in net.collect_params().values())
    assert largest * 4 > 4 * 2 ** 20, "the model must have a weight larger than 4 MB"
    float32 = [a for a in live_arrays() if dtypes.name_of(a.dtype) == "float32"]
    flat = [a for a in float32 if a.ndim == 1 and a.size > 1100]   # biases are 1100 long
    assert len(flat) == 1 and flat[0].size * 4 <= 4 * 2 ** 20, (
        "float32 scratch buffers of %s values; one, of at most 4 MB"
        % [a.size for a in flat])


#: Run in a child process: MXNet's profiler can finish a trace only once per process.
STEP_STORAGE = GROWTH_SOURCE + r"""
import json, sys
import mxnet as mx
sys.path.insert(0, sys.argv[1])
import test_memory as t
from mxamp import amp
if sys.argv[2] == "amp.init":
    amp.init(target_dtype="bfloat16")
net, trainer, (x, y), loss_fn = t.train_o2("sgd", steps=int(sys.argv[3]))
values = storage_trace(lambda: t.one_step(net, trainer, x, y, loss_fn))
params = list(net.collect_params().values())
print(json.dumps({"peak": max(values), "end": values[-1], "batch": x.shape[0],
                  "largest": max(p.data().size for p in params),
                  "count": sum(p.data().size for p in params)}))
"""


def step_storage(how, steps_before):
    """What MXNet's storage counter saw during one O2 step after ``steps_before`` steps."""
    out = subprocess.run([sys.executable, "-c", STEP_STORAGE,
                          os.path.dirname(os.path.abspath(__file__)), how, str(steps_before)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_o2_step_allocates_at_most_one_float32_buffer():
    """A steady-state O2 step (forward, backward, finite check, update) grows MXNet's storage
    (its profiler's ``Memory: cpu/0`` counter: every allocation and free) by less than one
    float32 copy of the largest parameter, and frees all it allocates.

    Measured on the Zen 4 with this 6 x Dense(256) MLP, batch 32, three runs per class: the
    step peaks 31912 B above its start (native; 22752 or 31912 emulated, 22752 none) and ends
    at 0 B in all nine: the static graph keeps its activations, and the gradients' float32
    buffer, between steps. The bound, one float32 copy of the largest parameter (256 KB), is
    8x the measured peak; casting every gradient to float32 at once (mxamp before issue #25)
    peaked at 1.52 MB: 4 B x 397 k parameters."""
    row = step_storage("o2 only", steps_before=2)
    largest = row["largest"] * 4
    everything = row["count"] * 4
    assert row["peak"] <= largest < everything, (
        "an O2 step grew MXNet's storage by %.3f MB; one float32 copy of the largest "
        "parameter is %.2f MB (all gradients in float32: %.2f MB)"
        % (row["peak"] / 2**20, largest / 2**20, everything / 2**20))
    assert row["end"] == 0, "the step left %d B allocated" % row["end"]


def test_o2_under_amp_init_holds_no_copy_of_the_weights():
    """O2 as documented (amp.init, then cast_model): the first hybridized training step
    allocates what it allocates without amp.init. A graph variable that still declared
    float32 made MXNet hold a copy of every bfloat16 weight and of its gradient (measured on
    the Zen 4: 5.05 MB against 3.53 MB, twice this MLP's 0.76 MB of bfloat16 weights; +88 MB
    on a 23 M-parameter one). Now, three runs per class on the Zen 4: 3622224 B against
    3605840 (16 KB more; native, emulated), 6974880 B both (none). The slack, a quarter of
    the bfloat16 weights (194 KB), is 12x the measured 16 KB and an eighth of the bug's 1.5 MB."""
    alone, under_init = map_side_by_side(   # storage counts, not times
        lambda how: step_storage(how, steps_before=0),
        ["o2 only", "amp.init"])
    weights = alone["count"] * 2
    assert under_init["peak"] <= alone["peak"] + weights // 4, (
        "the first O2 step under amp.init grew MXNet's storage by %.2f MB, without it by "
        "%.2f MB (bfloat16 weights: %.2f MB)"
        % (under_init["peak"] / 2**20, alone["peak"] / 2**20, weights / 2**20))


@pytest.mark.cpu_class
def test_patching_mode_keeps_no_cast_after_the_step(amp_bf16):
    """Imperative training under amp.init: the casts of one recorded step are dropped when the
    step's record() scope ends, and no low-precision array outlives it. Inside the scope, where
    oneDNN has bfloat16 kernels (``bf16_expect``), casts are held and the output is bfloat16,
    so the emptiness after it is not for want of casting (class none casts nothing).
    Measured on the Zen 4: 10 casts per scope and bfloat16 outputs (native, emulated), 0 and
    float32 under the AVX2 cap (none)."""
    from mxamp.runtime.state import STATE
    mx.random.seed(5)
    net = mlp(64, 3)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(8, 64))
    y = mx.nd.array(np.arange(8) % 10)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                               kvstore=None)
    amp.init_trainer(trainer)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    in_scope = []
    for _ in range(2):
        with autograd.record():
            out = net(x)
            loss = loss_fn(out, y)
            in_scope.append((len(STATE.recording_casts) > 0, dtypes.name_of(out.dtype)))
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(8)
    mx.nd.waitall()
    del out, loss, scaled
    assert in_scope == [(BF16_KERNELS, LOW_NAME)] * 2, (
        "(casts held, output dtype) inside each record() scope: %s, %s" % (in_scope, where()))
    assert len(STATE.recording_casts) == 0, "cast-cache entries survived the step"
    low = [a for a in live_arrays() if dtypes.name_of(a.dtype) in ("bfloat16", "float16")]
    assert low == [], "%d low-precision arrays outlived the step: %s" % (
        len(low), sorted({a.shape for a in low}))


def depthwise_net():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.Conv2D(8, 3, padding=1, groups=8),
            nn.BatchNorm(), nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Dense(4))
    return net


@pytest.mark.parametrize("how", ["cast_model", "convert_hybrid_block", "init", "tune"])
def test_a_model_that_ran_an_inference_pass_converts(amp_off, how):
    """After a float32 inference pass oneDNN keeps some weights in its own blocked layout
    (depthwise convolutions); casting those to bfloat16 failed with "could not create a
    primitive descriptor for a reorder primitive". mxamp casts from a default-layout copy
    (conversion), or puts the weights back in MXNet's layout before a graph with casts is
    built (amp.init, and tune's trials, which failed that way in a forked process)."""
    mx.random.seed(7)
    net = depthwise_net()
    net.initialize()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3, 16, 16))
    net(x).wait_to_read()
    if how == "tune":   # the chosen policy is applied
        amp.tune(net, x, target_dtype="bfloat16", steps=1, report=None)
    if how == "init":
        amp.init("bfloat16")
    if how == "cast_model":
        amp.cast_model(net, "bfloat16")
    if how != "convert_hybrid_block":
        with autograd.record():
            out = net(x)
        out.backward()
    else:
        out = amp.convert_hybrid_block(net, "bfloat16")(x)
    mx.nd.waitall()
    assert out.shape == (2, 4) and np.isfinite(out.astype("float32").asnumpy()).all()


def test_o2_finds_deferred_shapes_without_a_forward_pass(amp_off):
    """cast_model(example_inputs=...) gives deferred parameters their shapes by shape
    inference: the example batch is never computed (a forward pass of it held its
    activations at cast_model's peak: +480 MB on ResNet-50 at batch 16), and the graph the
    inference built (float32 variables) is not kept."""
    net = depthwise_net()
    net.initialize()
    calls = []
    net[0].register_forward_hook(  # shape inference calls it too, with Symbols
        lambda block, inputs, output: calls.append(isinstance(inputs[0], mx.nd.NDArray)))
    x = mx.nd.random.uniform(shape=(2, 3, 16, 16))
    amp.cast_model(net, "bfloat16", example_inputs=x)
    # Measured on the Zen 4: calls == [False], the one Symbol pass of the shape inference;
    # an empty list would mean the hook never fired and proves nothing.
    assert calls and not any(calls), "the example batch ran through the model: %s" % calls
    assert all(p.data().shape[0] > 0 for p in net.collect_params().values())
    assert not net._cached_graph, "the float32 graph of the shape inference was kept"
    net.hybridize()
    with autograd.record():
        out = net(x)
    out.backward()
    # the Dense layer: the stem convolution (3 channels) keeps float32 weights where its
    # class trains it in float32 (tests/test_o2_layers.py)
    assert dtypes.name_of(net[5].weight.grad().dtype) == "bfloat16"


def test_each_thread_casts_into_its_own_workspace(amp_off):
    """Two threads training on one device must not cast into the same buffer: MXNet orders
    the ops of a buffer by the order they are queued, and threads interleave their queuing."""
    import threading
    from mxamp.runtime.casting import WORKSPACE
    held = {}

    def reserve(name):
        held[name] = WORKSPACE.reserve(mx.cpu(), 16)
    worker = threading.Thread(target=reserve, args=("worker",))
    worker.start()
    worker.join()
    reserve("main")
    assert held["main"] is not held["worker"]
    assert WORKSPACE.reserve(mx.cpu(), 8) is held["main"], "one buffer per thread, reused"
