"""One place decides precision (mxamp.precision.plan): every entry point reads the same plan, and a tuned
policy is one more input of it, not a separate path.

Decisions are checked with the CPU class forced where they depend on it (nothing runs in
bfloat16 here unless the machine computes it). They check decisions only: no ``cpu_class``
marker."""
from dataclasses import replace

import mxnet as mx
import numpy as np
import pytest

from mxamp import amp
from mxamp.backend import cpu
from mxamp.precision import plan
from mxamp.errors import AmpArgumentError
from mxamp.runtime.state import STATE
from test_conditions import _graph_casts


STEM_POLICY = amp.Policy("bfloat16, stem in float32", "bfloat16",
                         conditional_fp32_ops=[["Convolution", "in_channels", ["<=4"]]])
BN_POLICY = amp.Policy("bfloat16, BatchNorm in float32", "bfloat16",
                       extra_fp32_ops=["BatchNorm", "_npx_batch_norm"])


@pytest.fixture
def native(monkeypatch):
    """Class 'native' forced (decisions only), the probe off."""
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="native",
                                                    amx_bf16=False))
    monkeypatch.setenv("MXAMP_PROBE", "0")
    amp.reset()
    yield
    amp.reset()


def _net():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, padding=1, in_channels=3), mx.gluon.nn.BatchNorm(),
            mx.gluon.nn.Conv2D(8, 3, padding=1, in_channels=8), mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier(rnd_type="gaussian", magnitude=2))
    net.hybridize()
    return net


CALLS = [("Convolution", (2, 3, 8, 8), {"kernel": (3, 3)}),
         ("Convolution", (2, 8, 8, 8), {"kernel": (3, 3)}),
         ("BatchNorm", (2, 8, 8, 8), {}), ("FullyConnected", (2, 512), {}),
         ("softmax", (2, 4), {}), ("elemwise_add", (2, 4), {})]


def _x():
    """The example input (built per test: nothing runs MXNet at collection)."""
    return mx.nd.array(np.random.RandomState(3).rand(2, 3, 8, 8))


def _decisions():
    return [amp.precision_of(op, data_shape=shape, **params)[0] for op, shape, params in CALLS]


# test_only_the_plan_turns_requests_into_lists_and_device_plans moved to tests/test_layers.py
# (test_only_the_precision_unit_resolves_lists_and_device_plans), where the ranks replace MAY_CALL.


def test_init_keeps_the_plan_it_made(native):
    amp.init("bfloat16")
    assert isinstance(STATE.plan, plan.Plan), "amp.init records its plan"
    made = plan.make("bfloat16")
    assert STATE.plan.lists == made.lists and STATE.plan.device_plans == made.device_plans, \
        "init's plan is plan.make's, for the same request"
    state = amp.patch_state()
    assert state["cpu_plan"] == made.cpu.describe() and state["cpu_compute"] == "bfloat16", state
    assert amp.precision_plan("bfloat16", mx.cpu()) == made.cpu, \
        "amp.precision_plan reads the same plan"


def test_init_with_a_policy_decides_as_its_op_lists_do(native):
    for policy in (STEM_POLICY, BN_POLICY):
        amp.init(**policy.init_kwargs())
        by_kwargs = _decisions()
        amp.reset()
        amp.init(policy=policy)
        assert _decisions() == by_kwargs, "%s: policy= and init_kwargs() agree" % policy.name
        assert amp.patch_state()["policy"] == policy.name
        amp.reset()
    amp.init(policy=STEM_POLICY)
    assert _decisions()[:2] == ["float32", "bfloat16"], \
        "the stem (3 input channels) runs in float32, the next convolution in bfloat16"
    amp.reset()
    amp.init(policy=BN_POLICY)
    assert _decisions()[2] == "float32", "BatchNorm runs in float32 under its policy"


def test_convert_with_a_policy_builds_the_graph_its_op_lists_build(native):
    net, x = _net(), _x()
    net(x)
    by_kwargs = _graph_casts(amp.convert_hybrid_block(net, example_inputs=x,
                                                      **STEM_POLICY.convert_kwargs())(
        mx.sym.var("data")))
    by_policy = _graph_casts(amp.convert_hybrid_block(net, example_inputs=x,
                                                      policy=STEM_POLICY)(mx.sym.var("data")))
    assert by_policy == by_kwargs, "policy= and convert_kwargs() give the same graph"
    convs = [n for n in by_policy if "conv" in n and n.endswith("fwd")]
    assert [by_policy[c] for c in convs] == ["float32", "bfloat16"], by_policy


def test_a_float32_policy_keeps_amp_on_with_float32_compute(native):
    net, x = _net(), _x()
    expected = net(x).asnumpy()
    fp32 = amp.Policy("float32", "float32")
    amp.init(policy=fp32)
    state = amp.patch_state()
    assert state["initialized"] and state["cpu_compute"] == "float32", state
    assert "amp.tune chose float32" in state["cpu_plan"], state["cpu_plan"]
    assert all(d in ("float32", "widest", "input") for d in _decisions()), _decisions()
    got = net(x)
    assert got.dtype == np.float32 and np.array_equal(got.asnumpy(), expected), \
        "a float32 policy computes float32's results bit for bit"


def test_bad_policies_are_refused_and_nothing_changes(native):
    with pytest.raises(AmpArgumentError, match="disagrees with the policy"):
        amp.init(target_dtype=np.float16, policy=STEM_POLICY)
    with pytest.raises(AmpArgumentError, match="policy must be an mxamp Policy"):
        amp.init(policy={"target": "bfloat16"})
    assert not amp.is_initialized(), "a refused init changes nothing"
    amp.init("bfloat16")
    with pytest.raises(RuntimeError, match="call amp.reset|Call amp.reset"):
        amp.init("bfloat16", policy=STEM_POLICY)
    assert amp.patch_state()["policy"] is None, "the first init's plan stays in force"


def test_a_policy_file_that_is_not_one_says_so(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text('{"name": "x", "target": "bfloat16", "colour": "red"}')
    with pytest.raises(AmpArgumentError, match="is not a policy"):
        amp.Policy.load(str(path))


@pytest.mark.parametrize("request_", ["auto", "float32 policy"])
def test_a_plan_that_computes_float32_leaves_mxnet_alone(monkeypatch, amp_off, request_):
    """Checks decisions only (class 'emulated' forced: 'auto' computes float32 there). Where
    mxamp itself chose float32, amp.init wraps no operator but the loss outputs, so the model
    runs MXNet's own functions; loss scaling still skips a non-finite step."""
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="emulated",
                                                    amx_bf16=False))
    def functions():
        return {"nd.FullyConnected": mx.nd.FullyConnected, "sym.Convolution": mx.sym.Convolution,
                "npx.batch_norm": mx.npx.batch_norm, "nd.softmax": mx.nd.softmax,
                "NDArray.astype": mx.nd.NDArray.astype}
    own = functions()
    softmax_output = mx.nd.SoftmaxOutput
    if request_ == "auto":
        amp.init("auto")
    else:
        amp.init(policy=amp.Policy("float32", "float32"))
    now = functions()
    assert {k for k in own if now[k] is not own[k]} == set(), "MXNet's own functions must run"
    assert mx.nd.SoftmaxOutput is not softmax_output, "loss outputs still get the loss scale"
    state = amp.patch_state()
    assert state["initialized"] and state["cpu_compute"] == "float32", state
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer)
    before = net.weight.data().asnumpy().copy()
    with mx.autograd.record():
        loss = net(mx.nd.ones((1, 3))).sum() * float("inf")
        with amp.scale_loss(loss, trainer) as scaled:
            mx.autograd.backward(scaled)
    trainer.step(1)
    assert np.array_equal(net.weight.data().asnumpy(), before), "the non-finite step is skipped"
    assert trainer._amp_loss_scaler.skipped_steps == 1
    amp.reset()
    assert mx.nd.SoftmaxOutput is softmax_output


def test_an_explicit_target_keeps_its_wrappers_where_it_computes_float32(monkeypatch, amp_off):
    """Checks decisions only (class 'none' forced): an explicit bfloat16 request keeps the
    wrappers that compute a bfloat16 input of an op without a kernel in float32."""
    monkeypatch.setattr(cpu, "_CLASSIFIED", replace(cpu.cpu_features(), bf16_class="none",
                                                    amx_bf16=False))
    original = mx.nd.FullyConnected
    amp.init("bfloat16")
    assert amp.patch_state()["cpu_compute"] == "float32"
    assert mx.nd.FullyConnected is not original
