"""Loss-output operators under AMP (``SoftmaxOutput`` and the others whose backward ignores the
incoming gradient and applies ``grad_scale``): their gradient follows the trainer's loss scale,
and under ``amp.init`` a float16 ``SoftmaxOutput`` trains like float32 (split from
``test_trainer.py``).
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from mxamp import amp
from mxamp.patching.loss_outputs import wrap_loss_output

INF = float("inf")
SOFTMAX_OUTPUT = {mx.nd: wrap_loss_output(mx.nd.SoftmaxOutput, "SoftmaxOutput", False),
                  mx.sym: wrap_loss_output(mx.sym.SoftmaxOutput, "SoftmaxOutput", True)}


def _backward(out, trainer, use_amp):
    """Backward from ``out``, through AMP's loss scaling where ``use_amp``."""
    if use_amp:
        with amp.scale_loss(out, trainer) as scaled:
            autograd.backward(scaled)
    else:
        autograd.backward(out)


class SoftmaxNet(gluon.HybridBlock):
    def __init__(self, wrapped, **kwargs):
        super().__init__(**kwargs)
        self.wrapped = wrapped
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x, label):
        op = SOFTMAX_OUTPUT[F] if self.wrapped else F.SoftmaxOutput
        return op(self.dense(x), label, grad_scale=0.5)


@pytest.mark.parametrize("hybridize", [False, True, "static"])
def test_loss_output_gradient_follows_the_scale(hybridize):
    def run(use_amp):
        mx.random.seed(3)
        net = SoftmaxNet(wrapped=use_amp)
        net.initialize(mx.init.Xavier())
        if hybridize:
            net.hybridize(static_alloc=hybridize == "static", static_shape=hybridize == "static")
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5},
                                kvstore=None)
        if use_amp:
            amp.init_trainer(trainer, init_scale=2.0 ** 12, growth_interval=2)
        rng = np.random.RandomState(0)
        for step in range(5):
            x = mx.nd.array(rng.randn(8, 4))
            label = mx.nd.array(rng.randint(0, 3, size=8))
            with autograd.record():
                _backward(net(x, label), trainer, use_amp)
            trainer.step(8)
        if use_amp:
            assert trainer._amp_loss_scaler.loss_scale == 2.0 ** 14, "scale grew twice"
        return net.dense.weight.data().asnumpy()
    # power-of-two scales (2^12..2^14) unscale exactly: bit for bit (measured, every class)
    np.testing.assert_array_equal(run(True), run(False),
                                  err_msg="grad_scale must be multiplied by the live loss scale")


@pytest.mark.filterwarnings("ignore:mxamp. FullyConnected has no float16 kernel")
@pytest.mark.parametrize("hybridize", [False, True])
def test_under_amp_init_float16_softmax_output_trains_like_fp32(amp_off, hybridize):
    """amp.init wraps SoftmaxOutput with wrap_loss_output; Dense stays fp32 on CPU."""
    from mxamp.patching import patcher as patching

    class Net(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.dense = gluon.nn.Dense(3, in_units=4)

        def hybrid_forward(self, F, x, label):
            return F.SoftmaxOutput(self.dense(x), label)

    def run(use_amp):
        mx.random.seed(5)
        net = Net()
        net.initialize(mx.init.Xavier())
        if hybridize:
            net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5},
                                kvstore=None)
        if use_amp:
            amp.init_trainer(trainer, growth_interval=2)
        rng = np.random.RandomState(1)
        for step in range(5):
            x, label = mx.nd.array(rng.randn(8, 4)), mx.nd.array(rng.randint(0, 3, size=8))
            if use_amp and step == 2:
                x[0, 0] = INF    # SoftmaxOutput ignores head gradients: poison the input
            with autograd.record():
                _backward(net(x, label), trainer, use_amp)
            if use_amp or step != 2:
                trainer.step(8)
        return net.dense.weight.data().asnumpy(), trainer
    expected, _ = run(use_amp=False)
    amp.init(target_dtype="float16")
    got, trainer = run(use_amp=True)
    patching.reset()
    hook = trainer._amp_loss_scaler
    assert hook.scale_history == [(2, 2.0 ** 17, "growth"), (3, 2.0 ** 16, "overflow"),
                                  (5, 2.0 ** 17, "growth")], hook.scale_history
    # power-of-two scales unscale exactly: bit for bit (measured, every class)
    np.testing.assert_array_equal(got, expected,
                                  err_msg="AMP run (one skipped step) must match fp32 training")
