"""float32 master weights: float16 weights through MXNet's multi-precision kernels, bfloat16
weights through mxamp's MasterWeightUpdater; both train, skip and checkpoint correctly.

The bfloat16 models are made with ``amp.cast_model``, so their parameters are bfloat16 on every
CPU: they compute in bfloat16 where oneDNN has the kernels and in float32 where it has none
(class 'none'); the master-weight path under test is the same on both."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from mxamp import amp, dtypes
from mxamp.training import optimizers

pytestmark = pytest.mark.cpu_class

OPTIMIZERS = [("sgd", {}), ("sgd", {"momentum": 0.9}), ("nag", {"momentum": 0.9}),
              ("adam", {}), ("lamb", {})]
LEARNING_RATES = {"sgd": 0.05, "nag": 0.05, "adam": 0.05, "lamb": 0.05}


def as_fp32(array):
    return mx.nd.amp_cast(array, dtype="float32").asnumpy()


#: Where MXNet 1.9 keeps a float16 weight's float32 master in its multi-precision state
#: (``mxnet/optimizer/optimizer.py``, ``create_state_multi_precision``): SGD and NAG return
#: ``(state, master)``, the base Optimizer that Adam and LAMB use ``(master, state)``.
FLOAT16_MASTER_AT = {"sgd": 1, "nag": 1, "adam": 0, "lamb": 0}


def float16_master(trainer, index, name):
    """The float32 master of float16 parameter ``index``, read where MXNet keeps it."""
    state = trainer._updaters[0].states[index]
    assert isinstance(state, tuple) and len(state) == 2, (
        "%s: a float16 weight's state %r is not MXNet's (state, master) pair" % (name, state))
    return state[FLOAT16_MASTER_AT[name]]


# ----- float16 weights: MXNet's mp kernels, driven by the mxamp scaler -----
def fp16_problem(seed=0):
    rng = np.random.RandomState(seed)
    true_w = rng.uniform(-1, 1, size=(8,))
    x = rng.uniform(-1, 1, size=(64, 8))
    y = x @ true_w
    return mx.nd.array(x, dtype="float16"), mx.nd.array(y, dtype="float16")


def fp16_loss(w, x, y):
    # Elementwise ops only: MXNet has no float16 CPU kernel for FullyConnected/dot.
    pred = mx.nd.sum(x * w.reshape((1, -1)), axis=1)
    return mx.nd.mean(mx.nd.square(pred - y)).astype("float32")


@pytest.mark.parametrize("name, extra", OPTIMIZERS)
def test_float16_weights_train_with_float32_masters(seed, name, extra):
    w = gluon.Parameter("w", shape=(8,), dtype="float16", init=mx.init.Zero())
    w.initialize()
    trainer = gluon.Trainer([w], name, dict(learning_rate=LEARNING_RATES[name],
                                            multi_precision=True, **extra), kvstore=None)
    amp.init_trainer(trainer, init_scale=2.0 ** 8)
    x, y = fp16_problem()
    losses = []
    for _ in range(40):
        with autograd.record():
            loss = fp16_loss(w.data(), x, y)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
        losses.append(float(loss.asscalar()))
    # last over first loss, Zen 4 (alike on native, emulated, none: float16 computes in MXNet's
    # own kernels): SGD 0.047, momentum 0.0026, NAG 0.0007, Adam 0.0061, LAMB 0.149; 0.2 is
    # 1.3x the worst
    assert losses[-1] < 0.2 * losses[0], "%s: loss %g -> %g did not drop" % (
        name, losses[0], losses[-1])
    master = float16_master(trainer, 0, name)
    assert master.dtype == np.float32 and w.data().dtype == np.float16, (master.dtype, name)
    assert np.array_equal(master.astype("float16").asnumpy(), w.data().asnumpy()), \
        "the float16 weight must be the cast of its float32 master"


def test_float16_weights_get_float32_masters_without_asking():
    """O2's design for either target: a float16 weight gets a float32 master although the
    optimizer was made without ``multi_precision`` (MXNet's default). 60 steps of 1e-4 from
    1.0: float16's spacing below 1.0 is 2**-11, so an update in place would round back to 1.0
    every time; the master follows float32 arithmetic, computed here with numpy."""
    p = gluon.Parameter("w", shape=(4,), dtype="float16", init=mx.init.One())
    p.initialize()
    trainer = gluon.Trainer([p], "sgd", {"learning_rate": 1e-4}, kvstore=None)
    amp.init_trainer(trainer, init_scale=2.0 ** 8)   # a gradient of 256 is exact in float16
    assert trainer._optimizer.multi_precision, "init_trainer left multi_precision off"
    expected = np.float32(1.0)
    for _ in range(60):
        with autograd.record():
            loss = mx.nd.sum(p.data().astype("float32"))
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
        expected = np.float32(expected - np.float32(1e-4))
    master = float16_master(trainer, 0, "sgd")
    assert master.dtype == np.float32, master.dtype
    # measured on the Zen 4: bit for bit (0.993999 both), as the same float32 subtractions
    assert np.array_equal(master.asnumpy(), np.full(4, expected)), (master.asnumpy(), expected)
    assert np.array_equal(p.data().asnumpy(), np.full(4, np.float16(expected))), \
        "the float16 weight must be the cast of the master, %s" % p.data().asnumpy()
    assert p.data().asnumpy()[0] < 1.0, "60 updates of 1e-4 were lost (no float32 master?)"


def test_a_float16_trainer_that_already_stepped_is_left_as_it_is(caplog):
    """MXNet's float16 states made without ``multi_precision`` hold no master; turning it on
    afterwards would make its update misread them. mxamp leaves the optimizer alone and says
    how to get masters."""
    p = gluon.Parameter("w", shape=(4,), dtype="float16", init=mx.init.One())
    p.initialize()
    trainer = gluon.Trainer([p], "sgd", {"learning_rate": 0.1}, kvstore=None)
    with autograd.record():
        loss = mx.nd.sum(p.data().astype("float32"))
    loss.backward()
    trainer.step(1)
    amp.init_trainer(trainer, init_scale=1.0)
    assert not trainer._optimizer.multi_precision
    with autograd.record():
        loss = mx.nd.sum(p.data().astype("float32"))
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    trainer.step(1)
    said = [r.getMessage() for r in caplog.records if "multi_precision=True" in r.getMessage()]
    assert len(said) == 1, "one warning for the trainer, got %s" % said
    # two float16 updates of 0.1 from 1.0 give float16(0.8) = 0.7998 (measured on the Zen 4)
    assert np.array_equal(p.data().asnumpy(), np.full(4, np.float16(0.8))), p.data().asnumpy()


# ----- bfloat16 weights: mxamp's master copies -----
def bf16_net(seed=3):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential(prefix="bf_")
    with net.name_scope():
        net.add(gluon.nn.Dense(16, in_units=6, activation="relu"), gluon.nn.Dense(1, in_units=16))
    net.initialize(mx.init.Xavier())
    return amp.cast_model(net, "bfloat16")


def bf16_data(seed=0):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, size=(128, 6)).astype(np.float32)
    y = (np.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]).astype(np.float32)
    return mx.nd.amp_cast(mx.nd.array(x), dtype=dtypes.BFLOAT16), mx.nd.array(y)


def bf16_step(net, trainer, x, y, poison=False):
    with autograd.record():
        pred = mx.nd.amp_cast(net(x), dtype="float32")
        loss = mx.nd.mean(mx.nd.square(pred - y))
        if poison:
            loss = loss * float("inf")
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    trainer.step(1)
    return float(loss.asscalar())


def bf16_trainer(net, name, extra):
    trainer = gluon.Trainer(net.collect_params(), name,
                            dict(learning_rate=LEARNING_RATES[name], **extra), kvstore=None)
    amp.init_trainer(trainer)
    return trainer


@pytest.mark.parametrize("name, extra", OPTIMIZERS)
def test_bfloat16_weights_train_with_float32_masters(name, extra):
    net = bf16_net()
    trainer = bf16_trainer(net, name, extra)
    assert isinstance(trainer._updaters[0], optimizers.MasterWeightUpdater), "installed"
    x, y = bf16_data()
    losses = [bf16_step(net, trainer, x, y) for _ in range(60)]
    # last over first loss, Zen 4 (native = emulated / none): SGD 0.112 / 0.113, momentum
    # 0.025, NAG 0.024, Adam 0.0097 / 0.010, LAMB 0.015 / 0.014; 0.25 is 2.2x the worst
    assert losses[-1] < 0.25 * losses[0], "%s: loss %g -> %g did not drop" % (
        name, losses[0], losses[-1])
    for index, param in enumerate(trainer._params):
        master = optimizers.master_weight(trainer._updaters[0], index)
        assert master.dtype == np.float32, "%s master must be float32" % param.name
        recast = mx.nd.amp_cast(master, dtype=dtypes.BFLOAT16)
        assert np.array_equal(as_fp32(recast), as_fp32(param.data())), \
            "%s: bf16 weight must equal cast(master)" % param.name
    assert trainer._optimizer.num_update == 60, "every step counted once"


def test_bfloat16_master_weights_accumulate_small_updates():
    """An update below bf16's resolution is lost without a master copy, kept with one."""
    p = gluon.Parameter("w", shape=(4,), dtype=dtypes.BFLOAT16, init=mx.init.One())
    p.initialize()
    trainer = gluon.Trainer([p], "sgd", {"learning_rate": 1e-3}, kvstore=None)
    amp.init_trainer(trainer)
    for _ in range(10):
        with autograd.record():
            loss = mx.nd.sum(mx.nd.amp_cast(p.data(), dtype="float32"))
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
    master = optimizers.master_weight(trainer._updaters[0], 0).asnumpy()
    expected = np.float32(1.0)
    for _ in range(10):   # the same float32 subtractions: bit for bit on every class (0.9900001)
        expected = np.float32(expected - np.float32(1e-3))
    assert np.array_equal(master, np.full(4, expected)), (
        "10 steps of 1e-3 must accumulate in the fp32 master: %s, not %r" % (master, expected))
    weight = as_fp32(p.data())
    recast = mx.nd.amp_cast(mx.nd.array(master), dtype=dtypes.BFLOAT16)
    assert np.array_equal(weight, as_fp32(recast)), "bf16 weight must equal cast(master)"
    assert weight[0] == 0.98828125, "bf16(0.99); without a master 1 - 1e-3 rounds back to 1.0"


def test_a_trainer_made_before_cast_model_gets_float32_masters():
    """``init_trainer`` first, ``cast_model`` after: the parameters were float32 when the
    trainer was hooked, so their masters are installed at its first step. Before, MXNet's own
    update got the bfloat16 weights ("Unknown type enum 12")."""
    mx.random.seed(3)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, in_units=6, activation="relu"), gluon.nn.Dense(1, in_units=16))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.05, "momentum": 0.9}, kvstore=None)
    amp.init_trainer(trainer)
    amp.cast_model(net, "bfloat16")
    x, y = bf16_data()
    losses = [bf16_step(net, trainer, x, y) for _ in range(30)]
    assert isinstance(trainer._updaters[0], optimizers.MasterWeightUpdater)
    # Zen 4: 0.0600 (native, emulated), 0.0603 (none) of the first loss; 0.12 is 2x that
    assert losses[-1] < 0.12 * losses[0], "loss %g -> %g" % (losses[0], losses[-1])
    for index, param in enumerate(trainer._params):
        master = optimizers.master_weight(trainer._updaters[0], index)
        assert master is not None and master.dtype == np.float32, param.name
        assert np.array_equal(as_fp32(param.data()),
                              as_fp32(mx.nd.amp_cast(master, dtype=dtypes.BFLOAT16)))


def test_bfloat16_skipped_step_leaves_masters_and_states_identical():
    net = bf16_net()
    trainer = bf16_trainer(net, "adam", {})
    x, y = bf16_data()
    bf16_step(net, trainer, x, y)
    states = trainer._updaters[0].states

    def flat():
        out = []
        for index in sorted(states):
            _, master, (mean, var) = states[index]
            out += [master.asnumpy(), mean.asnumpy(), var.asnumpy()]
        return out + [as_fp32(p.data()) for p in trainer._params]
    before, count = flat(), dict(trainer._optimizer._index_update_count)
    bf16_step(net, trainer, x, y, poison=True)
    assert trainer._amp_loss_scaler.skipped_steps == 1
    assert all(np.array_equal(a, b) for a, b in zip(before, flat())), "skip changed something"
    assert trainer._optimizer._index_update_count == count, "update counts changed on skip"


def test_bfloat16_masters_survive_save_and_load_states(tmp_path):
    fname = str(tmp_path / "bf16.states")
    net = bf16_net()
    trainer = bf16_trainer(net, "sgd", {"momentum": 0.9})
    x, y = bf16_data()
    for _ in range(3):
        bf16_step(net, trainer, x, y)
    trainer.save_states(fname)
    net.save_parameters(str(tmp_path / "bf16.params"))
    resumed_net = bf16_net(seed=11)
    resumed_net.load_parameters(str(tmp_path / "bf16.params"))
    resumed = bf16_trainer(resumed_net, "sgd", {"momentum": 0.9})
    resumed.load_states(fname)
    for _ in range(2):
        bf16_step(net, trainer, x, y)
        bf16_step(resumed_net, resumed, x, y)
    for index in range(len(trainer._params)):
        a = optimizers.master_weight(trainer._updaters[0], index).asnumpy()
        b = optimizers.master_weight(resumed._updaters[0], index).asnumpy()
        assert np.array_equal(a, b), "resumed master weights must continue identically"


def test_install_master_weights_only_for_bfloat16_trainers():
    p = gluon.Parameter("w", shape=(2,))
    p.initialize()
    trainer = gluon.Trainer([p], "sgd", kvstore=None)
    assert not optimizers.install_master_weights(trainer), "fp32 parameters need no masters"
    assert type(trainer._updaters[0]) is mx.optimizer.Updater


@pytest.mark.parametrize("kvstore", [None, "device"])
def test_bfloat16_two_contexts_skip_and_keep_masters_in_step(kvstore):
    contexts = [mx.cpu(0), mx.cpu(1)]
    mx.random.seed(0)
    net = gluon.nn.Dense(2, in_units=3, prefix="two_")
    net.initialize(ctx=contexts)
    amp.cast_model(net, "bfloat16")
    assert all(dtypes.name_of(w.dtype) == "bfloat16" for w in net.weight.list_data())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            kvstore=kvstore)
    amp.init_trainer(trainer)
    masters = []
    for step in range(3):
        with autograd.record():
            losses = [mx.nd.amp_cast(net(mx.nd.amp_cast(mx.nd.ones((2, 3), ctx=c),
                                                        dtype=dtypes.BFLOAT16)),
                                     dtype="float32").sum() for c in contexts]
            if step == 1:
                losses[1] = losses[1] * float("inf")   # only the second context overflows
            with amp.scale_loss(losses, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(4)
        index = trainer._param2idx[net.weight.name]
        masters.append([optimizers.master_weight(u, index).asnumpy() for u in trainer._updaters])
    assert trainer._amp_loss_scaler.skipped_steps == 1, "inf on cpu(1) must be caught"
    assert all(np.array_equal(a, b) for a, b in zip(masters[0], masters[1])), \
        "the skipped step must leave every context's master weights untouched"
    assert not np.array_equal(masters[1][0], masters[2][0]), "the next clean step updates"
    for updater, weight in zip(trainer._updaters, net.weight.list_data()):
        recast = mx.nd.amp_cast(optimizers.master_weight(updater, index), dtype=dtypes.BFLOAT16)
        assert np.array_equal(as_fp32(recast), as_fp32(weight)), "weight = cast(master)"


# ----- a weight larger than the float32 workspace: updated a slice at a time -----
@pytest.mark.parametrize("name, extra", [("sgd", {"momentum": 0.9, "wd": 1e-4}),
                                         ("adam", {"wd": 1e-4}), ("rmsprop", {}),
                                         ("lamb", {})])
def test_a_large_bfloat16_weight_gets_the_whole_weight_update(name, extra):
    """A (1100, 1000) weight (1.1 M values; the documented workspace is 4 MB of float32, so
    element-wise optimizers update it in two slices) ends three steps with the master, the
    bfloat16 weight and the optimizer's counts that MXNet's own float32 optimizer gives on
    the whole array, bit for bit. LAMB takes norms of the whole weight and is not sliced."""
    from mxamp.runtime.casting import WORKSPACE
    WORKSPACE.clear()
    rng = np.random.RandomState(0)
    start = rng.uniform(-1, 1, size=(1100, 1000)).astype(np.float32)
    weight = mx.nd.amp_cast(mx.nd.array(start), dtype=dtypes.BFLOAT16)
    mine = optimizers.MasterWeightUpdater(mx.optimizer.create(name, learning_rate=0.01,
                                                                **extra))
    theirs = mx.optimizer.create(name, learning_rate=0.01, **extra)
    master = mx.nd.amp_cast(weight, dtype="float32")          # what a master starts from
    state = theirs.create_state(0, master)
    for step in range(3):
        grad = mx.nd.amp_cast(mx.nd.array(rng.randn(1100, 1000)), dtype=dtypes.BFLOAT16)
        mine(0, grad, weight)
        theirs.update(0, master, mx.nd.amp_cast(grad, dtype="float32"), state)
    assert np.array_equal(optimizers.master_weight(mine, 0).asnumpy(), master.asnumpy()), \
        "%s: the master differs from MXNet's whole-array update" % name
    assert np.array_equal(as_fp32(weight), as_fp32(mx.nd.amp_cast(master,
                                                                  dtype=dtypes.BFLOAT16)))
    assert (mine.optimizer._index_update_count[0], mine.optimizer.num_update) == (3, 3), \
        "three steps counted once each"
    held = sum(b.size * 4 for b in WORKSPACE._buffers().values())
    bound = 4 * 2 ** 20 if name != "lamb" else 1100 * 1000 * 4
    assert held <= bound, "%s: the float32 workspace holds %d B" % (name, held)
