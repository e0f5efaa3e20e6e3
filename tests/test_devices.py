"""Every CPU class: the precision plans, the one warning, 'auto', and no crash for want of a
kernel (bit-identical float32 training wherever nothing can run in low precision:
``test_float32_identity.py``).

The plan table is checked for every (request, device) pair on any machine. The rest runs on
this machine and asserts what is right for its bfloat16 class (``bf16_expect``).
"""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import mxnet as mx
import numpy as np
import pytest

from bf16_expect import (AUTO_BY_CLASS, CPU_CLASS, HAS_AMX, LOW, NO_KERNELS_WARNING,
                         check_float32_casts, where)
from mxamp.precision import device_plan as devices
from mxamp.precision.device_plan import amx_idle_here, cpu_notice, device_plan, target_for
from mxamp import amp, dtypes
from mxamp.lists import get_op_lists


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16, F32 = dtypes.BFLOAT16, np.dtype(np.float32)
#: 'auto' computes in bfloat16 here (conftest.py turns the probe off: 'auto' follows the
#: documented class rule, worked out in bf16_expect; tests/test_probe.py covers the probe).
NATIVE = AUTO_BY_CLASS == "bfloat16"
#: The ops oneDNN has no bfloat16 kernel for on a class 'none' CPU, measured with
#: ci/probe_bf16_kernels.py (ci/probe_results_bfloat16_avx2.txt); every other class has them.
NO_KERNEL_ON_NONE = {"Convolution", "Deconvolution", "FullyConnected", "BatchNorm", "Pooling",
                     "Activation", "LeakyReLU", "_contrib_BatchNormWithReLU"}


# ------------------------------------------------------------------ the plan, any machine
@pytest.mark.parametrize("requested, device, compute", [
    ("float16", "gpu", "float16"), ("bfloat16", "gpu", "bfloat16"), ("auto", "gpu", "float16"),
    ("float16", "amx", "float32"), ("float16", "none", "float32"),
    ("bfloat16", "amx", "bfloat16"), ("bfloat16", "native", "bfloat16"),
    ("bfloat16", "emulated", "bfloat16"), ("bfloat16", "none", "float32"),
    ("auto", "amx", "bfloat16"), ("auto", "native", "bfloat16"),
    ("auto", "emulated", "float32"), ("auto", "none", "float32"),
])
def test_plan_table(requested, device, compute, monkeypatch):
    """Checks decisions only (class forced: each device is passed in, AMX idle patched off)."""
    monkeypatch.setattr(devices, "amx_idle_here", lambda device: False)  # any machine
    monkeypatch.setenv("MXAMP_PROBE", "0")                                # the class rule
    lists = get_op_lists(target_for(requested, device))
    plan = device_plan(requested, lists, device)
    assert plan.compute == compute, plan.describe()
    assert plan.low_precision == (compute != "float32")
    if compute == "float32":
        assert plan.reason and plan.reason in plan.summary(), "say why: %s" % plan.summary()
        assert lists.low_precision <= plan.fp32_ops, "no low-precision op may remain"
    if device == "none" and lists.target == "bfloat16":
        assert NO_KERNEL_ON_NONE | lists.missing_kernels("none") <= plan.fp32_ops, \
            "ops without kernels (measured, and mxamp's list): float32"
    if device == "emulated" and compute == "bfloat16":
        assert "slower than float32" in plan.summary(), "the speed claim must be true here"


def test_plan_rejects_unknown_devices_and_requests():
    with pytest.raises(ValueError, match="device must be 'gpu' or a CPU class"):
        device_plan("bfloat16", get_op_lists("bfloat16"), "tpu")
    with pytest.raises(ValueError, match="or 'auto'"):
        amp.precision_plan("int8")


def test_speed_claims_are_true_for_their_class(monkeypatch):
    """Checks decisions only: each class is named, and AMX hardware is forced on and off."""
    lists = get_op_lists("bfloat16")
    none = cpu_notice(device_plan("bfloat16", lists, "none"))
    emulated = cpu_notice(device_plan("bfloat16", lists, "emulated"))
    assert "nothing is faster than float32" in none and "SLOWER" not in none, none
    assert "SLOWER than float32" in emulated and "no bfloat16 kernels" not in emulated, emulated
    monkeypatch.setattr(devices, "amx_idle_here", lambda device: False)
    native = cpu_notice(device_plan("bfloat16", lists, "native"))
    assert native == "", "native computes bf16 in hardware: nothing to warn about: %s" % native
    monkeypatch.setattr(devices, "amx_idle_here", lambda device: device == "native")
    idle = cpu_notice(device_plan("bfloat16", lists, "native"))
    assert "WITHOUT AMX" in idle and "0.68-0.90x" in idle, "AMX hardware left off: %s" % idle
    on_amx = cpu_notice(device_plan("bfloat16", lists, "amx"))
    assert "AMX tiles (in effect" in on_amx and "BatchNorm backward" in on_amx, on_amx
    assert "amp.tune(net, batch)" in on_amx, "name the way out of the slow kernels: %s" % on_amx
    assert cpu_notice(device_plan("auto", lists, "none")) == "", "'auto' never warns"


def test_amx_cpu_with_amx_off_is_said_and_auto_keeps_float32(monkeypatch):
    """A Sapphire Rapids with AMX off (``MXAMP_AMX=0``) is class 'native', where bfloat16
    measured 0.68-0.90x float32: 'auto' computes in float32 and a bfloat16 request warns with
    the fix.
    Checks decisions only (the class and the AMX hardware are forced; the probe is off)."""
    from dataclasses import replace
    from mxamp.backend import cpu
    idle = replace(cpu.cpu_features(), bf16_class="native", amx_bf16=True, amx_enabled=False,
                   amx_in_effect=False, reason="turned off by MXAMP_AMX=0 (unset it to use AMX)")
    monkeypatch.setattr(cpu, "_CLASSIFIED", idle)
    monkeypatch.setenv("MXAMP_PROBE", "0")   # without a measurement, the class rule decides
    lists = get_op_lists("bfloat16")
    assert amx_idle_here("native")
    auto = device_plan("auto", lists, "native")
    assert auto.compute == "float32" and "MXAMP_AMX=0" in auto.reason, auto.describe()
    text = cpu_notice(device_plan("bfloat16", lists, "native"))
    assert "WITHOUT AMX" in text and "Unset MXAMP_AMX" in text and "0.68-0.90x" in text, text
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(idle, amx_bf16=False))
    assert device_plan("auto", lists, "native").compute == "bfloat16", "Zen 5-like native"
    assert cpu_notice(device_plan("bfloat16", lists, "native")) == ""


@pytest.mark.cpu_class
def test_precision_plan_here():
    plan = amp.precision_plan("bfloat16", mx.cpu())
    assert plan.device == CPU_CLASS and plan.compute == dtypes.name_of(LOW), plan.describe()
    auto = amp.precision_plan("auto", mx.cpu())
    assert auto.compute == ("bfloat16" if NATIVE else "float32"), auto.describe()
    assert amp.precision_plan("float16", mx.cpu()).compute == "float32"


# ------------------------------------------------------------------ amp.init on this CPU
@pytest.mark.cpu_class
def test_init_reports_the_plan_of_this_cpu(amp_bf16):
    state = amp.patch_state()
    assert state["cpu_class"] == CPU_CLASS and state["requested_dtype"] == "bfloat16"
    assert state["cpu_compute"] == dtypes.name_of(LOW), state["cpu_plan"]
    # on a CPU without bfloat16 kernels oneDNN lacks exactly these ops (NO_KERNEL_ON_NONE);
    # every class lacks a working kernel for those the data table FP32_ON_EVERY_CPU states
    from mxamp.lists.bfloat16 import FP32_ON_EVERY_CPU
    no_kernel = {o for o in NO_KERNEL_ON_NONE if not o.startswith("_")} \
        if CPU_CLASS == "none" else set()
    no_kernel |= {o for o in FP32_ON_EVERY_CPU if not o.startswith("_")}
    public = {o for o in state["cpu_fp32_ops"] if not o.startswith("_")}
    assert public == no_kernel, "float32 here for want of a kernel: %s" % sorted(public)


@pytest.mark.cpu_class
def test_init_auto(amp_off, caplog):
    with caplog.at_level("INFO", logger="mxamp"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            amp.init("auto")
    assert not [w for w in caught if "mxamp" in str(w.message)], "'auto' gives no warning"
    state = amp.patch_state()
    assert state["requested_dtype"] == "auto" and state["target_dtype"] == "bfloat16"
    assert state["cpu_compute"] == ("bfloat16" if NATIVE else "float32"), state["cpu_plan"]
    lines = [r.getMessage() for r in caplog.records if "target_dtype='auto'" in r.getMessage()]
    assert len(lines) == 1, "one log line says what 'auto' chose: %s" % lines
    y = mx.nd.FullyConnected(mx.nd.ones((2, 4)), mx.nd.ones((3, 4)), no_bias=True, num_hidden=3)
    assert y.dtype == (BF16 if NATIVE else F32), "'auto' computes %s" % state["cpu_compute"]
    with pytest.raises(RuntimeError, match="already called"):
        amp.init("bfloat16")
    assert amp.patch_state()["requested_dtype"] == "auto", "a refused init keeps the first"


def test_init_float16_keeps_every_op_fp32_on_a_cpu(amp_fp16):
    a = mx.np.ones((2, 3))
    out = mx.np.einsum("ij,kj->ik", a, a)
    assert out.dtype == F32, "einsum has a float16 CPU kernel, yet float16 is a GPU type"
    assert amp.patch_state()["cpu_compute"] == "float32"


# ------------------------------------------------------------------ no crash, any interface
def _rounded(shape, seed):
    rng = np.random.RandomState(seed)
    x = mx.nd.array(rng.uniform(-1, 1, shape).astype(np.float32))
    return mx.nd.amp_cast(mx.nd.amp_cast(x, dtype=BF16), dtype="float32")   # bf16-exact


KERNEL_CASES = {   # op -> (function, inputs); the ops oneDNN lacks on a 'none' CPU
    "Convolution": (lambda x, w: mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4,
                                                   no_bias=True), [(2, 3, 6, 6), (4, 3, 3, 3)]),
    "Deconvolution": (lambda x, w: mx.nd.Deconvolution(x, w, kernel=(3, 3), num_filter=4,
                                                       no_bias=True), [(2, 3, 6, 6), (3, 4, 3, 3)]),
    "FullyConnected": (lambda x, w: mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=5),
                       [(4, 8), (5, 8)]),
    "BatchNorm": (lambda x: mx.nd.BatchNorm(x, mx.nd.ones((3,)), mx.nd.zeros((3,)),
                                            mx.nd.zeros((3,)), mx.nd.ones((3,)),
                                            use_global_stats=True), [(2, 3, 4, 4)]),
    "_contrib_BatchNormWithReLU": (lambda x: mx.nd.contrib.BatchNormWithReLU(
        x, mx.nd.ones((3,)), mx.nd.zeros((3,)), mx.nd.zeros((3,)), mx.nd.ones((3,)),
        use_global_stats=True), [(2, 3, 4, 4)]),
    "Pooling": (lambda x: mx.nd.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max"),
                [(2, 3, 4, 4)]),
    "Activation": (lambda x: mx.nd.Activation(x, act_type="relu"), [(2, 3, 4, 4)]),
    "LeakyReLU": (lambda x: mx.nd.LeakyReLU(x, act_type="leaky", slope=0.1), [(2, 3, 4, 4)]),
}


@pytest.mark.cpu_class
@pytest.mark.parametrize("op", sorted(KERNEL_CASES))
def test_bf16_inputs_to_ops_without_kernels_do_not_crash(amp_bf16, op):
    fn, shapes = KERNEL_CASES[op]
    inputs = [_rounded(s, i) for i, s in enumerate(shapes)]
    with amp.disabled():
        want = fn(*inputs).asnumpy()
    out = fn(*[mx.nd.amp_cast(a, dtype=BF16) for a in inputs])   # explicitly bf16 tensors
    got = mx.nd.amp_cast(out, dtype="float32").asnumpy()
    assert op in NO_KERNEL_ON_NONE, "KERNEL_CASES holds the ops without a kernel on 'none'"
    if CPU_CLASS == "none":
        assert out.dtype == F32, "%s has no bf16 kernel %s: it must compute in float32" % (
            op, where())
        # float32 on the same (bf16-exact) values: measured bit-identical for every op (Zen 4
        # under the AVX2 cap)
        assert np.array_equal(got, want), "%s in float32 on bf16-exact inputs" % op
    else:
        assert out.dtype == BF16, "%s has a bf16 kernel %s: bf16 in, bf16 out" % (op, where())
        # measured at most 0.0030 (FullyConnected; Zen 4, native and emulated alike; not
        # measured on AMX); rounding the output to bfloat16 alone gives up to 2**-8; bound 2x that
        err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
        assert err < 2 ** -7, "%s on bf16 input is %g off float32 %s" % (op, err, where())


@pytest.mark.cpu_class
def test_bf16_symbols_and_numpy_interface_do_not_crash(amp_bf16, seed):
    class Block(mx.gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.conv = mx.gluon.nn.Conv2D(4, 3, in_channels=3)
                self.bn = mx.gluon.nn.BatchNorm(in_channels=4)

        def hybrid_forward(self, F, x):
            x = F.amp_cast(x, dtype=BF16)                     # a bf16 tensor in the graph
            y = F.Pooling(self.bn(self.conv(x)), kernel=(2, 2), stride=(2, 2), pool_type="avg")
            return F.Activation(y, act_type="relu")

    block = Block()
    block.initialize(mx.init.Xavier())
    block.hybridize(static_alloc=True)
    out = block(mx.nd.random.uniform(shape=(2, 3, 8, 8)))
    assert out.dtype == LOW and out.shape == (2, 4, 3, 3), "%s %s" % (out.dtype, where())
    check_float32_casts(out)
    assert np.isfinite(mx.nd.amp_cast(out, dtype="float32").asnumpy()).all()
    x = mx.nd.amp_cast(mx.nd.random.uniform(shape=(2, 3, 6, 6)), dtype=BF16).as_np_ndarray()
    y = mx.npx.activation(mx.npx.pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max"),
                          act_type="relu")
    assert y.dtype == LOW and isinstance(y, mx.np.ndarray), "%s %s" % (y.dtype, where())
    check_float32_casts(y)
    y.wait_to_read()


@pytest.mark.cpu_class
def test_one_warning_per_process_names_the_class():
    code = textwrap.dedent("""
        import json, warnings
        warnings.simplefilter("always")
        import mxnet as mx
        from mxamp import amp
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            amp.init("bfloat16")
            net = mx.gluon.nn.Dense(3, in_units=4); net.initialize(); net.hybridize()
            x = mx.nd.ones((2, 4)); net(x)
            amp.convert_hybrid_block(net, "bfloat16")
            amp.cast_model(net, "bfloat16")
            net(x).wait_to_read()
        print("RESULT " + json.dumps([str(w.message) for w in caught if "mxamp" in str(w.message)]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
    # what the notice must say on each class (the probe is off: conftest.py)
    if CPU_CLASS == "native" and not HAS_AMX:
        assert not found, "bfloat16 is native here: nothing to warn about, got %s" % found
        return
    assert len(found) == 1, "one warning per process %s, got %s" % (where(), found)
    if CPU_CLASS in ("none", "emulated"):
        assert "CPU class '%s'" % CPU_CLASS in found[0], found[0]
        if CPU_CLASS == "none":
            assert found[0].startswith(NO_KERNELS_WARNING), found[0]
    elif CPU_CLASS == "native":     # an AMX CPU whose AMX is off: say so, and how to turn it on
        assert "WITHOUT AMX" in found[0] and "Unset MXAMP_AMX" in found[0], found[0]
    else:
        assert found[0].startswith("mxamp: bfloat16 on AMX tiles"), found[0]


# ------------------------------------------------------------------ O2 and conversion, 'auto'
def _small_net():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    return net


@pytest.mark.cpu_class
def test_cast_model_auto_and_bfloat16_on_this_cpu(seed):
    x = mx.nd.random.uniform(shape=(2, 3, 6, 6))
    auto = _small_net()
    want = auto(x).asnumpy()
    amp.cast_model(auto, "auto")
    # the Dense layer's weight: the 3-channel stem convolution keeps float32 ones where its
    # class trains it in float32 (R_CONV_NOT_16, mxamp/lists/bfloat16.py; test_o2_layers.py)
    if NATIVE:
        assert dtypes.name_of(auto[3].weight.dtype) == "bfloat16"
    else:
        assert all(dtypes.name_of(p.dtype) == "float32" for p in auto.collect_params().values()), \
            "'auto' leaves the model float32 %s" % where()
        assert np.array_equal(auto(x).asnumpy(), want), "'auto' model must be float32's exactly"
    storage = _small_net()
    storage(x)
    amp.cast_model(storage, "bfloat16")
    assert dtypes.name_of(storage[3].weight.dtype) == "bfloat16", "bf16 storage on every class"
    out = storage(x)
    assert out.dtype == F32 and np.isfinite(out.asnumpy()).all()


@pytest.mark.cpu_class
def test_convert_hybrid_block_auto(seed):
    net = _small_net()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3, 6, 6))
    want = net(x).asnumpy()
    from mxamp.backend.graphs import cast_nodes
    lp = amp.convert_hybrid_block(net, "auto")
    out = lp(x).asnumpy()
    casts = cast_nodes(lp._cached_graph[1])
    assert bool(casts) == NATIVE, "'auto' converts only for a native-bf16 CPU (%s)" % where()
    if not NATIVE:
        assert np.array_equal(out, want), "'auto' on %s must give float32's outputs" % CPU_CLASS
