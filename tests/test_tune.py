"""amp.tune: per-model choice of precision. Decisions are tested with injected timings (no luck
involved) on any CPU; a real tune runs on this machine's class and must leave the model's
numbers untouched and keep float32 where nothing is faster.

The tests with injected timings and a forced class check decisions only; those that really tune
carry the ``cpu_class`` marker. The trials' own processes: ``test_tune_trials.py``."""
import io
import json
import time
from dataclasses import replace

import mxnet as mx
import numpy as np
import pytest

from mxamp import amp, dtypes, tuning as tune_mod
from mxamp.backend import cpu
from bf16_expect import BF16_KERNELS
from test_conditions import _graph_casts


def _mobile_like():
    """A stem convolution (3 input channels), a depthwise and a pointwise one, BatchNorm."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(16, 3, padding=1, in_channels=3), mx.gluon.nn.BatchNorm(),
            mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Conv2D(16, 3, padding=1, groups=16, in_channels=16),
            mx.gluon.nn.Conv2D(32, 1, in_channels=16), mx.gluon.nn.GlobalAvgPool2D(),
            mx.gluon.nn.Dense(10, in_units=32))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def example_batch():
    """The models' input: the same 4x3x16x16 values at every call (made here, not at import)."""
    return mx.nd.array(np.random.RandomState(0).rand(4, 3, 16, 16))


@pytest.fixture
def native_with(monkeypatch):
    """Force class 'native' and inject step times per policy name (nothing runs in bf16).
    Trials run in this process, so the injected timer sees each policy it is asked for."""
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="native",
                                                    amx_bf16=False))
    monkeypatch.setenv("MXAMP_PROBE", "0")
    monkeypatch.setenv("MXAMP_TUNE_FORK", "0")
    timed = []

    def inject(ms_by_name):
        def fake(policy, step, steps, profile, **_):
            timed.append(policy.name)
            return ms_by_name[policy.name], [["Convolution", 1.0]]
        monkeypatch.setattr(tune_mod, "_time_policy", fake)
    yield inject, timed
    amp.reset()


def test_candidates_follow_the_model():
    names = [p.name for p in tune_mod.candidates(_mobile_like(), example_batch(), "bfloat16")]
    assert names == ["float32", "bfloat16", "bfloat16, stem in float32",
                     "bfloat16, depthwise in float32", "bfloat16, stem+depthwise in float32",
                     "bfloat16, BatchNorm in float32"], names
    plain = mx.gluon.nn.HybridSequential()
    plain.add(mx.gluon.nn.Dense(8, in_units=4))
    plain.initialize()
    assert [p.name for p in tune_mod.candidates(plain, mx.nd.ones((2, 4)), "bfloat16")] == [
        "float32", "bfloat16"], "a model without convolutions or BatchNorm has two candidates"


def test_fastest_policy_wins_and_is_applied(native_with):
    """Checks decisions only (forced class native, injected timings)."""
    inject, timed = native_with
    inject({"float32": 100.0, "bfloat16": 95.0, "bfloat16, stem in float32": 80.0,
            "bfloat16, depthwise in float32": 90.0, "bfloat16, stem+depthwise in float32": 85.0,
            "bfloat16, BatchNorm in float32": 120.0})
    out = io.StringIO()
    policy = amp.tune(_mobile_like(), example_batch(), report=out)
    assert policy.name == "bfloat16, stem in float32", out.getvalue()
    assert timed == ["float32", "bfloat16", "bfloat16, stem in float32",
                     "bfloat16, depthwise in float32", "bfloat16, stem+depthwise in float32"], (
        "BatchNorm is not among bfloat16's costliest ops (injected: Convolution only), so its "
        "variant is not timed: %s" % timed)
    assert "<= chosen" in out.getvalue() and "1.25x" in out.getvalue(), out.getvalue()
    assert amp.is_initialized() and amp.target_dtype() == "bfloat16", "the policy is applied"
    got, why = amp.precision_of("Convolution", data_shape=(4, 3, 16, 16), kernel=(3, 3))
    assert got == "float32", "the stem runs in float32 under the tuned policy: %s" % why
    got, _ = amp.precision_of("Convolution", data_shape=(4, 16, 16, 16), kernel=(1, 1))
    assert got == "bfloat16", "other convolutions keep bfloat16"


def test_variants_that_cannot_win_are_not_timed(native_with, monkeypatch):
    """Checks decisions only (forced class native, injected timings). BatchNorm in float32 is
    timed where BatchNorm is among bfloat16's costliest ops (the AMX slow path);
    stem+depthwise only where each alone beat bfloat16."""
    times = {"float32": 100.0, "bfloat16": 300.0, "bfloat16, stem in float32": 310.0,
             "bfloat16, depthwise in float32": 250.0,
             "bfloat16, stem+depthwise in float32": 240.0, "bfloat16, BatchNorm in float32": 90.0}
    timed = []

    def fake(policy, step, steps, profile, **_):
        timed.append(policy.name)
        top = [["_backward_BatchNorm", 200.0]] if policy.name == "bfloat16" else []
        return times[policy.name], top
    monkeypatch.setattr(tune_mod, "_time_policy", fake)
    policy = amp.tune(_mobile_like(), example_batch(), report=None)
    assert policy.name == "bfloat16, BatchNorm in float32", policy.table
    assert "bfloat16, stem+depthwise in float32" not in timed, "the stem alone did not help"
    assert "bfloat16, BatchNorm in float32" in timed


def test_nothing_faster_keeps_float32(native_with):
    """Checks decisions only (forced class native, injected timings)."""
    inject, _ = native_with
    inject({"float32": 100.0, "bfloat16": 101.0, "bfloat16, stem in float32": 99.5,
            "bfloat16, depthwise in float32": 140.0, "bfloat16, stem+depthwise in float32": 130.0,
            "bfloat16, BatchNorm in float32": 150.0})
    policy = amp.tune(_mobile_like(), example_batch(), report=None)
    assert policy.name == "float32" and policy.target == "float32", (
        "0.5% faster is noise (MIN_GAIN %.2f): float32 stays" % tune_mod.MIN_GAIN)
    assert not amp.is_initialized(), "a float32 policy leaves AMP off"
    assert policy.init_kwargs() == {}


def test_policy_is_data_saved_explained_and_passed_to_init_and_convert(native_with, tmp_path):
    """Checks decisions only (forced class native, injected timings)."""
    inject, _ = native_with
    inject({"float32": 100.0, "bfloat16": 96.0, "bfloat16, stem in float32": 95.0,
            "bfloat16, depthwise in float32": 92.0, "bfloat16, stem+depthwise in float32": 70.0,
            "bfloat16, BatchNorm in float32": 99.0})
    net = _mobile_like()
    policy = amp.tune(net, example_batch(), report=None, apply=False)
    assert policy.name == "bfloat16, stem+depthwise in float32" and not amp.is_initialized()
    path = str(tmp_path / "policy.json")
    policy.save(path)
    loaded = amp.Policy.load(path)
    assert loaded == policy, "a saved policy loads back equal"
    assert json.load(open(path))["conditional_fp32_ops"] == [
        ["Convolution", "conv_kind", ["stem", "depthwise"]]]
    text = loaded.explain()
    assert "Convolution in float32 where conv_kind is stem or depthwise" in text, text
    amp.init(**loaded.init_kwargs())
    assert amp.precision_of("Convolution", data_shape=(4, 16, 8, 8), kernel=(3, 3),
                            num_group=16)[0] == "float32", "depthwise in float32"
    assert amp.precision_of("Convolution", data_shape=(4, 16, 8, 8), kernel=(1, 1))[0] == \
        "bfloat16", "pointwise in bfloat16"
    amp.reset()
    # the same lists convert the model (its graph is checked; bfloat16 is not run here)
    lp = amp.convert_hybrid_block(net, example_inputs=example_batch(), **loaded.convert_kwargs())
    casts = _graph_casts(lp(mx.sym.var("data")))
    convs = [n for n in casts if "conv" in n and n.endswith("fwd")]  # graph order
    assert [casts[c] for c in convs] == ["float32", "float32", "bfloat16"], (
        "stem and depthwise in float32, pointwise in bfloat16: %s" % casts)


@pytest.mark.cpu_class
def test_real_tune_on_this_machine_leaves_the_model_untouched(amp_off):
    net = _mobile_like()
    x, y = example_batch(), mx.nd.array([0, 1, 2, 3])
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    net(x)
    params = net.collect_params()
    with mx.autograd.record():    # one parameter holds a gradient, the others zeros
        first = list(params.values())[0]
        mx.autograd.backward(first.data().sum() * 3)
    before = {k: v.data().asnumpy().copy() for k, v in params.items()}
    grads = {k: v.grad().asnumpy().copy() for k, v in params.items() if v.grad_req != "null"}
    assert np.all(grads[first.name] == 3) and not any(g.any() for k, g in grads.items()
                                                       if k != first.name)
    out = io.StringIO()
    policy = amp.tune(net, x, loss_fn=lambda o: loss(o, y), report=out)
    after = {k: v.data().asnumpy() for k, v in params.items()}
    assert all(np.array_equal(before[k], after[k]) for k in before), (
        "tuning ran forward/backward passes but must restore weights and BatchNorm statistics")
    assert all(np.array_equal(grads[k], params[k].grad().asnumpy()) for k in grads), (
        "tuning must give back every gradient as it found it (zero or not)")
    rows = policy.table
    assert rows[0]["name"] == "float32" and all(r["ms"] > 0 for r in rows), rows
    assert sum(1 for r in rows if r.get("chosen")) == 1
    assert all(len(r["top_ops"]) == 5 for r in rows), "each row names the 5 costliest ops"
    print(out.getvalue())
    _check_choice(policy, rows, out.getvalue())


def _check_choice(policy, rows, report):
    """The choice a real tune made, from the table's own timings and README's rule: the fastest
    policy where it beats float32 by at least 2%, else float32; applied (amp.init) unless
    float32. Where bfloat16 computes comes from tests/bf16_expect.py."""
    chosen = next(r for r in rows if r.get("chosen"))
    if not BF16_KERNELS:
        assert policy.name == "float32", "on class 'none' nothing computes in bfloat16"
        assert [r["name"] for r in rows] == ["float32"], (
            "where nothing computes in bfloat16 only float32 is timed (every candidate would be "
            "the same float32 computation): %s" % rows)
        assert "nothing computes in bfloat16 here" in report, report
        assert not amp.is_initialized()
        return
    assert len(rows) > 1, "bfloat16 computes here: candidates beside float32 are timed"
    fastest = min(rows, key=lambda r: r["ms"])
    # the ratio as the table states it (3 decimals), so that a row the table shows at 1.020x
    # counts as 2% faster
    gain = round(rows[0]["ms"] / fastest["ms"], 3)
    if gain >= 1.02:
        assert chosen["ms"] == fastest["ms"] and policy.name == chosen["name"], (
            "the fastest policy (%.3fx float32) must be chosen: %s" % (gain, rows))
    else:
        assert chosen is rows[0] and policy.name == "float32", (
            "nothing beat float32 by 2%% (best %.3fx): float32 stays: %s" % (gain, rows))
    assert amp.is_initialized() == (policy.target != "float32"), "tune applies what it chose"


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(TypeError, match="tune needs a gluon Block"):
        amp.tune("resnet", example_batch())
    with pytest.raises(ValueError, match="example_batch must be an NDArray"):
        amp.tune(_mobile_like(), np.ones((1, 3, 8, 8)))
    with pytest.raises(ValueError, match="steps must be at least 1"):
        amp.tune(_mobile_like(), example_batch(), steps=0)
    assert not amp.is_initialized(), "a refused tune changes nothing"


def test_multi_input_blocks_with_nested_outputs_are_tuned(native_with):
    """Checks decisions only (forced class native, injected timings). Detectors take targets
    beside the image in training and return nested losses."""
    class TwoInputs(mx.gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.stem = mx.gluon.nn.Conv2D(8, 3, padding=1, in_channels=3)

        def hybrid_forward(self, F, x, target):
            y = self.stem(x)
            return (F.mean(y), (F.mean(F.square(y - F.mean(target))), y))

    inject, timed = native_with
    inject({"float32": 100.0, "bfloat16": 90.0, "bfloat16, stem in float32": 80.0})
    net = TwoInputs()
    net.initialize()
    net.hybridize()
    batch = (example_batch(), mx.nd.ones((4, 1)))
    policy = amp.tune(net, batch, loss_fn=lambda outs: outs[0] + outs[1][0], report=None)
    assert timed == ["float32", "bfloat16", "bfloat16, stem in float32"], timed
    assert policy.name == "bfloat16, stem in float32"


def test_a_candidate_that_cannot_win_gets_no_more_passes():
    """Tune's cost: a candidate whose timed pass is RACE_MARGIN slower than the fastest so far
    stops there (the step sleeps 20 ms; the give-up bound is 1 ms)."""
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.02)
    fp32 = amp.Policy("float32", "float32")
    ms, _ = tune_mod._time_policy(fp32, step, 3, False, give_up_ms=1.0)
    assert len(calls) == 2 and ms >= 20, "one warm-up and one timed pass, then it gives up: %d" % (
        len(calls))
    calls.clear()
    tune_mod._time_policy(fp32, step, 3, False)
    assert len(calls) == 4, "60 ms of short passes: one warm-up and every timed pass"
    calls.clear()
    tune_mod._time_policy(fp32, step, 3, False, enough_seconds=0.01)
    assert len(calls) == 2, ("a pass longer than enough_seconds is timed once (ResNet-50's "
                             "5 s passes): %d calls" % len(calls))


def _finish_shapes(net):
    """Trials in forked copies leave deferred shapes deferred, as the model was; an inference
    pass (which changes no statistic) gives them their shapes to read."""
    with mx.autograd.predict_mode():
        net(example_batch())


@pytest.mark.cpu_class
def test_a_model_with_deferred_shapes_keeps_its_batchnorm_statistics():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Dense(4))
    net.initialize()
    net.hybridize()
    amp.tune(net, example_batch(), report=None, apply=False)
    _finish_shapes(net)
    bn = net[1]
    assert np.all(bn.running_mean.data().asnumpy() == 0) and \
        np.all(bn.running_var.data().asnumpy() == 1), (
            "tuning ran training passes on a model whose shapes were deferred: its BatchNorm "
            "statistics must be restored to their initial values")
    assert not amp.is_initialized()


class _EndsInBfloat16(mx.gluon.HybridBlock):
    """Deferred shapes (no in_channels), two outputs, one nested, both ending in bfloat16
    through amp_cast (MXNet's own cast, which runs on every CPU class)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv = mx.gluon.nn.Conv2D(8, 3)
            self.bn = mx.gluon.nn.BatchNorm()

    def hybrid_forward(self, F, x):
        y = F.amp_cast(self.bn(self.conv(x)), dtype=dtypes.BFLOAT16)
        return y, (F.mean(y, axis=1), y)


@pytest.mark.cpu_class
@pytest.mark.parametrize("loss_fn", [None, lambda outs: outs[1][0]], ids=["outputs", "loss_fn"])
def test_real_tune_of_a_model_that_ends_in_bfloat16(loss_fn):
    """The losses are cast to float32 inside autograd.record(): cast after it, backward failed
    with "Cannot differentiate node because it is not in a computational graph" (hw-runs
    2026-11-25-xeon-amx). Runs on every class: class 'none' times float32 only, and the model
    still ends in bfloat16."""
    net = _EndsInBfloat16()
    net.initialize()
    net.hybridize()
    policy = amp.tune(net, example_batch(), loss_fn=loss_fn, steps=1, report=None, apply=False)
    assert policy.table[0]["name"] == "float32" and all(r["ms"] > 0 for r in policy.table)
    _finish_shapes(net)
    assert np.all(net.bn.running_mean.data().asnumpy() == 0), "statistics restored"
    assert not amp.is_initialized()


def test_profiling_leaves_the_null_device_alone():
    """Stopping MXNet's profiler deletes its trace file and writes a new one: with the trace
    sent to /dev/null, a tune run as root (CI, containers) replaced /dev/null with a regular
    file. The trace now goes to a file of mxamp's own."""
    import os
    import stat
    fp32 = amp.Policy("float32", "float32")
    tune_mod._time_policy(fp32, lambda: mx.nd.ones((2, 2)).wait_to_read(), 1, True)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode), "%s is no longer a device" % os.devnull
    from mxamp.backend.timing import profile_file
    trace = profile_file()
    assert os.path.dirname(trace) != os.path.dirname(os.devnull) and os.path.isfile(trace)
