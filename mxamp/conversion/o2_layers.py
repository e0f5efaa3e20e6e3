"""How one layer computes under O2 (:func:`mxamp.conversion.o2.cast_model`): in float32
between casts (islands, and the layers of a CPU without bfloat16 kernels), and in float32
on the calls where its CPU class's shape rules hold (:mod:`mxamp.lists.bfloat16`).

A layer whose rules hold on every training call keeps float32 parameters
(:func:`trains_in_float32`): its rules name only its parameters and channel counts, which its
weights tell once initialised. Casting those parameters to the target would only have the
graph widen each of them again at every step, and the optimizer round a float32 master copy
into them: a GluonCV ShuffleNet V2 O2 training step (58/116/232 channels, all trained in
float32 on the classes without AMX; batch 8 at 112 px, Zen 4, mx.profiler) ran 397
``amp_cast`` with bfloat16 weights there, 14 with float32 ones.

>>> import mxnet as mx
>>> from mxamp.lists import Condition
>>> rule = Condition((('training', ('True',)), ('in_channels', ('!%16',))))
>>> conv = mx.gluon.nn.Conv2D(24, 3, in_channels=24); conv.initialize()
>>> trains_in_float32(conv, (rule,)), trains_in_float32(mx.gluon.nn.Conv2D(24, 3, in_channels=32), (rule,))
(True, False)
"""
import functools

import mxnet as mx
from mxnet.gluon import HybridBlock, nn

from mxamp.backend.graphs import symbol_data_shape
from mxamp.backend.mxnet_private import BlockView, convolution_groups
from mxamp.lists.conditions import normalize_value
from mxamp.runtime.casting import cast
from mxamp.runtime.hooks import building_input_shapes

#: Layers whose parameters stay float32 and that take low-precision data as is.
MIXED_INPUT_NORMS = (nn.BatchNorm, nn.BatchNormReLU)  # SyncBatchNorm subclasses BatchNorm


def cast_nested(value, dtype_name):
    """``value`` (a tensor, or lists and tuples of them) with its float tensors in
    ``dtype_name`` (:func:`mxamp.runtime.casting.cast`)."""
    if isinstance(value, (list, tuple)):
        return type(value)(cast_nested(v, dtype_name) for v in value)
    return cast(value, dtype_name)


def fp32_island(block, target):
    """Make ``block`` compute in float32 between casts: float32 in, ``target`` dtype out."""
    inner = block.hybrid_forward if isinstance(block, HybridBlock) else block.forward

    if isinstance(block, HybridBlock):
        @functools.wraps(inner)
        def hybrid_forward(F, *args, **params):
            return cast_nested(inner(F, *cast_nested(args, "float32"), **params), target)
        block.hybrid_forward = hybrid_forward
    else:
        @functools.wraps(inner)
        def forward(*args):
            return cast_nested(inner(*cast_nested(args, "float32")), target)
        block.forward = forward


def fp32_compute(block):
    """bfloat16 storage, float32 compute: ``block`` casts its inputs and parameters to float32.

    For a CPU with no bfloat16 kernels. Only a HybridBlock's parameters can be intercepted (they
    reach ``hybrid_forward`` as arguments); returns False for other blocks."""
    if not isinstance(block, HybridBlock):
        return False
    inner = block.hybrid_forward

    @functools.wraps(inner)
    def hybrid_forward(F, *args, **params):
        return _in_float32(inner, F, args, params)
    block.hybrid_forward = hybrid_forward
    return True


def _in_float32(hybrid_forward, F, args, params, cast_params=True):
    """``hybrid_forward`` called with its inputs and (unless told not to) parameters in float32."""
    params = {k: cast(v, "float32") for k, v in params.items()} if cast_params else params
    return hybrid_forward(F, *cast_nested(args, "float32"), **params)


def layer_conditions(block, fp32_when):
    """The conditions under which this CPU class computes ``block``'s op in float32 (a Gluon
    layer names its op in ``_op_name`` and its parameters in ``_kwargs``)."""
    op = "BatchNorm" if isinstance(block, MIXED_INPUT_NORMS) else getattr(block, "_op_name", None)
    return fp32_when.get(op, ()) if op else ()


def _in_channels(block):
    """The channel count of ``block``'s data, from its initialised weights, or None."""
    params = BlockView(block).own_params
    if isinstance(block, MIXED_INPUT_NORMS):
        shape = params["gamma"].shape if "gamma" in params else ()
        return shape[0] if shape and shape[0] else None
    weight = params.get("weight")
    if weight is None or not weight.shape or len(weight.shape) < 2 or not weight.shape[1]:
        return None
    return weight.shape[1] * convolution_groups(block)


def trains_in_float32(block, conditions):
    """True where one of ``conditions`` holds on every training call of ``block``: one that
    tests only its parameters, its channel count and the context (not its spatial size)."""
    channels = _in_channels(block)
    if not channels:
        return False
    attrs = dict(getattr(block, "_kwargs", {}))
    kernel = normalize_value(attrs.get("kernel", (1, 1)))
    shape = [1] * (2 + (len(kernel) if isinstance(kernel, tuple) else 2))
    layout = str(attrs.get("layout") or "")
    shape[layout.index("C") if "C" in layout else 1] = channels
    return any(c.holds(attrs, tuple(shape), True) for c in conditions
               if all(name != "spatial_size" for name, _ in c.tests))


def fp32_where(block, conditions, target, float32_params=False):
    """Make ``block`` compute in float32 between casts on the calls where one of
    ``conditions`` holds (its shapes are seen at call time, or inferred while a hybridized
    graph is built; unknown shapes count as the condition says). ``float32_params``: the
    layer keeps float32 parameters (:func:`trains_in_float32`), cast to ``target`` on the
    other calls."""
    inner = block.hybrid_forward
    attrs = dict(getattr(block, "_kwargs", {}))
    norm = isinstance(block, MIXED_INPUT_NORMS)   # parameters float32, statistics mutable

    @functools.wraps(inner)
    def hybrid_forward(F, x, *args, **params):
        shape = x.shape if isinstance(x, mx.nd.NDArray) else symbol_data_shape(x, building_input_shapes())
        if not any(c.holds(attrs, shape, mx.autograd.is_recording()) for c in conditions):
            if float32_params and not norm:
                params = {k: cast(v, target) for k, v in params.items()}
            return inner(F, x, *args, **params)
        fp32 = _in_float32(inner, F, (x,) + args, params, not (norm or float32_params))
        return cast_nested(fp32, target)
    block.hybrid_forward = hybrid_forward
