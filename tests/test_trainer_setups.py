"""The trainer set-ups users bring to AMP: the reference's attributes, a second init_trainer, bad
input (refused, nothing changed), kvstore placements that cannot skip a step (refused or
moved off the kvstore, with their states), unscaling before clipping, checkpoints that resume
the scale and its counters, and GluonCV's action-recognition order on a device kvstore (split
from ``test_trainer.py``, whose helpers these tests share).
"""
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from mxamp import amp
from mxamp.training import trainer as amp_trainer
from mxamp.training.trainer_scaler import TrainerScaler
from test_trainer import (CPU2, assert_identical, forward_backward, make_net, make_trainer,
                          poison_grad, snapshot, train_step)


def test_reference_attributes_read_and_set():
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    amp.init_trainer(trainer, init_scale=64.0)
    hook = trainer._amp_loss_scaler
    hook._scale_seq_len = 2                       # Sockeye sets the growth interval
    train_step(net, trainer, [mx.cpu(0)], seed=1)
    assert hook._unskipped == 1
    train_step(net, trainer, [mx.cpu(0)], seed=2)
    assert (hook.loss_scale, hook._unskipped) == (128.0, 0), "grows after _scale_seq_len steps"
    saved = (hook._loss_scale, hook._next_loss_scale, hook._unskipped)
    hook._loss_scale, hook._next_loss_scale, hook._unskipped = 512.0, 1024.0, 1
    with amp.scale_loss(mx.nd.array([1.0]), trainer) as scaled:
        assert scaled.asscalar() == 1024.0, "_next_loss_scale is the scale of the next step"
    train_step(net, trainer, [mx.cpu(0)], seed=3)
    assert hook.loss_scale == 2048.0, "_unskipped=1 + one clean step reaches the interval"
    hook._max_loss_scale = 100.0
    assert hook.loss_scale == 100.0, "lowering _max_loss_scale clamps the scale"
    assert saved == (128.0, 128.0, 0)
    with pytest.raises(ValueError, match="_scale_seq_len"):
        hook._scale_seq_len = 0


def test_init_trainer_twice_keeps_the_learning_rate():
    nets = [make_net([mx.cpu(0)]) for _ in range(2)]
    trainers = [make_trainer(n) for n in nets]
    for t in trainers:
        amp.init_trainer(t)
    train_step(nets[1], trainers[1], [mx.cpu(0)])
    train_step(nets[0], trainers[0], [mx.cpu(0)])
    hook = amp_trainer.loss_scaler(trainers[1])
    assert isinstance(hook, TrainerScaler) and hook is trainers[1]._amp_loss_scaler
    assert amp.init_trainer(trainers[1]) is hook, "no keywords: the same scaler"
    amp.init_trainer(trainers[1], init_scale=2.0 ** 16)
    assert trainers[1]._amp_original_scale == 1.0, "the original rescale must be kept"
    for n, t in zip(nets, trainers):
        train_step(n, t, [mx.cpu(0)], seed=5)
    assert np.array_equal(nets[0][0].weight.data().asnumpy(), nets[1][0].weight.data().asnumpy()), \
        "a second init_trainer must not change the effective learning rate"


def test_clear_errors_for_bad_input():
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    with pytest.raises(RuntimeError, match="amp.init_trainer"):
        with amp.scale_loss(mx.nd.ones((1,)), trainer):
            pass
    with pytest.raises(RuntimeError, match="amp.init_trainer"):
        amp.unscale(trainer)
    with pytest.raises(RuntimeError, match="amp.init_trainer"):
        amp_trainer.global_norm_and_overflow(trainer)
    with pytest.raises(TypeError, match="got dict"):
        amp.init_trainer({"trainer": trainer})      # GluonCV siamrpn passes a dict
    with pytest.raises(TypeError, match="not the optimizer"):
        amp.init_trainer(trainer._optimizer)
    with pytest.raises(TypeError, match="unknown keyword.*loss_scale"):
        amp.init_trainer(trainer, loss_scale=8.0)
    with pytest.raises(ValueError, match="growth_factor"):
        amp.init_trainer(trainer, growth_factor=0.5)
    with pytest.raises(ValueError, match="target_dtype"):
        amp.init_trainer(trainer, target_dtype="int8")
    assert not hasattr(trainer, "_amp_loss_scaler"), "a rejected call must change nothing"
    assert trainer._kvstore_params["update_on_kvstore"] is None



def test_kvstore_configurations_that_cannot_skip_are_refused_or_fixed():
    net = make_net(CPU2)
    with pytest.raises(RuntimeError, match="async"):
        amp.init_trainer(make_trainer(net, kvstore="dist_async"))
    store = mx.kv.create("device")
    trainer = make_trainer(net, kvstore=store, update_on_kvstore=True)
    train_step(net, trainer, CPU2, use_amp=False)   # optimizer now lives in the kvstore
    with pytest.raises(RuntimeError, match="update_on_kvstore=False"):
        amp.init_trainer(trainer)
    with pytest.warns(UserWarning, match="overridden"):
        amp.init_trainer(make_trainer(net, kvstore="device", update_on_kvstore=True))
    sparse = gluon.Parameter("embedding", shape=(10, 2), stype="row_sparse",
                             grad_stype="row_sparse")
    sparse.initialize()
    with pytest.raises(RuntimeError, match="sparse weights"):
        amp.init_trainer(gluon.Trainer([sparse], "sgd", kvstore="local"))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_running_local_kvstore_is_moved_off_with_its_states(optimizer):
    """load_states (or a step) before init_trainer already started update_on_kvstore=True.
    Adam reads each weight's update count, which the kvstore kept on the one device that
    updated the weight: before the counts moved too, cpu(1) restarted its bias correction
    at 1 and the two contexts' weights parted at the first step after the move."""
    net, ref = make_net(CPU2), make_net(CPU2)
    trainer = make_trainer(net, optimizer, kvstore="device")
    ref_trainer = make_trainer(ref, optimizer, kvstore="device", update_on_kvstore=False)
    train_step(net, trainer, CPU2, use_amp=False)
    train_step(ref, ref_trainer, CPU2, use_amp=False)
    assert trainer._update_on_kvstore, "precondition: updates run inside the kvstore"
    amp.init_trainer(trainer, init_scale=4.0)
    before = snapshot(net, trainer)
    train_step(net, trainer, CPU2, seed=4, poison=("grad", 1))
    assert_identical(before, snapshot(net, trainer), "skip after moving off the kvstore")
    for seed in (5, 6):
        train_step(net, trainer, CPU2, seed=seed)
        train_step(ref, ref_trainer, CPU2, seed=seed, use_amp=False)
    # power-of-two scales unscale exactly: the runs agree bit for bit (measured, every class)
    for name, p in net.collect_params().items():
        for ctx in CPU2:
            assert np.array_equal(p.data(ctx).asnumpy(),
                                  ref.collect_params()[name].data(ctx).asnumpy()), \
                "%s's states and counts must carry over: %s differs on %s" % (optimizer, name, ctx)


def test_unscale_once_then_clip_sees_true_gradients():
    net, ref = make_net([mx.cpu(0)]), make_net([mx.cpu(0)])
    trainer, ref_trainer = make_trainer(net), make_trainer(ref)
    amp.init_trainer(trainer)
    forward_backward(net, trainer, [mx.cpu(0)])
    forward_backward(ref, ref_trainer, [mx.cpu(0)], use_amp=False)
    norm, bad = amp_trainer.global_norm_and_overflow(trainer)
    amp.unscale(trainer)
    amp.unscale(trainer)                         # documented: the second call is a no-op
    grads = [p.grad() for p in net.collect_params().values()]
    ref_grads = [p.grad() for p in ref.collect_params().values()]
    for g, r in zip(grads, ref_grads):
        assert np.array_equal(g.asnumpy(), r.asnumpy()), "unscaled grads must be the true grads"
    ref_norm = np.sqrt(sum(float((r.asnumpy().astype(np.float64) ** 2).sum()) for r in ref_grads))
    # float32 sums against a float64 one: measured 1.1e-8 (Zen 4, native and emulated) and
    # 3.2e-8 (none) relative, clip_global_norm's float32 result 3.8e-8; the bound, 1e-6 (8
    # float32 ulps), leaves room for another summation order (thread count)
    assert not bad and norm == pytest.approx(ref_norm, rel=1e-6), (norm, ref_norm)
    assert gluon.utils.clip_global_norm(grads, 0.1) == pytest.approx(ref_norm, rel=1e-6)
    gluon.utils.clip_global_norm(ref_grads, 0.1)
    trainer.step(4)
    ref_trainer.step(4)
    assert np.array_equal(net[0].weight.data().asnumpy(), ref[0].weight.data().asnumpy()), \
        "after unscale the optimizer must not divide by the scale again"
    poison_grad(net, 0)
    assert amp_trainer.global_norm_and_overflow(trainer)[1], "inf must be reported"


@pytest.mark.parametrize("order", ["load_then_init", "init_then_load"])
def test_checkpoint_round_trip_resumes_scale_and_counters(tmp_path, order):
    fname = str(tmp_path / "trainer.states")
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    amp.init_trainer(trainer, init_scale=1024.0, growth_interval=3)
    for seed, poison in [(1, None), (2, ("loss", 0)), (3, None)]:
        train_step(net, trainer, [mx.cpu(0)], seed=seed, poison=poison)
    trainer.save_states(fname)
    net.save_parameters(str(tmp_path / "net.params"))
    resumed_net = make_net([mx.cpu(0)], seed=99)
    resumed_net.load_parameters(str(tmp_path / "net.params"))
    resumed = make_trainer(resumed_net)
    if order == "load_then_init":
        resumed.load_states(fname)
        amp.init_trainer(resumed)
    else:
        amp.init_trainer(resumed)
        resumed.load_states(fname)
    original, restored = trainer._amp_loss_scaler, resumed._amp_loss_scaler
    assert restored.state_dict() == original.state_dict(), "scale and counters must resume"
    assert (restored.loss_scale, restored._unskipped, restored.skipped_steps) == (512.0, 1, 1)
    for seed in (4, 5, 6):
        train_step(net, trainer, [mx.cpu(0)], seed=seed)
        train_step(resumed_net, resumed, [mx.cpu(0)], seed=seed)
    assert restored.loss_scale == original.loss_scale == 1024.0, "grew at the same step"
    assert np.array_equal(net[0].weight.data().asnumpy(), resumed_net[0].weight.data().asnumpy())
    plain = make_trainer(make_net([mx.cpu(0)]))
    plain.load_states(fname)                     # the file stays loadable without mxamp
    assert plain._optimizer.num_update == trainer._optimizer.num_update - 3


def test_gluoncv_recognizer_order_on_device_kvstore(tmp_path):
    """load_states starts a 'device' kvstore with update_on_kvstore=True; init_trainer follows."""
    fname = str(tmp_path / "device.states")
    net = make_net(CPU2)
    trainer = make_trainer(net, kvstore="device")
    amp.init_trainer(trainer, init_scale=256.0)
    train_step(net, trainer, CPU2, seed=1, poison=("grad", 1))
    train_step(net, trainer, CPU2, seed=2)
    trainer.save_states(fname)
    resumed_net = make_net(CPU2, seed=8)
    for name, p in resumed_net.collect_params().items():
        p.set_data(net.collect_params()[name].data())
    resumed = make_trainer(resumed_net, kvstore="device")
    resumed.load_states(fname)
    assert resumed._update_on_kvstore, "precondition: the loaded states live in the kvstore"
    amp.init_trainer(resumed)
    assert resumed._amp_loss_scaler.state_dict() == trainer._amp_loss_scaler.state_dict()
    for seed in (3, 4):
        train_step(net, trainer, CPU2, seed=seed)
        train_step(resumed_net, resumed, CPU2, seed=seed)
    # the same float32 steps from the same states: bit for bit (measured, every class)
    for name, p in net.collect_params().items():
        assert np.array_equal(resumed_net.collect_params()[name].data().asnumpy(),
                              p.data().asnumpy()), \
            "resumed run must continue like the original: %s differs" % name


class _TwoBranches(gluon.Block):
    """Two Dense layers; ``branch`` says which one the forward uses (a routed model)."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.a = gluon.nn.Dense(3, in_units=4)
            self.b = gluon.nn.Dense(3, in_units=4)
        self.branch = "a"

    def forward(self, x):
        return getattr(self, self.branch)(x)


def _branch_step(net, trainer, x, branch, use_amp, ignore_stale_grad=True):
    net.branch = branch
    with mx.autograd.record():
        loss = net(x).sum()
        if use_amp:
            with amp.scale_loss(loss, trainer) as scaled:
                mx.autograd.backward(scaled)
        else:
            loss.backward()
    trainer.step(x.shape[0], ignore_stale_grad=ignore_stale_grad)


def test_a_skipped_branch_does_not_skip_later_steps_that_leave_it_out():
    """One batch with NaN through branch b, then clean batches through branch a only
    (``ignore_stale_grad=True``, as routed models train). The skipped step's gradients count
    as used: branch a trains as in float32, bit for bit (float32 compute, bfloat16's static
    scale 1.0), and the skip warns once, naming b's weight, at the caller's line. Before,
    b's NaN gradient stayed "fresh" and was checked at every step: all later steps skipped,
    silently."""
    nets = []
    for use_amp in (True, False):
        mx.random.seed(3)
        net = _TwoBranches()
        net.initialize(mx.init.Xavier())
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        if use_amp:
            amp.init_trainer(trainer, target_dtype="bfloat16")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _branch_step(net, trainer, mx.nd.full((2, 4), float("nan")), "b", use_amp)
        for seed in range(3):
            x = mx.nd.array(np.random.RandomState(seed).randn(2, 4))
            _branch_step(net, trainer, x, "a", use_amp)
        nets.append((net, trainer, caught))
    (amp_net, amp_trainer_, caught), (ref_net, _, _) = nets
    scaler = amp.loss_scaler(amp_trainer_)
    assert scaler.skipped_steps == 1, "only the NaN step is skipped"
    assert np.array_equal(amp_net.a.weight.data().asnumpy(), ref_net.a.weight.data().asnumpy())
    messages = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and amp_net.b.weight.name in str(messages[0].message), messages
    assert messages[0].filename == __file__, "the warning points at the caller's step()"


def test_a_skipped_step_leaves_stale_gradients_to_mxnet_as_an_applied_one_does():
    """Without ``ignore_stale_grad``, a step whose model left a parameter out raises MXNet's
    stale-gradient error after a skipped step just as after an applied one."""
    net = _TwoBranches()
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer, target_dtype="bfloat16")
    net.branch = "b"
    with pytest.warns(RuntimeWarning, match="static loss scale"):
        _branch_step(net, trainer, mx.nd.full((2, 4), float("nan")), "b", True, False)
    with pytest.raises(UserWarning, match="has not been updated by backward"):
        _branch_step(net, trainer, mx.nd.ones((2, 4)), "a", True, False)
