"""Loss-output ops (``SoftmaxOutput``, ``LinearRegressionOutput``, ...) under loss scaling.

These ops ignore the gradient coming from above: their backward writes
``(prediction - label) * grad_scale`` directly. Multiplying the loss by the loss scale
therefore does not scale their gradient, while the optimizer still divides by the scale, so
training would crawl or diverge (Sockeye's SGD runs do). Their gradient must be multiplied by
the loss scale of the trainer that owns the step:

* imperative calls (``mx.nd.SoftmaxOutput``, non-hybridized blocks): ``grad_scale`` is
  multiplied by the current scale at call time. Free, and the scale cannot change between a
  step's forward and backward (it changes only inside ``trainer.step``).
* symbolic calls (hybridized blocks, ``mx.sym`` graphs, Module): a graph keeps whatever
  ``grad_scale`` it was built with, and the scale changes during training. So the op's
  ``data`` input goes through a pass-through node (the custom op ``_mxamp_loss_scale_grad``)
  whose backward multiplies the gradient by the scale read at backward time. A cached graph
  thus stays right at every scale, without rebuilding. The price is one copy of the op's
  input in forward and backward, and a graph exported from such a block holds the node, so
  loading it needs ``import mxamp.patching.loss_outputs`` (which registers the op).

"The right trainer" is the one whose ``amp.scale_loss`` is active in the calling thread, else
the trainer most recently passed to ``amp.init_trainer`` (see
:meth:`mxamp.runtime.state.ProcessState.current_scaler`). With no trainer, the op is unchanged.

>>> import mxnet as mx
>>> softmax_output = wrap_loss_output(mx.nd.SoftmaxOutput, 'SoftmaxOutput', False)
>>> softmax_output(mx.nd.zeros((1, 2)), mx.nd.zeros((1,))).shape
(1, 2)
"""
import functools

import mxnet as mx

from mxamp.runtime.state import STATE

_GRAD_SCALE_POSITION = 2   # (data, label, grad_scale, ...) for every loss-output op
_OP_TYPE = "_mxamp_loss_scale_grad"


def _current_scale():
    scaler = STATE.current_scaler()
    return 1.0 if scaler is None else float(scaler.loss_scale)


def wrap_loss_output(fn, op_name, is_symbol):
    """Return ``fn`` wrapped so its gradient follows the loss scale (see module docstring).

    ``fn`` is an ``mx.nd`` op function (``is_symbol=False``) or an ``mx.sym`` one
    (``is_symbol=True``) of a loss-output op taking ``(data, label, grad_scale, ...)``.

    >>> import mxnet as mx
    >>> wrap_loss_output(mx.sym.SoftmaxOutput, 'SoftmaxOutput', True).__name__
    'SoftmaxOutput'
    """
    if is_symbol:
        @functools.wraps(fn)
        def symbolic(*args, **kwargs):
            args = list(args)
            if args:
                args[0] = _scale_grad_node(args[0])
            elif kwargs.get("data") is not None:
                kwargs["data"] = _scale_grad_node(kwargs["data"])
            return fn(*args, **kwargs)
        symbolic.mxamp_loss_output = op_name
        return symbolic

    @functools.wraps(fn)
    def imperative(*args, **kwargs):
        scale = _current_scale()
        if scale != 1.0:
            if len(args) > _GRAD_SCALE_POSITION:
                args = list(args)
                args[_GRAD_SCALE_POSITION] = float(args[_GRAD_SCALE_POSITION]) * scale
            else:
                kwargs["grad_scale"] = float(kwargs.get("grad_scale", 1.0)) * scale
        return fn(*args, **kwargs)
    imperative.mxamp_loss_output = op_name
    return imperative


def _scale_grad_node(data):
    return mx.sym.Custom(data, op_type=_OP_TYPE, name=None)


class _LossScaleGrad(mx.operator.CustomOp):
    """Identity forward; backward multiplies the incoming gradient by the live loss scale."""

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        scale = _current_scale()
        self.assign(in_grad[0], req[0], out_grad[0] * scale if scale != 1.0 else out_grad[0])


@mx.operator.register(_OP_TYPE)
class _LossScaleGradProp(mx.operator.CustomOpProp):
    """Shape/type pass-through for :class:`_LossScaleGrad`."""

    def __init__(self):
        super().__init__(need_top_grad=True)

    def list_arguments(self):
        return ["data"]

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def infer_type(self, in_type):
        return in_type, [in_type[0]], []

    def create_operator(self, ctx, in_shapes, in_dtypes):
        return _LossScaleGrad()
