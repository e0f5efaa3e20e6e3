"""Trainer integration: skip-on-overflow for every trainer configuration, scale adaptation,
the scaler's options, threads and several trainers (the set-ups users bring, with errors:
``test_trainer_setups.py``; loss-output ops: ``test_loss_outputs.py``)."""
import logging
import threading
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from mxamp import amp, dtypes
from mxamp.runtime.state import STATE

INF = float("inf")
CPU2 = [mx.cpu(0), mx.cpu(1)]


def make_net(ctx, seed=7, frozen_bias=False):
    mx.random.seed(seed)
    np.random.seed(seed)
    net = gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():   # the same parameter names in every test
        net.add(gluon.nn.Dense(5, in_units=4, activation="tanh"), gluon.nn.Dense(2, in_units=5))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    if frozen_bias:
        net[1].bias.grad_req = "null"
    return net


def make_trainer(net, optimizer="sgd", kvstore=None, update_on_kvstore=None, lr=0.1):
    params = {"learning_rate": lr}
    if optimizer == "sgd":
        params["momentum"] = 0.9
    params["lr_scheduler"] = mx.lr_scheduler.FactorScheduler(step=1, factor=0.9)
    return gluon.Trainer(net.collect_params(), optimizer, params, kvstore=kvstore,
                         update_on_kvstore=update_on_kvstore)


def batch(ctx, n=4, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n * len(ctx), 4).astype(np.float32)
    y = rng.randn(n * len(ctx), 2).astype(np.float32)
    return ([mx.nd.array(part, ctx=c) for part, c in zip(np.split(x, len(ctx)), ctx)],
            [mx.nd.array(part, ctx=c) for part, c in zip(np.split(y, len(ctx)), ctx)])


def forward_backward(net, trainer, ctx, seed=0, poison_loss_on=None, use_amp=True):
    xs, ys = batch(ctx, seed=seed)
    with autograd.record():
        losses = [((net(x) - y) ** 2).sum() for x, y in zip(xs, ys)]
        if poison_loss_on is not None:
            losses[poison_loss_on] = losses[poison_loss_on] * INF
        if use_amp:
            with amp.scale_loss(losses, trainer) as scaled:
                autograd.backward(scaled)
        else:
            autograd.backward(losses)


def poison_grad(net, ctx_index, value=INF):
    net[0].weight.list_grad()[ctx_index][0, 0] = value


def train_step(net, trainer, ctx, seed=0, poison=None, split=False, use_amp=True):
    """poison: None, ('loss', ctx_index) or ('grad', ctx_index)."""
    kind, where = poison if poison else (None, None)
    forward_backward(net, trainer, ctx, seed, where if kind == "loss" else None, use_amp)
    if kind == "grad":
        poison_grad(net, where)
    if split:
        trainer.allreduce_grads()
        trainer.update(4 * len(ctx))
    else:
        trainer.step(4 * len(ctx))


def flatten_state(state):
    if state is None:
        return []
    if isinstance(state, mx.nd.NDArray):
        return [state.asnumpy()]
    return [x for s in state for x in flatten_state(s)]


def snapshot(net, trainer):
    """Everything a skipped step must leave bit-identical."""
    params = net.collect_params()
    weights = {n: [d.asnumpy() for d in p.list_data()] for n, p in params.items()}
    states = [{i: flatten_state(s) for i, s in sorted(u.states.items())}
              for u in trainer._updaters]
    opt = trainer._optimizer
    return weights, states, opt.num_update, dict(opt._index_update_count), opt.learning_rate


def assert_identical(before, after, what):
    (w0, s0, n0, c0, lr0), (w1, s1, n1, c1, lr1) = before, after
    for name in w0:
        for ctx_i, (a, b) in enumerate(zip(w0[name], w1[name])):
            assert np.array_equal(a, b), "%s: weight %s on context %d changed" % (what, name, ctx_i)
    for u0, u1 in zip(s0, s1):
        assert u0.keys() == u1.keys(), "%s: optimizer state keys changed" % what
        for key in u0:
            for a, b in zip(u0[key], u1[key]):
                assert np.array_equal(a, b), "%s: optimizer state of %s changed" % (what, key)
    assert (n0, c0, lr0) == (n1, c1, lr1), "%s: num_update/update counts/lr changed" % what


CONFIGS = [
    # (contexts, kvstore, update_on_kvstore, split allreduce+update, optimizer)
    ([mx.cpu(0)], None, None, False, "sgd"),
    (CPU2, None, None, False, "sgd"),
    (CPU2, None, None, False, "adam"),
    (CPU2, "local", None, False, "sgd"),
    (CPU2, "local", True, False, "adam"),
    (CPU2, "local", False, True, "sgd"),
    (CPU2, "device", None, False, "adam"),
    (CPU2, "device", True, False, "sgd"),
    (CPU2, "device", False, True, "adam"),
]


@pytest.mark.parametrize("ctx, kvstore, on_kv, split, optimizer", CONFIGS)
@pytest.mark.parametrize("poison", [("loss", -1), ("grad", -1)])
def test_overflowed_step_changes_nothing(ctx, kvstore, on_kv, split, optimizer, poison):
    net = make_net(ctx, frozen_bias=True)
    trainer = make_trainer(net, optimizer, kvstore, on_kv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # explicit update_on_kvstore=True is overridden
        amp.init_trainer(trainer)
    train_step(net, trainer, ctx, seed=1, split=split)   # creates the optimizer states
    assert not trainer._update_on_kvstore, "updates must run in Trainer._update, after the check"
    before = snapshot(net, trainer)
    train_step(net, trainer, ctx, seed=2, poison=poison, split=split)
    assert_identical(before, snapshot(net, trainer), "skipped step %s" % (poison,))
    hook = trainer._amp_loss_scaler
    assert hook.skipped_steps == 1 and hook.loss_scale == 2.0 ** 15, hook
    assert "net_dense0_weight" in hook.nonfinite_params, hook.nonfinite_params
    train_step(net, trainer, ctx, seed=3, split=split)
    weights = snapshot(net, trainer)[0]["net_dense0_weight"]
    assert not np.array_equal(weights[0], before[0]["net_dense0_weight"][0]), \
        "a clean step after the skip must update"
    assert all(np.isfinite(w).all() for w in weights), "weights must stay finite"
    if kvstore:   # without a kvstore each context applies its own gradient (plain MXNet)
        assert all(np.array_equal(weights[0], w) for w in weights), "contexts must stay in sync"


def test_a_step_synchronises_with_the_host_once(monkeypatch):
    net = make_net(CPU2)
    trainer = make_trainer(net, kvstore="device")
    amp.init_trainer(trainer)
    train_step(net, trainer, CPU2, seed=1)
    forward_backward(net, trainer, CPU2, seed=2)
    mx.nd.waitall()
    copies = []
    real = mx.nd.NDArray.asnumpy
    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", lambda self: copies.append(1) or real(self))
    trainer.step(8)
    assert len(copies) == 1, "the overflow check must copy to the host once, got %d" % len(copies)


def test_grad_req_add_accumulation_skip_and_match(seed):
    net, ref = make_net([mx.cpu(0)]), make_net([mx.cpu(0)])
    for n in (net, ref):
        n.collect_params().setattr("grad_req", "add")
    trainer, ref_trainer = make_trainer(net), make_trainer(ref)
    amp.init_trainer(trainer)
    for step in range(3):
        for micro in range(2):
            forward_backward(net, trainer, [mx.cpu(0)], seed=10 * step + micro,
                             poison_loss_on=0 if (step, micro) == (1, 1) else None)
            forward_backward(ref, ref_trainer, [mx.cpu(0)], seed=10 * step + micro,
                             use_amp=False)
        before = snapshot(net, trainer)
        trainer.step(8)
        if step == 1:
            assert_identical(before, snapshot(net, trainer), "accumulated overflow")
        else:
            ref_trainer.step(8)
        net.collect_params().zero_grad()
        ref.collect_params().zero_grad()
    for name, p in net.collect_params().items():
        assert np.array_equal(p.data().asnumpy(), ref.collect_params()[name].data().asnumpy()), \
            "with power-of-two scales, AMP steps must equal plain fp32 steps bit for bit"


def test_amp_steps_equal_plain_fp32_steps_bit_for_bit(seed):
    net, ref = make_net(CPU2), make_net(CPU2)
    trainer = make_trainer(net, kvstore="device")
    ref_trainer = make_trainer(ref, kvstore="device", update_on_kvstore=False)
    amp.init_trainer(trainer, init_scale=2.0 ** 10)
    for step in range(3):
        train_step(net, trainer, CPU2, seed=step)
        train_step(ref, ref_trainer, CPU2, seed=step, use_amp=False)
    for name, p in net.collect_params().items():
        assert np.array_equal(p.data().asnumpy(), ref.collect_params()[name].data().asnumpy()), name


def test_new_scale_is_used_by_the_very_next_step():
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    amp.init_trainer(trainer, init_scale=1024.0)
    train_step(net, trainer, [mx.cpu(0)], poison=("loss", 0))
    loss = mx.nd.array([3.0])
    with amp.scale_loss(loss, trainer) as scaled:
        assert scaled.asscalar() == 3.0 * 512.0, "next step must already use the halved scale"
    assert trainer._scale == 1.0 / 512.0, "rescale must undo exactly the scale in use"


def test_all_frozen_and_null_grad_params_do_not_crash():
    net = make_net([mx.cpu(0)])
    net.collect_params().setattr("grad_req", "null")
    trainer = make_trainer(net)
    amp.init_trainer(trainer)
    before = snapshot(net, trainer)
    trainer.step(1)
    assert trainer._amp_loss_scaler.skipped_steps == 0, "nothing to check is not an overflow"
    assert_identical(before, snapshot(net, trainer), "all-frozen step")


def test_several_trainers_have_independent_scalers():
    net_a, net_b = make_net([mx.cpu(0)], seed=1), make_net([mx.cpu(0)], seed=2)
    tr_a, tr_b = make_trainer(net_a), make_trainer(net_b)
    amp.init_trainer(tr_a)
    amp.init_trainer(tr_b, init_scale=256.0)
    w_b = net_b[0].weight.data().asnumpy()
    train_step(net_a, tr_a, [mx.cpu(0)], poison=("loss", 0))
    train_step(net_b, tr_b, [mx.cpu(0)])
    assert tr_a._amp_loss_scaler.loss_scale == 2.0 ** 15 and tr_b._amp_loss_scaler.loss_scale == 256
    assert not np.array_equal(w_b, net_b[0].weight.data().asnumpy()), "trainer B must update"


def test_loss_outputs_follow_the_trainer_whose_scale_loss_is_active():
    tr_a = make_trainer(make_net([mx.cpu(0)], seed=1))
    tr_b = make_trainer(make_net([mx.cpu(0)], seed=2))
    hook_a = amp.init_trainer(tr_a, init_scale=8.0)
    hook_b = amp.init_trainer(tr_b, init_scale=32.0)
    assert STATE.current_scaler() is hook_b, "outside scale_loss: the latest trainer"
    with amp.scale_loss(mx.nd.ones((1,)), tr_a):
        assert STATE.current_scaler() is hook_a, "inside scale_loss: that trainer"
        seen = []
        worker = threading.Thread(target=lambda: seen.append(STATE.current_scaler()))
        worker.start()
        worker.join()
        assert seen == [hook_b], "another thread is not inside this scale_loss"
    assert STATE.current_scaler() is hook_b


def test_worker_threads_scale_their_own_losses():
    """GluonCV R-CNN calls scale_loss from one worker thread per context."""
    def run(threaded):
        net = make_net(CPU2)
        trainer = make_trainer(net, kvstore="device")
        amp.init_trainer(trainer)
        xs, ys = batch(CPU2)

        def work(i):
            with autograd.record():
                loss = ((net(xs[i]) - ys[i]) ** 2).sum()
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
        if threaded:
            threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            work(0)
            work(1)
        trainer.step(8)
        return net[0].weight.data().asnumpy()
    assert np.array_equal(run(True), run(False)), "threads must give the sequential result"


def test_scale_loss_accepts_lists_tuples_and_numpy_arrays():
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    amp.init_trainer(trainer, init_scale=4.0)
    a, b = mx.nd.array([1.0]), mx.nd.array([2.0])
    with amp.scale_loss((a, b), trainer) as scaled:
        assert [s.asscalar() for s in scaled] == [4.0, 8.0], "tuple of losses"
    with amp.scale_loss(a.as_np_ndarray(), trainer) as scaled:
        assert isinstance(scaled, mx.np.ndarray) and float(scaled) == 4.0, "np ndarray loss"
    with pytest.raises(TypeError, match="got float"):
        with amp.scale_loss([a, 1.0], trainer):
            pass
    with pytest.raises(TypeError, match="got ndarray"):
        with amp.scale_loss(np.ones(2), trainer):
            pass


def test_numpy_interface_training_skips_on_second_context_overflow():
    """The reference crashes here: multi_all_finite refuses mx.np gradients."""
    with mx.util.np_shape(True), mx.util.np_array(True):
        mx.random.seed(1)
        net = gluon.nn.Dense(2, in_units=3)
        net.initialize(ctx=CPU2)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=None)
        amp.init_trainer(trainer)
        weights = []
        for poison in (False, True):
            with autograd.record():
                losses = [net(mx.np.ones((2, 3), ctx=c)).sum() for c in CPU2]
                if poison:
                    losses[1] = losses[1] * INF
                with amp.scale_loss(losses, trainer) as scaled:
                    autograd.backward(scaled)
            assert isinstance(net.weight.grad(CPU2[1]), mx.np.ndarray)
            trainer.step(2)
            weights.append([w.asnumpy() for w in net.weight.list_data()])
    assert trainer._amp_loss_scaler.skipped_steps == 1, "inf on cpu(1) only must be caught"
    assert all(np.array_equal(a, b) for a, b in zip(*weights)), "skipped: weights unchanged"


def test_bfloat16_default_scale_one_yields_the_loss_itself_but_still_skips():
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    hook = amp.init_trainer(trainer, target_dtype="bfloat16")
    assert (hook.loss_scale, hook.scaler.dynamic) == (1.0, False), "bf16: static scale 1.0"
    loss = mx.nd.array([5.0])
    with amp.scale_loss(loss, trainer) as scaled:
        assert scaled is loss, "scale 1.0 must not add any arithmetic"
    before = snapshot(net, trainer)
    train_step(net, trainer, [mx.cpu(0)], poison=("grad", 0))
    assert_identical(before, snapshot(net, trainer), "bf16 non-finite step")
    assert hook.loss_scale == 1.0 and hook.skipped_steps == 1


def test_every_option_reaches_the_scaler():
    options = dict(init_scale=8.0, growth_factor=4.0, growth_interval=7, backoff_factor=0.25,
                   min_scale=2.0, max_scale=64.0, hysteresis=2, dynamic=True)
    hook = amp.init_trainer(make_trainer(make_net([mx.cpu(0)])), **options)
    got = {k: getattr(hook.scaler, "scale" if k == "init_scale" else k) for k in options}
    assert got == options, "init_trainer options must configure the scaler: %s" % got


def test_target_dtype_inference(amp_off):
    p32 = gluon.Parameter("w32", shape=(2,))
    p16 = gluon.Parameter("wbf", shape=(2,), dtype=dtypes.BFLOAT16)
    for p in (p32, p16):
        p.initialize(init="zeros")   # MXNet's random initialisers reject bf16
    t32 = gluon.Trainer([p32], "sgd", kvstore=None)
    tbf = gluon.Trainer([p16], "sgd", kvstore=None)
    assert amp.init_trainer(t32).target_dtype == "float16", "no amp.init, fp32 params: float16"
    assert amp.init_trainer(tbf).target_dtype == "bfloat16", "a bf16 parameter: bfloat16"
    assert amp.init_trainer(tbf, target_dtype="float16").loss_scale == 2.0 ** 16, "explicit wins"


def test_skip_nonfinite_false_with_static_scale_removes_the_check():
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    amp.init_trainer(trainer, init_scale=1.0, dynamic=False, skip_nonfinite=False)
    train_step(net, trainer, [mx.cpu(0)], poison=("grad", 0))
    assert not np.isfinite(net[0].weight.data().asnumpy()).all(), \
        "documented: without the check, a non-finite step is applied"
    with pytest.raises(ValueError, match="skip_nonfinite=True"):
        amp.init_trainer(make_trainer(make_net([mx.cpu(0)])), skip_nonfinite=False)


def test_min_scale_keeps_skipping_and_warns_once_with_names(caplog):
    net = make_net([mx.cpu(0)])
    trainer = make_trainer(net)
    amp.init_trainer(trainer, init_scale=2.0, min_scale=1.0)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, "mxamp"):
        warnings.simplefilter("always")
        for _ in range(4):
            train_step(net, trainer, [mx.cpu(0)], poison=("grad", 0))
    stuck = [w for w in caught if "min_scale" in str(w.message)]
    assert len(stuck) == 1, "warn exactly once, got %d" % len(stuck)
    assert "net_dense0_weight" in str(stuck[0].message), "the warning must name the parameter"
    hook = trainer._amp_loss_scaler
    assert hook.loss_scale == 1.0 and hook.skipped_steps == 4, hook
    assert "loss scale 2 -> 1 (overflow)" in caplog.text, "scale changes are logged"
    assert hook.scale_history == [(1, 1.0, "overflow")]
