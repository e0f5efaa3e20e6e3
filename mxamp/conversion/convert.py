"""Graph conversion for low-precision inference: the ``amp.convert_*`` functions.

Each function takes a float32 model (a Symbol, a Symbol with its parameters, a Gluon
HybridBlock, or a BucketingModule) and returns a mixed-precision copy: ``amp_cast`` /
``amp_multicast`` nodes are inserted by MXNet's ``ReducePrecision`` graph pass (see
:mod:`mxamp.conversion.precision_pass`) following mxamp's op lists (:mod:`mxamp.lists`). The original
model is never modified.

What mxamp adds over ``mxnet.contrib.amp`` (``docs/migrating.md`` has the table): the block's
own context by default, ``example_inputs=``, numpy-interface blocks; unclassified ops in
float32, with a warning; an ``export`` that keeps the casts; weights stored in the dtype they
compute in (``cast_optional_params=None``); clear errors, including a float16 model run on a
CPU. What ``convert_hybrid_block`` and ``convert_bucketing_module`` build to run here never
holds an op this CPU lacks a kernel for (class 'none': float32, one warning per process);
``convert_symbol``/``convert_model`` build exactly the graph requested, to deploy elsewhere.
``target_dtype='auto'`` converts for this machine (:mod:`mxamp.precision.device_plan`).

>>> import mxnet as mx
>>> from mxamp import amp
>>> net = mx.gluon.nn.HybridSequential()
>>> net.add(mx.gluon.nn.Dense(8, activation='relu'), mx.gluon.nn.Dense(2))
>>> net.initialize()
>>> net.hybridize()
>>> lp_net = amp.convert_hybrid_block(net, 'bfloat16', example_inputs=mx.nd.ones((1, 4)))
>>> lp_net(mx.nd.ones((1, 4))).dtype
<class 'numpy.float32'>
"""
import logging

import mxnet as mx
from mxnet.gluon import HybridBlock
from mxnet.module import BucketingModule

from mxamp.backend.devices import device_of, symbol_device
from mxamp.precision.device_plan import op_summary
from mxamp import dtypes
from mxamp.precision import plan
from mxamp.runtime.casting import cast
from mxamp.runtime.hooks import fix_astype, recorded_input_shapes
from mxamp.errors import AmpArgumentError, as_input_tuple, check_name_list
from mxamp.conversion.graph import (ConvertedBlock, block_context,  # noqa: F401 - re-exported
                                    inference_block, trace_graph)
from mxamp.backend.mxnet_private import BucketingView, NumpySymbol
from mxamp.backend.graphs import CAST_OPS, graph_nodes, op_names, param_dtypes
from mxamp.conversion.precision_pass import (check_excluded, conditional_fp32_nodes,
                                             reduce_precision, shared_params_kept_float32,
                                             strip_output_casts)

_LOG = logging.getLogger(__name__)

#: Targets a CPU can compute in (float16 has no CPU GEMM/convolution kernel in MXNet 1.9.1).
CPU_TARGETS = ("bfloat16",)


def _plan(target_dtype, where, target_dtype_ops, fp32_ops, conditional_fp32_ops,
          allow_widest_overrides, policy, default_dtype):
    """The :class:`~mxamp.precision.plan.Plan` of a conversion for the devices in ``where`` (as
    ``amp.init`` makes it; the low-precision list is called ``target_dtype_ops`` here, and
    widest-list ops in the overrides are refused unless ``allow_widest_overrides``)."""
    return plan.make(target_dtype, where, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                     policy=policy, default_dtype=default_dtype,
                     low_precision_argument="target_dtype_ops",
                     allow_widest_overrides=allow_widest_overrides)


def _unlisted_ops(sym, lists):
    return sorted(op_names(sym) - lists.all_ops() - set(CAST_OPS))


def _convert(sym, lists, excluded, data_names, cast_optional_params, fp32_outputs,
             known_shapes=None):
    """convert_symbol once its arguments are checked and its op lists resolved."""
    unlisted = _unlisted_ops(sym, lists)
    if unlisted:
        _LOG.warning("ops in no %s op list run in float32: %s", lists.target, ", ".join(unlisted))
    # A conditional op is float32 where its condition holds (those nodes are excluded) and in
    # its own list elsewhere; MXNet's pass would test one parameter's exact string only.
    by_base = {}
    for op in lists.conditional_fp32:
        by_base.setdefault(lists.base_category(op), set()).add(op)
    excluded = sorted(set(excluded) | conditional_fp32_nodes(sym, lists, known_shapes))
    low_precision = set(lists.low_precision) | by_base.get("low_precision", set())
    if cast_optional_params:   # a weight read in two precisions stays float32 (tied weights)
        data_names = list(data_names) + sorted(shared_params_kept_float32(
            sym, set(sym.list_inputs()) - set(data_names), low_precision, excluded))
    converted = reduce_precision(
        sym, lists.target, low_precision=low_precision,
        fp32=set(lists.fp32) | set(unlisted) | by_base.get("fp32", set()),
        widest=set(lists.widest) | by_base.get("widest", set()), conditional_fp32=None,
        excluded=excluded, data_names=data_names, cast_params=bool(cast_optional_params))
    if not fp32_outputs:
        converted = strip_output_casts(converted, sym)
    if isinstance(sym, NumpySymbol):  # keep the numpy interface of the input
        converted = converted.as_np_ndarray()
    return converted


def convert_symbol(sym, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                   conditional_fp32_ops=None, excluded_sym_names=None, data_names=None,
                   cast_optional_params=None, fp32_outputs=True, allow_widest_overrides=False,
                   policy=None):
    """Return a mixed-precision copy of a float32 Symbol (casts inserted, the input untouched).

    Parameters mean what they mean in ``mxnet.contrib.amp.convert_symbol``: the three op lists
    replace mxamp's defaults for their category; ``excluded_sym_names`` are node names kept
    in float32; ``data_names`` are the inputs that carry data (default: the inputs without a
    ``__dtype__`` attribute); ``cast_optional_params`` types the parameters whose every consumer
    computes in the target dtype in that dtype (recorded in their ``__dtype__`` attribute)
    instead of casting them in the graph: ``True`` always, ``False`` never (the reference's
    default: float32 parameters cast at every call), ``None`` (mxamp's default) where the
    conversion computes in the target on this machine, so a model stores what it computes.
    ``fp32_outputs=False`` keeps each output in the dtype it was computed in. Naming an op of
    the widest-type list in the override lists is an ``AssertionError``, as in the reference,
    unless ``allow_widest_overrides=True``. ``conditional_fp32_ops`` puts the matching nodes
    in float32 and leaves the others in their own list (conditions: :mod:`mxamp.lists.conditions`).
    ``policy`` (mxamp's) is a :class:`~mxamp.precision.policy.Policy` from :func:`mxamp.tuning.tune`: its
    target and op-list additions apply, as in ``amp.init(policy=...)``; every ``convert_*``
    takes it. What runs where is decided by :func:`mxamp.precision.plan.make`, as for ``amp.init``.

    The graph is the one requested, whether or not this machine has kernels for it: a model to
    deploy elsewhere (a bfloat16 graph made on a CPU without bfloat16 kernels runs on an
    AVX512-BF16/AMX CPU, not here; :func:`convert_hybrid_block` builds what runs here).
    ``target_dtype='auto'`` converts for this machine: float16 with a GPU, bfloat16 on a CPU
    that computes it natively, else an unconverted float32 copy (with one log line).

    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> lp = convert_symbol(fc, 'bfloat16')
    >>> sorted(n['name'] for n in graph_nodes(lp) if n['op'] == 'amp_cast')[:2]
    ['data_amp_cast_bfloat16', 'fc_bias_amp_cast_bfloat16']
    """
    return _convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                           excluded_sym_names, data_names, cast_optional_params, fp32_outputs,
                           allow_widest_overrides, policy)


def _convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                    excluded_sym_names, data_names, cast_optional_params, fp32_outputs,
                    allow_widest_overrides, policy, known_shapes=None):
    """:func:`convert_symbol`, with the input shapes known (``convert_model``: its parameters')."""
    if not isinstance(sym, mx.sym.Symbol):
        raise AmpArgumentError("convert_symbol needs an mxnet Symbol, got %s" % type(sym).__name__)
    amp_plan = _plan(target_dtype, [symbol_device()], target_dtype_ops, fp32_ops,
                     conditional_fp32_ops, allow_widest_overrides, policy, "float16")
    lists = amp_plan.lists
    if amp_plan.requested == dtypes.AUTO:   # for this machine
        lists = amp_plan.graph_lists()
        amp_plan.announce()
    else:   # as requested, save the ops no CPU runs in the target (bfloat16 transpose: heap)
        lists = lists.computing_in_fp32(lists.fp32_on_every_cpu)
    excluded = check_name_list(excluded_sym_names, "excluded_sym_names") or []
    node_names = [n["name"] for n in graph_nodes(sym)]
    check_excluded(excluded, node_names)
    inputs = sym.list_inputs()
    if data_names is None:
        attrs = sym.attr_dict()
        data_names = [n for n in inputs if "__dtype__" not in attrs.get(n, {})]
    data_names = check_name_list(data_names, "data_names")
    missing = sorted(set(data_names) - set(inputs))
    if missing:
        raise AmpArgumentError("data_names %s are not inputs of the symbol (its inputs: %s)"
                               % (missing, ", ".join(inputs)))
    return _convert(sym, lists, excluded, data_names,
                    _stores_low_precision(cast_optional_params, amp_plan), fp32_outputs,
                    known_shapes)


def _stores_low_precision(cast_optional_params, amp_plan, sym=None):
    """``cast_optional_params`` as given, and for ``None`` (mxamp's default) True where the
    conversion's device computes in the target: a parameter is then stored in the dtype it is
    computed in (half the bytes), and where nothing computes in low precision (class 'none',
    'auto' choosing float32) nothing changes. MXNet 1.9.1's ``mx.np`` arrays cannot hold
    bfloat16 (``copyto``: numpy.void), so a numpy-interface block keeps float32 there."""
    if cast_optional_params is not None:
        return bool(cast_optional_params)
    if amp_plan.target == "bfloat16" and isinstance(sym, NumpySymbol):
        return False
    return amp_plan.primary.low_precision


def _cast_params(params, wanted):
    return {name: cast(value, wanted[name]) if name in wanted else value
            for name, value in params.items()}


def convert_model(sym, arg_params, aux_params, target_dtype="float16", target_dtype_ops=None,
                  fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                  cast_optional_params=None, fp32_outputs=True, allow_widest_overrides=False,
                  policy=None):
    """Convert a Symbol and its parameters; return ``(symbol, arg_params, aux_params)``.

    The returned dicts are new: each parameter is cast to the dtype the converted graph needs
    (the target dtype where ``cast_optional_params`` types it so, as in
    :func:`convert_symbol`); the caller's dicts are untouched.

    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> args = {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros((2,))}
    >>> _, new_args, _ = convert_model(fc, args, {}, 'bfloat16', cast_optional_params=True)
    >>> new_args['fc_weight'].dtype == dtypes.BFLOAT16
    True
    """
    if not isinstance(sym, mx.sym.Symbol):
        raise AmpArgumentError("convert_model needs an mxnet Symbol first, got %s"
                               % type(sym).__name__)
    for what, params in (("arg_params", arg_params), ("aux_params", aux_params)):
        if not isinstance(params, dict):
            raise AmpArgumentError("%s must be a dict of name -> NDArray, got %s"
                                   % (what, type(params).__name__))
    data_names = [n for n in sym.list_inputs() if n not in arg_params and n not in aux_params]
    shapes = {name: value.shape for params in (arg_params, aux_params)
              for name, value in params.items()}   # weights give conditions their channels
    converted = _convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops,
                                conditional_fp32_ops, excluded_sym_names, data_names,
                                cast_optional_params, fp32_outputs, allow_widest_overrides,
                                policy, shapes)
    wanted = param_dtypes(converted)
    return converted, _cast_params(arg_params, wanted), _cast_params(aux_params, wanted)


def _why_it_cannot_run(lists, converted, contexts):
    """Why ``converted`` cannot compute on the CPU among ``contexts`` ('' where it can): float16
    on a CPU would fail at the first GEMM, deep in MXNet."""
    on_cpu = [c for c in contexts if dtypes.is_cpu(c)]
    if not on_cpu or lists.target in CPU_TARGETS:
        return ""
    lp_ops = op_names(converted) & set(lists.low_precision) & set(lists.no_cpu_kernel)
    if not lp_ops:
        return ""
    return ("%s has no CPU kernel for %s, so this %s model cannot run on %s. Run it on a GPU "
            "(convert with ctx=mx.gpu(0), or export it for a GPU server), or use "
            "target_dtype='bfloat16' on a CPU; convert_symbol and convert_model build the %s "
            "graph without running it."
            % (lists.target, ", ".join(sorted(lp_ops)), lists.target, on_cpu[0], lists.target))


def _check_device_can_run(lists, converted, contexts):
    """A module binds at once: float16 for a CPU fails here, not deep in MXNet."""
    why = _why_it_cannot_run(lists, converted, contexts)
    if why:
        raise RuntimeError(why)


def _default_target(target_dtype, policy, contexts):
    """``target_dtype=None``: bfloat16 for CPU contexts and float16 for GPUs (or the policy's);
    one log line names the pick (the reference's default is float16 everywhere)."""
    if target_dtype is not None or policy is not None:
        return target_dtype
    picked = CPU_TARGETS[0] if all(dtypes.is_cpu(c) for c in contexts) else "float16"
    _LOG.info("mxamp: no target_dtype given: converting to %s for %s (the reference's default "
              "is float16, which a CPU cannot compute)", picked, ", ".join(map(str, contexts)))
    return picked


def _example_shapes(inputs, example_inputs):
    """{input name: shape} of the example inputs, when given."""
    if example_inputs is None:
        return {}
    return {i.name: x.shape for i, x in zip(inputs, as_input_tuple(example_inputs))}


def _say_if_shapes_are_unknown(shapes, amp_plan):
    """A rule on shapes (the AMX guard) holds where shapes are unknown, a condition on
    ``spatial_size`` of the caller's does not: say how to give them."""
    lists = amp_plan.lists
    spatial = sorted({op for op in lists.conditional_fp32 for c in lists.conditions(op)
                      if any(name == "spatial_size" for name, _ in c.tests)})
    if not shapes and spatial:
        _LOG.warning("mxamp: convert_hybrid_block does not know the input shapes, so the "
                     "spatial_size conditions on %s hold nowhere. Pass example_inputs=<a "
                     "batch> to decide them.", ", ".join(spatial))
    guarded = [d for d in amp_plan.device_plans if d.low_precision and any(
        c.if_unknown for conds in d.fp32_when.values() for c in conds)]
    if not shapes and guarded:
        _LOG.warning("mxamp: convert_hybrid_block does not know the input shapes, so every "
                    "convolution a shape rule of CPU class %r could concern stays float32 (%s). "
                    "Pass example_inputs=<a batch> to convert only the shapes that need it.",
                    guarded[0].device, op_summary(guarded[0].fp32_when))


def convert_hybrid_block(block, target_dtype=None, target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=None, example_inputs=None, fp32_outputs=True,
                         allow_widest_overrides=False, policy=None):
    """Return a mixed-precision :class:`ConvertedBlock` (a SymbolBlock) made from a HybridBlock.

    The block must have been hybridized and run once, or ``example_inputs`` (an NDArray or a
    tuple of them, one per forward argument) must be given; it is run once under
    ``autograd.pause()``. ``ctx=None`` puts the parameters on the block's own context (CPU
    for a block on CPU). ``target_dtype=None`` picks bfloat16 for a CPU context and float16
    for a GPU (the reference's default, float16 on gpu(0), fails on a CPU-only machine);
    ``'auto'`` picks float16 for a GPU, bfloat16 for a CPU that computes it natively and float32
    compute on other CPUs. A float16 conversion for a CPU context builds and exports (for a GPU
    server); running it on a CPU raises ``RuntimeError`` (no float16 convolution/GEMM kernels
    there). The block returned runs on ``ctx``: on a CPU
    without bfloat16 kernels (class 'none') the ops that lack one compute in float32, and one
    warning per process says so. Node names in ``excluded_sym_names`` are the graph's (e.g.
    ``'resnetv10_conv0_fwd'``, see ``mxamp.conversion.precision_pass.graph_nodes`` of the traced graph).
    The block returned is an inference model: its parameters have ``grad_req='null'`` (no
    gradient buffers; set ``p.grad_req = 'write'`` to fine-tune it) and it is hybridized with
    ``static_alloc=True``. Its first call gives the C heap's free pages back before it plans
    its buffers, so that a source model dropped by ``net = convert_hybrid_block(net)`` does
    not stay resident beside it (``mxamp.backend.heap.release_before_first_call``;
    ``MXAMP_TRIM_HEAP=0`` skips it).

    >>> net = mx.gluon.nn.Dense(2, in_units=3)
    >>> net.initialize()
    >>> net.hybridize()
    >>> lp = convert_hybrid_block(net, 'bfloat16', example_inputs=mx.nd.ones((1, 3)))
    >>> lp(mx.nd.ones((1, 3))).shape
    (1, 2)
    """
    if not isinstance(block, HybridBlock):
        raise AmpArgumentError("convert_hybrid_block needs a gluon HybridBlock, got %s"
                               % type(block).__name__)
    if ctx is not None and not isinstance(ctx, mx.Context):
        raise AmpArgumentError("ctx must be an mx.Context (e.g. mx.cpu()), got %r" % (ctx,))
    ctx = ctx or block_context(block)
    amp_plan = _plan(_default_target(target_dtype, policy, [ctx]), [device_of(ctx)],
                     target_dtype_ops, fp32_ops, conditional_fp32_ops, allow_widest_overrides,
                     policy, None)
    inputs, sym = trace_graph(block, example_inputs)
    lists = amp_plan.graph_lists()
    amp_plan.announce()
    excluded = check_name_list(excluded_sym_names, "excluded_sym_names") or []
    check_excluded(excluded, [n["name"] for n in graph_nodes(sym)])
    shapes = _example_shapes(inputs, example_inputs) or recorded_input_shapes(block)
    _say_if_shapes_are_unknown(shapes, amp_plan)
    shapes = dict({p.name: p.shape for p in block.collect_params().values()}, **shapes)
    converted = _convert(sym, lists, excluded, [i.name for i in inputs],  # weights: channels
                         _stores_low_precision(cast_optional_params, amp_plan, sym),
                         fp32_outputs, shapes)
    # Typed input variables spare SymbolBlock a "cannot decide type" warning.
    typed_inputs = [mx.sym.var(i.name, dtype="float32") for i in inputs]
    typed_inputs = [v.as_np_ndarray() if isinstance(i, NumpySymbol) else v
                    for v, i in zip(typed_inputs, inputs)]
    fix_astype()  # fp32_outputs=False leaves bfloat16 oneDNN outputs to the caller's astype
    return inference_block(converted, typed_inputs, block, ctx,
                           _why_it_cannot_run(lists, converted, [ctx]))


def convert_bucketing_module(bucketing_mod, target_dtype=None, target_dtype_ops=None,
                             fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                             cast_optional_params=None, fp32_outputs=True,
                             allow_widest_overrides=False, policy=None):
    """Convert every bucket of an initialised BucketingModule; return a new BucketingModule.

    ``excluded_sym_names`` may name nodes of any bucket (a name must exist in at least one);
    buckets first seen after the conversion are converted when they are created.
    ``target_dtype=None`` picks bfloat16 when the module runs on a CPU, float16 on GPUs;
    ``'auto'`` as in :func:`convert_hybrid_block`, whose rules apply; but the buckets share
    their parameters, so ``cast_optional_params=None`` keeps them float32 (``True`` types them).

    >>> # lp_mod = convert_bucketing_module(mod, 'bfloat16'); lp_mod.bind(...); lp_mod.forward(...)
    """
    if not isinstance(bucketing_mod, BucketingModule):
        raise AmpArgumentError("convert_bucketing_module needs an mx.mod.BucketingModule, got "
                               "%s" % type(bucketing_mod).__name__)
    view = BucketingView(bucketing_mod)
    if not view.buckets or not bucketing_mod.params_initialized:
        raise RuntimeError("bind the BucketingModule and initialise its parameters "
                           "(mod.bind(...); mod.init_params()) before converting it")
    contexts = view.context
    contexts = list(contexts) if isinstance(contexts, (list, tuple)) else [contexts]
    amp_plan = _plan(_default_target(target_dtype, policy, contexts),
                     [device_of(c) for c in contexts], target_dtype_ops, fp32_ops,
                     conditional_fp32_ops, allow_widest_overrides, policy, None)
    lists = amp_plan.graph_lists()
    amp_plan.announce()
    excluded = check_name_list(excluded_sym_names, "excluded_sym_names") or []
    per_bucket = {key: {n["name"] for n in graph_nodes(mod.symbol)}
                  for key, mod in view.buckets.items()}
    check_excluded(excluded, set().union(*per_bucket.values()))
    arg_params, aux_params = bucketing_mod.get_params()
    # buckets share their parameters, which can have one dtype only: None keeps them float32
    cast_optional_params = bool(cast_optional_params)
    symbols, wanted = {}, {}
    for key, mod in view.buckets.items():
        data_names = [n for n in mod.symbol.list_inputs()
                      if n not in arg_params and n not in aux_params]
        symbols[key] = _convert(mod.symbol, lists, [n for n in excluded if n in per_bucket[key]],
                                data_names, cast_optional_params, fp32_outputs)
        _check_device_can_run(lists, symbols[key], contexts)
        wanted.update(param_dtypes(symbols[key]))
    param_names = set(arg_params) | set(aux_params)

    def converted_sym_gen(bucket_key):
        """Buckets first seen after conversion are converted the same way."""
        sym, data_names, label_names = view.sym_gen(bucket_key)
        nodes = {n["name"] for n in graph_nodes(sym)}
        return _convert(sym, lists, [n for n in excluded if n in nodes],
                        [n for n in sym.list_inputs() if n not in param_names],
                        cast_optional_params, fp32_outputs), data_names, label_names

    return BucketingModule.load_dict(
        symbols, sym_gen=converted_sym_gen, arg_params=_cast_params(arg_params, wanted),
        aux_params=_cast_params(aux_params, wanted),
        default_bucket_key=view.default_bucket_key, logger=bucketing_mod.logger,
        context=view.context, work_load_list=view.work_load_list,
        fixed_param_names=view.fixed_param_names, state_names=view.state_names,
        group2ctxs=view.group2ctxs, compression_params=view.compression_params)
