"""The treatment of whole graphs with depthwise convolutions (``mxamp.runtime.depthwise_graphs``).

The decision tests force the CPU class and the probe's timings: they check decisions only. The
graph tests force the treatment and check, by MXNet's own results, that each computes what it
says: the float32 treatment gives float32's numbers bit for bit, and steering changes only layouts.
"""
import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon import nn

from bf16_expect import BF16_KERNELS, CPU_CLASS, where
from mxamp import amp
from mxamp.backend import cpu, probe
from mxamp.backend.mxnet_private import BlockView
from mxamp.dtypes import name_of
from mxamp.lists import get_op_lists
from mxamp.precision.device_plan import device_plan
from mxamp.runtime import hooks
from mxamp.runtime.depthwise_graphs import (FLOAT32_BATCHNORM_AT_GROUPS, FLOAT32_GRAPH,
                                            STEER_BATCHNORM)
from mxamp.runtime.graph_edits import STEER_SUFFIX

ROOT = __file__.rsplit("/tests/", 1)[0]


@pytest.fixture
def timed_probe(monkeypatch, tmp_path):
    """The probe with timings this test chooses, a private cache, and a forced 'native' class."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in ("MXAMP_REPROBE", "MXAMP_PROBE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MXAMP_PROBE_CACHE", "0")      # each use() measures afresh
    monkeypatch.setattr(probe, "_kernels_here", lambda: (True, ""))
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="native",
                                                    amx_bf16=False))

    def use(depthwise_ratio):
        rows = [(probe.DEPTHWISE_ROW, 2.0, 2.0 / depthwise_ratio), ("gemm", 2.0, 1.0)]
        monkeypatch.setattr(probe, "measure", lambda repeats=3, low="bfloat16": list(rows))
        probe.forget()
    yield use
    probe.forget()
    amp.reset()


def test_each_request_gets_its_treatment_of_depthwise_graphs(timed_probe):
    """Checks decisions only (classes passed to device_plan; ``timed_probe`` forces 'native'
    and the probe's timings): AMX steers BatchNorm; the classes without AMX compute BatchNorm
    in float32 at grouped convolutions off 16-channel blocks; 'auto' keeps depthwise graphs
    in float32 where the probe's depthwise block measured bfloat16 slower; float32 plans need
    none."""
    lists = get_op_lists("bfloat16")
    assert device_plan("bfloat16", lists, "amx").depthwise_graphs == STEER_BATCHNORM
    for cls in ("native", "emulated"):
        assert device_plan("bfloat16", lists, cls).depthwise_graphs == \
            FLOAT32_BATCHNORM_AT_GROUPS, cls
    assert device_plan("bfloat16", lists, "none").depthwise_graphs == ""
    timed_probe(0.5)
    auto = device_plan("auto", lists, "native")
    assert auto.compute == "bfloat16" and auto.depthwise_graphs == FLOAT32_GRAPH, auto.describe()
    assert "depthwise" in auto.describe(), auto.describe()
    timed_probe(1.5)
    assert device_plan("auto", lists, "native").depthwise_graphs == FLOAT32_BATCHNORM_AT_GROUPS


def _mobile_block(seed=0, hybridize=True):
    """1x1 Convolution, BatchNorm, ReLU, depthwise 3x3, BatchNorm, ReLU, a classifier."""
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 1, in_channels=8, use_bias=False), nn.BatchNorm(in_channels=16),
            nn.Activation("relu"),
            nn.Conv2D(16, 3, padding=1, groups=16, in_channels=16, use_bias=False),
            nn.BatchNorm(in_channels=16), nn.Activation("relu"),
            nn.GlobalAvgPool2D(), nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    return net


def _step(net, recorded=None):
    """One forward and backward on a fixed batch: (output, first weight's gradient), float32.
    ``recorded``, a list, gets the ops autograd recorded (``autograd.get_symbol``)."""
    x = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (4, 8, 12, 12)))
    with autograd.record():
        out = net(x)
    if recorded is not None:
        recorded.extend(n["op"] for n in json.loads(autograd.get_symbol(out).tojson())["nodes"]
                        if n["op"] != "null")
    out.backward()
    grad = net[0].weight.grad()
    return [a.astype("float32").asnumpy() if a.dtype != np.float32 else a.asnumpy()
            for a in (out, grad)]


def _graph_nodes(net):
    return json.loads(BlockView(net).cached_graph[1].tojson(remove_amp_cast=False))["nodes"]


def _graph_ops(net):
    return [(n["op"], n["name"]) for n in _graph_nodes(net)]


def test_the_float32_treatment_computes_a_depthwise_graph_exactly_as_float32(monkeypatch):
    reference = _step(_mobile_block())
    amp.init("bfloat16")
    try:
        monkeypatch.setattr(hooks, "_depthwise_treatment", lambda block, args: FLOAT32_GRAPH)
        net = _mobile_block()
        got = _step(net)
        casts = [n for n in _graph_nodes(net) if n["op"] in ("amp_cast", "amp_multicast")]
    finally:
        amp.reset()
    low = [n["name"] for n in casts if n.get("attrs", {}).get("dtype", "float32") != "float32"]
    assert not low, "casts to low precision in a float32 graph: %s" % low
    for name, a, b in zip(("output", "gradient"), got, reference):
        assert np.array_equal(a, b), "%s differs from float32 by %g" % (
            name, np.abs(a - b).max())


@pytest.mark.cpu_class
def test_steering_adds_a_reshape_before_each_batchnorm_and_changes_no_math(monkeypatch):
    amp.init("bfloat16")
    try:
        plain = _step(_mobile_block())
        monkeypatch.setattr(hooks, "_depthwise_treatment", lambda block, args: STEER_BATCHNORM)
        net = _mobile_block()
        steered = _step(net)
        ops = _graph_ops(net)
        dense_only = nn.HybridSequential()
        dense_only.add(nn.Dense(4, in_units=8), nn.BatchNorm(in_channels=4))
        dense_only.initialize()
        dense_only.hybridize()
        dense_only(mx.nd.ones((2, 8)))
        untouched = [op for op, _ in _graph_ops(dense_only)]
    finally:
        amp.reset()
    batchnorms = [name for op, name in ops if op == "BatchNorm"]
    reshapes = [name for op, name in ops if op == "Reshape"]
    assert len(batchnorms) == 2, "the block's two BatchNorms are in its graph: %s" % ops
    assert reshapes == [b + STEER_SUFFIX for b in batchnorms], ops
    assert "Reshape" not in untouched, "a graph without depthwise convolutions is left alone"
    _assert_steering_changed_no_math(steered, plain)


def _assert_steering_changed_no_math(steered, plain):
    # A Reshape to the same shape changes layouts only; BatchNorm then runs another oneDNN
    # kernel, whose rounding can differ. Measured on a Zen 4 (2026-11-26), output / gradient,
    # hybridized and without hybridize() alike: 0.0 / 1.5e-4 relative with bfloat16 kernels
    # (default, AVX512_CORE_BF16, AVX512_CORE); 9.4e-8 / 3.5e-7 in float32 on class none
    # (capped to AVX2: about 3 float32 roundings of 2**-23). Each bound allows many roundings
    # more: bfloat16's 2**-8, float32's 2**-23.
    bound = 0.03 if BF16_KERNELS else 1e-5
    for name, a, b in zip(("output", "gradient"), steered, plain):
        rel = np.abs(a - b).max() / (np.abs(b).max() + 1e-12)
        assert rel <= bound, "%s: steered and plain differ by %.3g %s" % (name, rel, where())


def _imperative_run(monkeypatch, treatment, net):
    """``net`` trained one step without hybridize() under amp.init('bfloat16'), with the hook
    for blocks that run without hybridize() and ``treatment`` forced: (results, recorded ops)."""
    recorded = []
    amp.init("bfloat16")
    try:
        monkeypatch.setattr(hooks, "_depthwise_treatment", lambda block, args: treatment)
        hooks.hook_imperative_depthwise()
        return _step(net, recorded), recorded
    finally:
        amp.reset()
        monkeypatch.undo()


@pytest.mark.cpu_class
def test_without_hybridize_steering_reshapes_each_batchnorm_input_and_changes_no_math(
        monkeypatch):
    """Forced treatment; the expectation is this CPU's (its bfloat16 kernels): a model that
    runs without hybridize() gets a Reshape before each BatchNorm, as its graph would (AMX:
    2860 to 290-314 ms a step of MobileNet 1.0), and the same numbers as without it."""
    plain, plain_ops = _imperative_run(monkeypatch, "", _mobile_block(hybridize=False))
    steered, ops = _imperative_run(monkeypatch, STEER_BATCHNORM, _mobile_block(hybridize=False))
    assert "Reshape" not in plain_ops, plain_ops
    assert [b for a, b in zip(ops, ops[1:]) if a == "Reshape"] == ["BatchNorm"] * 2, ops
    assert [op for op in ops if op != "Reshape"] == plain_ops, (ops, plain_ops)
    _assert_steering_changed_no_math(steered, plain)
    dense_only = nn.Sequential()
    dense_only.add(nn.Dense(4, in_units=8), nn.BatchNorm(in_channels=4))
    dense_only.initialize()
    recorded = []
    amp.init("bfloat16")
    try:
        monkeypatch.setattr(hooks, "_depthwise_treatment", lambda block, args: STEER_BATCHNORM)
        hooks.hook_imperative_depthwise()
        with autograd.record():
            out = dense_only(mx.nd.ones((2, 8)))
        recorded = json.loads(autograd.get_symbol(out).tojson())["nodes"]
    finally:
        amp.reset()
    assert "Reshape" not in [n["op"] for n in recorded], "no depthwise layer: left alone"


def test_without_hybridize_the_float32_treatment_computes_exactly_as_float32(monkeypatch):
    """Forced treatment ('auto' where the probe's depthwise block measured bfloat16 slower):
    a model that runs without hybridize() computes float32's numbers bit for bit."""
    reference = _step(_mobile_block(hybridize=False))
    got, _ = _imperative_run(monkeypatch, FLOAT32_GRAPH, _mobile_block(hybridize=False))
    for name, a, b in zip(("output", "gradient"), got, reference):
        assert a.dtype == np.float32 and np.array_equal(a, b), "%s differs from float32" % name


def test_a_numpy_semantics_model_without_hybridize_is_steered(monkeypatch):
    """Forced treatment: under npx.set_np() the steered BatchNorm input is an mx.np array and
    gradients flow through it (the first weight's gradient is finite and not zero)."""
    mx.npx.set_np()
    try:
        net = _mobile_block(hybridize=False)
        amp.init("bfloat16")
        try:
            monkeypatch.setattr(hooks, "_depthwise_treatment",
                                lambda block, args: STEER_BATCHNORM)
            hooks.hook_imperative_depthwise()
            # float32 like the weights (mx.np.array keeps numpy's float64): on class none the
            # convolution computes in float32 and refuses a float64 input beside them
            x = mx.np.array(np.random.RandomState(1).uniform(-1, 1, (4, 8, 12, 12))
                            .astype(np.float32))
            with autograd.record():
                out = net(x)
            out.backward()
            grad = net[0].weight.grad().astype("float32").asnumpy()
        finally:
            amp.reset()
    finally:
        mx.npx.reset_np()
    assert isinstance(out, mx.np.ndarray) and np.isfinite(grad).all() and np.abs(grad).max() > 0


def test_amp_init_hooks_blocks_without_hybridize_only_where_its_plan_has_a_treatment(
        monkeypatch):
    """Checks decisions only (forced class): the hook is installed for class 'amx' (steering),
    not for 'native' (no treatment), and amp.reset removes it."""
    from mxamp.runtime.patches import is_replaced
    for forced, hooked in (("native", False), ("amx", True)):
        monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class=forced))
        amp.init("bfloat16")
        try:
            assert is_replaced(mx.gluon.Block, "__call__") == hooked, forced
        finally:
            amp.reset()
        assert not is_replaced(mx.gluon.Block, "__call__"), "amp.reset leaves the hook"


@pytest.mark.cpu_class
def test_import_remembers_block_shapes_where_amx_is_on():
    """Where AMX is on (this test's own reading of the flags and the environment), ``import
    mxamp`` records the shapes each hybridized block is built with, and ``amp.reset`` keeps
    them; convert_hybrid_block then reads them instead of guarding every 1x1 convolution."""
    code = textwrap.dedent("""
        import json
        import mxnet as mx
        import mxamp
        from mxamp import amp
        from mxamp.runtime import hooks
        net = mx.gluon.nn.Dense(2, in_units=4); net.initialize(); net.hybridize()
        net(mx.nd.ones((3, 4)))
        first = hooks.recorded_input_shapes(net)
        hooks.record_input_shapes(); amp.init('bfloat16'); amp.reset()
        other = mx.gluon.nn.Dense(2, in_units=4); other.initialize(); other.hybridize()
        other(mx.nd.ones((5, 4)))
        print("RESULT " + json.dumps([first, hooks.recorded_input_shapes(other)]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, after_reset = json.loads(
        [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
    assert first == ({"data": [3, 4]} if CPU_CLASS == "amx" else {}), (first, where())
    assert after_reset == {"data": [5, 4]}, "the recorder outlives amp.reset: %s" % after_reset


def test_cast_model_follows_the_treatment(timed_probe, monkeypatch):
    """Checks decisions only (forced class and probe timings): O2 leaves its treatment on the model
    for the block hook; under 'auto', a depthwise model the probe measured slower stays
    float32, and a model without depthwise convolutions is cast."""
    from mxamp.runtime.depthwise_graphs import TREATMENT_ATTR
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="amx"))
    steered = amp.cast_model(_mobile_block(), "bfloat16")
    assert steered.__dict__[TREATMENT_ATTR] == STEER_BATCHNORM
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="native",
                                                    amx_bf16=False))
    timed_probe(0.5)
    kept = amp.cast_model(_mobile_block(), "auto")
    assert kept[0].weight.dtype == np.float32, "a depthwise model stays float32 under 'auto'"
    dense = nn.HybridSequential()
    dense.add(nn.Dense(4, in_units=8))
    dense.initialize()
    assert name_of(amp.cast_model(dense, "auto")[0].weight.dtype) == "bfloat16"


@pytest.mark.cpu_class
@pytest.mark.skipif(not BF16_KERNELS, reason="the graph runs bfloat16 kernels; class 'none' "
                    "has none (tests/bf16_expect.py)")
def test_gluoncv_yolov3_training_graph_is_steered(monkeypatch):
    """The client that found the reference kernel, GluonCV's YOLOv3 with a MobileNet 1.0
    backbone, hybridizes its training forward (losses from the images and the targets in one
    graph); every BatchNorm of that graph is steered. The class is forced to ``amx`` for the
    decision, but the graph really runs in bfloat16, so it needs this CPU's bfloat16 kernels
    (on class none they fail: "could not create a primitive descriptor iterator")."""
    pytest.importorskip("gluoncv")   # an optional extra ('example'): absent, nothing to check
    from gluoncv.data.transforms.presets.yolo import YOLO3DefaultTrainTransform
    from gluoncv.model_zoo import get_model
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="amx"))
    net = get_model("yolo3_mobilenet1.0_voc", pretrained_base=False)
    net.initialize()
    image = mx.nd.array(np.random.RandomState(0).randint(0, 255, (128, 128, 3)), dtype="uint8")
    boxes = np.array([[10, 20, 100, 110, 3]], dtype="float32")
    sample = YOLO3DefaultTrainTransform(128, 128, net)(image, boxes)
    batch = [mx.nd.expand_dims(a, 0) for a in sample]
    net.hybridize()
    amp.init("bfloat16")
    try:
        with autograd.record():
            losses = net(batch[0], batch[6], *batch[1:6])
        autograd.backward(losses)
        mx.nd.waitall()   # a kernel's failure shows here, not in a later test
        ops = _graph_ops(net)
    finally:
        amp.reset()
    batchnorms = [name for op, name in ops if op == "BatchNorm"]
    reshapes = [name for op, name in ops if op == "Reshape" and name.endswith(STEER_SUFFIX)]
    # 47: the graph of GluonCV 0.10.5.post0 (setup.py's pin) at 128x128, counted on Zen 4
    assert len(batchnorms) == 47, "not YOLOv3's training graph: %d BatchNorms" % len(batchnorms)
    assert reshapes == [b + STEER_SUFFIX for b in batchnorms], (len(reshapes), len(batchnorms))
