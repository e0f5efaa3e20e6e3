"""O2: train a whole Gluon model in low precision, with float32 master weights in the optimizer.

:func:`cast_model` does in one call what GluonCV's Faster/Mask R-CNN scripts do by hand with
``net.cast('float16')``: the parameters of every layer are cast to the target dtype, except
normalisation layers, the layers the user excludes and those the CPU class trains in float32
whatever their data (by their channel counts: :mod:`mxamp.conversion.o2_layers`), which keep
float32 parameters. Then:

* BatchNorm (and SyncBatchNorm) takes low-precision data with its float32 gamma/beta/statistics
  directly (its CPU and GPU kernels accept the mix; measured for bfloat16 on CPU, both ways).
* LayerNorm, GroupNorm, InstanceNorm, excluded layers and (bfloat16) Embedding and Dropout,
  which have no bfloat16 CPU kernel, compute in float32: their input is cast to float32 and
  their output back to the target, so activations keep one dtype.
* Data entering the model in another float dtype (float32, float64, ...) is cast to the target
  at the model's input; integer inputs pass unchanged (give token ids as int32: float ids
  above 256 do not survive a bfloat16 cast).
* The model's outputs come back in float32 (``output_dtype=None`` keeps the target dtype).
* Layers whose shapes a CPU class must not run in low precision (on ``amx``, the 1x1
  convolutions that corrupt the heap: :mod:`mxamp.lists.bfloat16`) compute in float32 on
  those calls; graphs get the plan's treatments, and where float32 layers meet, no value is
  rounded only to be widened again (:func:`~mxamp.runtime.hooks.leave_graph_treatments`).

What runs depends on the device (:mod:`mxamp.precision.device_plan`). On a CPU without bfloat16
kernels (class 'none'), ``cast_model(net, 'bfloat16')`` keeps bfloat16 *storage* with float32
*compute*: weights round as on a bfloat16 CPU, but it runs *slower* than float32 (MNIST's O2:
2.8x float32's time on an AVX2 EPYC) and can hold more memory (the benchmark's MLP: 1.13x under
``DNNL_MAX_CPU_ISA=AVX2``, as autograd keeps each float32 weight copy). One warning says so.
``'auto'``: float16 on a GPU, bfloat16 where it pays, else float32 (logged). Where the model
computes bfloat16 or has blocks that are not hybrid, ``amp.cast_model`` puts ``amp.init`` in force;
train with ``amp.init_trainer`` (float32 masters, float16 loss scaling) and ``scale_loss``.

>>> import mxnet as mx
>>> net = mx.gluon.nn.HybridSequential()
>>> net.add(mx.gluon.nn.Dense(8), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Dense(2))
>>> net.initialize()
>>> net = cast_model(net, 'bfloat16', example_inputs=mx.nd.ones((2, 4)))  # amp.cast_model
>>> net[0].weight.dtype == dtypes.BFLOAT16, net[1].gamma.dtype
(True, <class 'numpy.float32'>)
>>> net(mx.nd.ones((2, 4))).dtype
<class 'numpy.float32'>
"""
import functools
import logging

import mxnet as mx
from mxnet.gluon import Block, HybridBlock, nn

from mxamp.backend.devices import device_of
from mxamp import dtypes
from mxamp.precision import plan
from mxamp.runtime.casting import cast
from mxamp.conversion.o2_layers import (MIXED_INPUT_NORMS, cast_nested, fp32_compute,
                                        fp32_island, fp32_where, layer_conditions,
                                        trains_in_float32)
from mxamp.runtime.depthwise_graphs import FLOAT32_GRAPH, TREATMENT_ATTR
from mxamp.runtime.hooks import (fix_astype, hook_block_graphs, keep_dtype_when_contexts_average,
                                 leave_graph_treatments)
from mxamp.errors import AmpArgumentError, as_input_tuple
from mxamp.lists.float16 import NO_CPU_KERNEL, NO_CPU_KERNEL_WHY
from mxamp.conversion.graph import block_context
from mxamp.backend.mxnet_private import (BlockView, ParamView, convolution_groups,
                                         to_default_layout)
from mxamp.runtime.state import STATE

LOG = logging.getLogger(__name__)

#: Layers computed in float32 between casts, per target: normalisations without a
#: mixed-dtype kernel, and (bfloat16) layers whose CPU kernel is missing or crashes.
FP32_LAYERS = {
    "float16": (nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm),
    "bfloat16": (nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm, nn.Embedding, nn.Dropout),
}
#: The operator each GEMM-like Gluon layer runs (a fact of Gluon; which of them lack a float16
#: CPU kernel is the op lists' data, ``mxamp.lists.float16.NO_CPU_KERNEL``).
_LAYER_OPS = ((nn.Dense, "FullyConnected"), ((nn.Conv1D, nn.Conv2D, nn.Conv3D), "Convolution"),
              ((nn.Conv1DTranspose, nn.Conv2DTranspose, nn.Conv3DTranspose), "Deconvolution"),
              ((mx.gluon.rnn.RNN, mx.gluon.rnn.LSTM, mx.gluon.rnn.GRU), "RNN"))


def cast_tensor(x, dtype_name):
    """Cast one NDArray/Symbol (legacy or numpy interface) if it is a float of another dtype.

    Integer tensors pass through; float64 goes through float32. (:func:`mxamp.runtime.casting.cast`.)

    >>> cast_tensor(mx.nd.ones((1,), dtype='float64'), 'bfloat16').dtype == dtypes.BFLOAT16
    True
    """
    return cast(x, dtype_name)


def _cast_parameter(param, dtype_name):
    """Parameter.cast, but for every dtype and interface (``astype`` cannot make numpy bf16)."""
    view = ParamView(param)
    view.dtype = dtypes.to_mx(dtype_name)
    # Parameter.cast keeps the graph variable made earlier, which declares the old dtype. A
    # graph built on it under amp.init holds a copy of every weight, and one of its gradient
    # (measured: +88 MB on a 23 M-parameter MLP); a fresh variable declares the new dtype.
    view.var = None
    if view.data is None:
        return
    with mx.autograd.pause():
        # a float32 inference pass may leave a weight in oneDNN's blocked layout, which
        # amp_cast cannot turn into bfloat16 (mxnet_private.to_default_layout says more)
        view.data = [cast(to_default_layout(d), dtype_name) for d in view.data]
        if view.grad is not None:
            view.grad = [cast(g, dtype_name) for g in view.grad]
            mx.autograd.mark_variables(view.data, view.grad, param.grad_req)


def _model_boundary(block, target, output_dtype):
    """Cast float inputs to the target where they enter the model, outputs where they leave."""
    inner = block.forward

    @functools.wraps(inner)
    def forward(*args):
        out = inner(*cast_nested(args, target))
        return out if output_dtype is None else cast_nested(out, output_dtype)
    block.forward = forward


def _all_blocks(block):
    out = [block]
    for child in BlockView(block).children.values():
        out.extend(_all_blocks(child))
    return out


def _plan(block, target, excluded):
    """Split the model into (low-precision blocks, float32 islands), islands' subtrees included."""
    low, islands = [], []

    def visit(b):
        if b in excluded or isinstance(b, FP32_LAYERS[target]):
            islands.append(b)  # its children compute in float32 with it
            return
        low.append(b)   # normalisation layers too: they take low-precision data
        for child in BlockView(b).children.values():
            visit(child)
    visit(block)
    return low, islands


def _matches(block, rule):
    if isinstance(rule, (Block, type)):
        return block is rule if isinstance(rule, Block) else isinstance(block, rule)
    return rule in (block.name, block.prefix, block.prefix.rstrip("_"))


def _check_exclude(exclude):
    exclude = [] if exclude is None else exclude
    if isinstance(exclude, (str, Block, type)):
        exclude = [exclude]
    if not isinstance(exclude, (list, tuple, set)):
        raise AmpArgumentError("exclude must be a list of Blocks, Block classes or block names, "
                               "got %s" % type(exclude).__name__)
    for rule in exclude:
        ok = isinstance(rule, (str, Block)) or (isinstance(rule, type) and issubclass(rule, Block))
        if not ok:
            raise AmpArgumentError("exclude entries must be Blocks, Block classes or block "
                                   "names (str), got %r" % (rule,))
    return list(exclude)


def _finish_init(block, example_inputs):
    pending = [p.name for p in block.collect_params().values() if ParamView(p).data is None]
    if pending and example_inputs is None:
        raise RuntimeError(
            "parameters %s are not initialised yet (deferred initialisation waits for the first "
            "forward pass): call block.initialize() and run block(x) once, or pass "
            "example_inputs=<a batch> to cast_model" % ", ".join(pending[:3]))
    if pending and not _infer_shapes(block, as_input_tuple(example_inputs)):
        with mx.autograd.pause():
            block(*as_input_tuple(example_inputs))


def _infer_shapes(block, inputs):
    """Give deferred parameters their shapes by MXNet's shape inference on the block's graph,
    without a forward pass (which would hold the example batch's activations at cast_model's
    peak: +480 MB on ResNet-50 at batch 16). False where the block cannot be traced."""
    if not isinstance(block, HybridBlock):
        return False
    try:
        block.infer_shape(*inputs)
        for view in (ParamView(p) for p in block.collect_params().values()):
            if view.data is None:
                view.finish_deferred_init()
    except Exception:  # pylint: disable=broad-except  (any block the tracer cannot take)
        return False
    finally:
        BlockView(block).clear_cached_op()   # its graph declares the float32 parameters
    return True


def cast_model(block, target_dtype="bfloat16", exclude=None, output_dtype="float32",
               example_inputs=None, route_operators=None):
    """Cast a Gluon model for whole-model low-precision training (O2), in place; return it.

    Parameters
    ----------
    block : gluon.Block
        An initialised model (with ``example_inputs``, deferred initialisation is finished first).
    target_dtype : 'bfloat16' (CPU or GPU), 'float16' (GPU) or 'auto'
        'auto': float16 on a GPU, bfloat16 on a CPU that computes it natively, else the model
        is left in float32. On a CPU with no bfloat16 kernels, 'bfloat16' means bfloat16
        storage with float32 compute (see the module doc).
    exclude : list of Block, Block class or str, optional
        Layers kept in float32: the Block objects themselves, every layer of a class, or names
        (``block.name`` such as ``'resnetv10_dense0'`` or its prefix ``'resnetv10_dense0_'``).
        Normalisation layers are always kept (see the module doc).
    output_dtype : str or None, default 'float32'
        dtype of the outputs; None leaves them in the dtype they were computed in.
    example_inputs : NDArray or tuple of NDArrays, optional
        A batch to run once (no gradient) when parameters still wait for deferred init.
    route_operators : callable, optional
        Called with the target where no ``amp.init`` is in force and the model computes bfloat16
        or has blocks it cannot wrap (``amp.cast_model`` passes ``amp.init``); else a warning.

    Raises ``TypeError`` for a non-Block or a bad ``exclude`` entry, ``ValueError`` for a bad dtype
    or an exclude name matching no layer, and ``RuntimeError`` for a model cast twice, for
    uninitialised parameters, or for float16 on a CPU (no float16 GEMM/convolution kernels).

    >>> net = mx.gluon.nn.Dense(3, in_units=4)
    >>> net.initialize()
    >>> cast_model(net, 'bfloat16').weight.dtype == dtypes.BFLOAT16
    True
    """
    requested, output_dtype, exclude = _checked_arguments(block, target_dtype, output_dtype, exclude)
    excluded = _excluded_blocks(block, exclude)
    _finish_init(block, example_inputs)
    amp_plan = plan.make(requested, [device_of(block_context(block))])
    target, here = amp_plan.target, amp_plan.primary
    # describe() says why: float32 compute, or a float32 treatment of depthwise graphs
    if (requested == dtypes.AUTO and not here.low_precision) or (
            here.depthwise_graphs == FLOAT32_GRAPH
            and any(convolution_groups(b) > 1 for b in _all_blocks(block))):
        LOG.info("mxamp: cast_model: %s; the model stays float32", amp_plan.describe())
        return block
    low, islands = _plan(block, target, excluded)
    _check_device(block, target, low)
    amp_plan.announce(stacklevel=4)  # from here: stacklevel counts frames up to the user's call
    compute = target if here.low_precision else "float32"
    leave_graph_treatments(block, here, compute if compute != "float32" else "")  # by the hook
    opaque = _cast_low_precision_blocks(low, target, compute, here.fp32_when)
    _install_casts(block, islands, compute, output_dtype)
    block._mxamp_o2_target = target
    if STATE.target != target:
        _route_or_warn(target, compute, opaque, route_operators)
    return block


def _checked_arguments(block, target_dtype, output_dtype, exclude):
    """cast_model's (requested dtype, output dtype or None, exclude rules); bad ones raise."""
    if not isinstance(block, Block):
        raise AmpArgumentError("cast_model needs a gluon Block, got %s" % type(block).__name__)
    requested = dtypes.normalize_request(target_dtype)
    if output_dtype is not None:
        output_dtype = dtypes.name_of(output_dtype)
    exclude = _check_exclude(exclude)
    if getattr(block, "_mxamp_o2_target", None):
        raise RuntimeError("this model was already cast to %s by cast_model; build a fresh model "
                           "to cast it again" % block._mxamp_o2_target)
    return requested, output_dtype, exclude


def _excluded_blocks(block, exclude):
    """The blocks of the model that ``exclude`` matches; a rule matching none is a mistake."""
    blocks = _all_blocks(block)
    unmatched = [r for r in exclude if not any(_matches(b, r) for b in blocks)]
    if unmatched:
        raise AmpArgumentError(
            "exclude entries match no layer of the model: %s (layer names: %s)"
            % (", ".join(map(str, unmatched)), ", ".join(b.name for b in blocks[:6])))
    return [b for b in blocks if any(_matches(b, r) for r in exclude)]


def _cast_low_precision_blocks(low, target, compute, fp32_when):
    """Cast the float parameters of the ``low`` blocks to ``target`` and wrap the blocks that
    must compute in float32 (all of them with ``compute`` float32, else where a shape rule of
    ``fp32_when`` holds); return the names of those that cannot be wrapped (not hybrid)."""
    opaque = []
    for lp_block in low:
        conditions = layer_conditions(lp_block, fp32_when) if compute != "float32" else ()
        rules = conditions if isinstance(lp_block, HybridBlock) else ()
        keep = isinstance(lp_block, MIXED_INPUT_NORMS) or (
            bool(rules) and trains_in_float32(lp_block, rules))  # float32 parameters
        float_params = [p for p in BlockView(lp_block).own_params.values()
                        if dtypes.is_float(p.dtype) and not keep]
        for param in float_params:
            _cast_parameter(param, target)
        if float_params and compute == "float32" and not fp32_compute(lp_block):
            opaque.append(lp_block.name)
        if rules:
            fp32_where(lp_block, rules, compute, float32_params=keep)
    return opaque


def _install_casts(block, islands, compute, output_dtype):
    """Wrap the float32 islands and the model's boundary in casts, and drop cached graphs so
    that the next call builds them with the casts."""
    for island in islands:
        fp32_island(island, compute)
    _model_boundary(block, compute, output_dtype)
    hook_block_graphs(block.__dict__.get(TREATMENT_ATTR))  # shapes for _fp32_where; treatment
    keep_dtype_when_contexts_average()
    fix_astype()  # outputs kept in bfloat16 (output_dtype=None) convert with astype
    block.apply(lambda b: BlockView(b).clear_cached_op() if isinstance(b, HybridBlock)
                else None)


def _route_or_warn(target, compute, opaque, route_operators):
    """No ``amp.init`` for this target: have it route the operators cast_model cannot wrap."""
    if route_operators is not None and not STATE.patched and (opaque or compute == "bfloat16"):
        route_operators(target)   # another amp.init in force stays: a process runs one
    elif opaque:
        LOG.warning("mxamp: cast_model(%s): %s are not HybridBlocks, so their %s parameters "
                    "reach their operators as they are, and this CPU has no %s kernels. Call "
                    "amp.init(%r) as well to compute those operators in float32.",
                    target, ", ".join(opaque), target, target, target)
    elif compute != "float32":
        LOG.warning("mxamp: cast_model(%s) without amp.init(target_dtype=%r): operators that "
                    "hybrid_forward calls directly (F.batch_dot, F.transpose, F.LayerNorm, ...) "
                    "now get %s inputs; some have no %s kernel, and a bfloat16 transpose corrupts "
                    "the heap. amp.init(%r) (after amp.reset()) routes them.", *[target] * 5)


def _check_device(block, target, lp_leaves):
    if target != "float16":
        return
    on_cpu = any(dtypes.is_cpu(ctx) for p in block.collect_params().values()
                 for ctx in p.list_ctx())
    no_kernel = sorted({type(b).__name__ for b in lp_leaves for layers, op in _LAYER_OPS
                        if isinstance(b, layers) and op in NO_CPU_KERNEL})
    if on_cpu and no_kernel:
        raise RuntimeError(
            "float16 %s layers cannot run on a CPU (%s): move the model to a GPU first "
            "(block.reset_ctx(mx.gpu(0))), or use target_dtype='bfloat16' on a CPU"
            % (", ".join(no_kernel), NO_CPU_KERNEL_WHY))
