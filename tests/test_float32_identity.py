"""Bit-identical float32 wherever nothing can run in low precision: training a small network and
GluonCV SSD's first step under each request (float16 on a CPU, bfloat16 where this CPU has no
bfloat16 kernel, 'auto' where it keeps float32) gives float32's arrays exactly; where low
precision does run, the drift stays within what rounding explains. Each run is a fresh
interpreter, since ``amp.init`` patches a process (split from ``test_devices.py``).
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bf16_expect import BF16_KERNELS, where
from side_by_side import map_side_by_side
from test_devices import NATIVE, ROOT

TRAIN = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon import nn
    mode, out = sys.argv[1], sys.argv[2]
    if mode != "fp32":
        from mxamp import amp
        amp.init(target_dtype=mode)
    mx.random.seed(1); np.random.seed(1)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("softrelu"),
            nn.MaxPool2D(2), nn.Dense(16, activation="relu"), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            update_on_kvstore=False)
    if mode != "fp32":
        amp.init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0)
    for step in range(5):
        x = mx.nd.array(rng.randn(8, 3, 8, 8)); y = mx.nd.array(rng.randint(0, 10, 8))
        with autograd.record():
            loss = loss_fn(net(x), y)
            if mode == "fp32":
                autograd.backward(loss)
            else:
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
        trainer.step(8)
    np.savez(out, **{k: v.data().astype("float32").asnumpy()
                     for k, v in net.collect_params().items()})
""")

SSD_STEP = textwrap.dedent("""
    import sys
    import numpy as np
    import mxnet as mx
    import gluoncv
    mode, out = sys.argv[1], sys.argv[2]
    if mode != "fp32":
        from mxamp import amp
        amp.init(target_dtype=mode)
    mx.random.seed(1); np.random.seed(1)
    net = gluoncv.model_zoo.get_model("ssd_512_mobilenet1.0_voc", pretrained=False,
                                      pretrained_base=False)
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(np.random.RandomState(0).randn(1, 3, 512, 512))
    with mx.autograd.record():
        cls, box, _ = net(x)
        loss = (cls * cls).mean() + (box * box).mean()
    loss.backward()
    np.savez(out, **{k: v.grad().asnumpy() for k, v in net.collect_params().items()
                     if v.grad_req != "null"})
""")

#: Requests under which nothing can run in low precision on this CPU.
FLOAT32_HERE = ["float16"] + (["bfloat16"] if not BF16_KERNELS else []) + \
    (["auto"] if not NATIVE else [])
MODES = ["float16", "bfloat16", "auto"]


def _arrays(script, mode, tmp_path):
    out = str(tmp_path / ("%s.npz" % mode))
    proc = subprocess.run([sys.executable, "-c", script, mode, out], capture_output=True,
                          text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, "%s run failed:\n%s" % (mode, proc.stderr[-3000:])
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def _fp32_and_runs(script, modes, tmp_path):
    """float32's arrays and each mode's. The runs that time nothing go side by side; 'auto'
    runs alone, since its probe times kernels."""
    untimed = ["fp32"] + [m for m in modes if m != "auto"]
    arrays = dict(zip(untimed, map_side_by_side(
        lambda mode: _arrays(script, mode, tmp_path), untimed)))
    if "auto" in modes:
        arrays["auto"] = _arrays(script, "auto", tmp_path)
    return arrays.pop("fp32"), {mode: arrays[mode] for mode in modes}


def _assert_identical_where_nothing_is_low(base, runs, what):
    for mode, arrays in runs.items():
        differ = sorted(k for k in base if not np.array_equal(base[k], arrays[k]))
        if mode in FLOAT32_HERE:
            assert not differ, "%s: amp.init(%r) %s computes in float32, yet %d of %d arrays " \
                "differ from plain float32: %s" % (what, mode, where(), len(differ), len(base),
                                                   differ[:5])
        else:
            assert differ, "%s: amp.init(%r) %s computes in bfloat16/float16, yet nothing " \
                "changed" % (what, mode, where())
            _assert_drift_is_rounding(base, arrays, "%s: %r" % (what, mode))


#: Arrays whose float32 RMS is below this carry no signal (a convolution bias before BatchNorm
#: has a true gradient of zero and stays ~1e-9): they are judged by absolute drift instead.
NEAR_ZERO_RMS = 1e-4
#: Norm-relative drift allowed per array, and for the model as a whole, after 5 steps in
#: bfloat16. Measured with this test's metric on real bfloat16 hardware: worst array
#: (batchnorm0_beta) 0.189-0.192 and model 0.0255 on an AMX Xeon (native, emulated and amx,
#: ../shared/hw-runs/2026-11-25-xeon-amx), 0.192 on an AMD EPYC Zen 4 (native, emulated).
#: The bounds leave ~30% (array) and ~2x (model) above the worst measured value. The
#: near-zero arrays (conv0_bias, conv1_bias) drift by an RMS of 8.4e-5 and 1.2e-4 on the Zen 4
#: (bfloat16 and 'auto' on native, bfloat16 on emulated; not measured on AMX): 2.5x that.
ARRAY_DRIFT, MODEL_DRIFT, ABSOLUTE_DRIFT = 0.25, 0.05, 3e-4


def _assert_drift_is_rounding(base, arrays, what):
    """bfloat16 moved the model by rounding-sized amounts: norm-relative per array and in all."""
    per_array, near_zero = {}, {}
    for k in base:
        b, a = base[k].astype(np.float64), arrays[k].astype(np.float64)
        rms = np.sqrt(np.mean(b * b)) if b.size else 0.0
        if rms < NEAR_ZERO_RMS:
            near_zero[k] = float(np.sqrt(np.mean((a - b) ** 2))) if b.size else 0.0
        else:
            per_array[k] = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    total = np.sqrt(sum(np.sum((arrays[k].astype(np.float64) - base[k]) ** 2) for k in base))
    total /= np.sqrt(sum(np.sum(base[k].astype(np.float64) ** 2) for k in base))
    worst = max(per_array, key=per_array.get)
    print("%s: model drift %.4f, worst array %s %.4f (norm-relative)" % (
        what, total, worst, per_array[worst]))
    assert per_array[worst] < ARRAY_DRIFT, "%s: %s drifted %.3f (norm-relative) from float32" % (
        what, worst, per_array[worst])
    assert total < MODEL_DRIFT, "%s: the model drifted %.3f (norm-relative) from float32" % (
        what, total)
    assert near_zero, "%s: no array stays ~0 in float32 (the conv biases before BatchNorm)" % what
    far = {k: v for k, v in near_zero.items() if v > ABSOLUTE_DRIFT}
    assert not far, "%s: arrays that stay ~0 in float32 moved by an RMS of %s" % (what, far)


@pytest.mark.cpu_class
def test_training_is_bit_identical_to_float32_where_nothing_is_low(tmp_path):
    """A hybridized (static_alloc) Conv-BN-Act(relu, softrelu)-Pool-Dense net, 5 SGD steps."""
    base, runs = _fp32_and_runs(TRAIN, MODES, tmp_path)
    _assert_identical_where_nothing_is_low(base, runs, "5 training steps")


@pytest.mark.cpu_class
def test_gluoncv_ssd_first_step_is_bit_identical_where_nothing_is_low(tmp_path):
    pytest.importorskip("gluoncv", reason="install the gluoncv extra: pip install -e '.[gluoncv]'")
    base, runs = _fp32_and_runs(SSD_STEP, FLOAT32_HERE, tmp_path)
    assert len(base) == 129, "ssd_512_mobilenet1.0_voc has 129 trainable parameters"
    _assert_identical_where_nothing_is_low(base, runs, "SSD first-step gradients")
