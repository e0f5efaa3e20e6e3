"""The process-wide hooks mxamp installs in MXNet, each through :mod:`mxamp.runtime.patches`.

* :func:`fix_astype`: ``astype`` to or from bfloat16 goes through ``amp_cast`` (MXNet's own
  ``astype`` cannot copy a oneDNN-layout bfloat16 array);
* :func:`keep_dtype_when_contexts_average`: a parameter averaged over its contexts
  (``save_parameters``) keeps its dtype;
* :func:`hook_record_scopes`: the per-``record()`` cast cache opens and closes with autograd's
  recording scopes;
* :func:`hook_block_graphs`: a hybridized block rebuilds a graph built under another AMP
  generation, its input shapes are known while its graph is built, a graph with
  depthwise convolutions gets the plan's treatment (:mod:`mxamp.runtime.depthwise_graphs`), so
  does one with a global pooling into a convolution (:mod:`mxamp.runtime.pooling_graphs`)
  and one with a ReLU6 after a BatchNorm (:mod:`mxamp.runtime.clip_graphs`),
  a model ``cast_model`` cast loses its cast round trips (:mod:`mxamp.runtime.cast_folding`),
  and a graph without convolutions for the CPU frees backward's arrays promptly
  (:func:`mxamp.backend.graph_memory.backward_segment_flags`);
* :func:`hook_imperative_depthwise`: the same treatment for a block that runs without
  ``hybridize()`` (installed only where the plan has one).

:func:`record_input_shapes` (installed by ``import mxamp`` where AMX is on) is not undone: it
only remembers the shapes each block built its graph with.

Why over 400 lines: it is the one home of the hooks mxamp installs in MXNet's classes, each
beside its undo's reasons; split by hook, each part would repeat the registry's conventions.

All are undone by ``amp.reset()`` (:func:`mxamp.runtime.patches.undo_all`), which first
drops the graphs built under AMP (:func:`drop_amp_graphs`), so that they are rebuilt without
casts at their next call.

>>> fix_astype()
>>> y = mx.nd.array([1.0, 2.5]).astype('bfloat16')
>>> y.astype('float32').asnumpy().tolist()
[1.0, 2.5]
"""
import contextlib

import mxnet as mx
from mxnet.gluon import Block, HybridBlock
from mxnet.gluon.nn import BatchNorm

from mxamp import dtypes
from mxamp.backend import graph_memory
from mxamp.backend import mxnet_private as mxp
from mxamp.backend.graphs import op_names
from mxamp.runtime.addto import addto_names, building_block
from mxamp.runtime.cast_folding import FOLD_ATTR, build_folded_graph
from mxamp.runtime.casting import array_dtype, cast
from mxamp.runtime.clip_graphs import TREATMENT_ATTR as CLIP_TREATMENT_ATTR
from mxamp.runtime.clip_graphs import build_clip_graph
from mxamp.runtime.depthwise_graphs import (FLOAT32_GRAPH, IMPERATIVE_TREATMENTS,
                                            STEER_BATCHNORM, TREATMENT_ATTR,
                                            build_depthwise_graph, has_depthwise_layer,
                                            steered_input)
from mxamp.runtime.graph_edits import graph_input_shapes
from mxamp.runtime.patches import is_replaced, replace
from mxamp.runtime.pooling_graphs import TREATMENT_ATTR as POOLING_TREATMENT_ATTR
from mxamp.runtime.pooling_graphs import build_pooling_graph
from mxamp.runtime.state import STATE


def _float_name(dtype):
    try:
        name = dtypes.name_of(dtype)
    except (TypeError, ValueError):
        return None
    return name if name in ("float16", "bfloat16", "float32") else None


def fix_astype():
    """Make ``NDArray.astype`` and ``mx.np.ndarray.astype`` work on bfloat16 oneDNN outputs.

    MXNet's ``astype`` is ``empty(dtype)`` plus ``copyto``, and that copy cannot change the
    dtype of an array held in a oneDNN (blocked) layout: ``y.astype('float32')`` of a bfloat16
    Convolution output fails at the next sync with "The size of NDArray doesn't match the
    requested MKLDNN memory desc" on every AVX-512 CPU (measured on Sapphire Rapids and Zen 5).
    After this call a conversion from or to bfloat16 between float types goes through
    :func:`~mxamp.runtime.casting.cast` (``amp_cast``: differentiable, rounds to nearest);
    every other ``astype`` is MXNet's. Installed by ``amp.init``, ``cast_model`` and
    ``convert_hybrid_block``; idempotent; undone by ``amp.reset()``.
    """
    for cls in (mx.nd.NDArray, mx.np.ndarray):
        if is_replaced(cls, "astype"):
            continue
        original = cls.__dict__["astype"]

        def astype(self, dtype, *args, __original=original, **kwargs):
            to, cur = _float_name(dtype), array_dtype(self)
            if to and cur and to != cur and "bfloat16" in (to, cur):
                return cast(self, to)
            return __original(self, dtype, *args, **kwargs)

        astype.__name__, astype.__doc__ = original.__name__, original.__doc__
        replace(cls, "astype", astype, kind="astype")


def keep_dtype_when_contexts_average():
    """``save_parameters`` averages a parameter's contexts (``add_n(...) / n``); under
    ``amp.init`` the division of bfloat16 values computes in float32 (slow in bfloat16 on a
    CPU), so a bfloat16 model on two contexts (``cast_model``) saved float32 weights that its
    own ``load_parameters`` refused. The average, computed as it is, is cast back to the
    parameter's dtype. Installed by ``amp.init`` and ``cast_model``; undone by ``amp.reset()``.

    >>> keep_dtype_when_contexts_average(); is_replaced(mx.gluon.Parameter, mxp.PARAM_REDUCE_METHOD)
    True
    """
    owner = mx.gluon.Parameter
    if is_replaced(owner, mxp.PARAM_REDUCE_METHOD):
        return
    original = vars(owner)[mxp.PARAM_REDUCE_METHOD]

    def reduce_in_own_dtype(param):
        data = original(param)
        if data.stype == "default" and dtypes.name_of(data.dtype) != dtypes.name_of(param.dtype):
            data = cast(data, dtypes.name_of(param.dtype))
        return data
    reduce_in_own_dtype.__name__, reduce_in_own_dtype.__doc__ = original.__name__, original.__doc__
    replace(owner, mxp.PARAM_REDUCE_METHOD, reduce_in_own_dtype, kind="parameter hook")


def hook_record_scopes():
    """Open and close the per-``record()`` cast cache with autograd's recording scopes.

    >>> hook_record_scopes(); is_replaced(mxp.RecordingScope, '__enter__')
    True
    """
    scope = mxp.RecordingScope
    if is_replaced(scope, "__enter__"):
        return
    enter, exit_ = scope.__enter__, scope.__exit__
    casts = STATE.recording_casts

    def __enter__(this):
        was_recording = mx.autograd.is_recording()
        out = enter(this)
        if mxp.scope_starts_recording(this) and not was_recording:
            casts.begin()
        return out

    def __exit__(this, *exc):
        out = exit_(this, *exc)
        if not mx.autograd.is_recording():
            casts.end()
        return out

    replace(scope, "__enter__", __enter__, kind="recording scope")
    replace(scope, "__exit__", __exit__, kind="recording scope")


_GENERATION_ATTR = "_mxamp_generation"
_INPUT_SHAPES_ATTR = "_mxamp_input_shapes"
_DROPPED_INPUTS_ATTR = "_mxamp_dropped_graph_inputs"


def recorded_input_shapes(block):
    """The input shapes a hybridized block last built its graph with while mxamp's block hook
    was installed (:func:`hook_block_graphs`), else {}.

    >>> recorded_input_shapes(mx.gluon.nn.Dense(2))
    {}
    """
    return dict(block.__dict__.get(_INPUT_SHAPES_ATTR) or {})


def building_input_shapes():
    """The input shapes of the hybridized block whose graph this thread is building, else {}.

    >>> building_input_shapes()
    {}
    """
    return getattr(STATE.thread_local(), "graph_input_shapes", None) or {}


def hook_block_graphs(depthwise_treatment=""):
    """Make a hybridized block rebuild a graph built under another AMP generation; with a
    ``depthwise_treatment``, install :func:`hook_imperative_depthwise` too.

    Installed by ``init`` (and ``cast_model``); ``reset`` drops the graphs built under it and
    undoes it. The check is one attribute comparison per call of a hybridized block. While a
    graph is built, the block's input shapes are known (:func:`building_input_shapes`).

    >>> hook_block_graphs()
    """
    if depthwise_treatment in IMPERATIVE_TREATMENTS:
        hook_imperative_depthwise()
    original = vars(HybridBlock)[mxp.BLOCK_CALL_METHOD]
    if is_replaced(HybridBlock, mxp.BLOCK_CALL_METHOD):
        return

    def call_cached_op(block, *args):
        generation = STATE.generation
        view = None
        if block.__dict__.get(_GENERATION_ATTR) != generation:
            view = mxp.BlockView(block)
            if view.cached_op is not None:
                view.clear_cached_op()
            block.__dict__[_GENERATION_ATTR] = generation
        if (view or mxp.BlockView(block)).cached_op is None:
            # the graph is built in this call: conditions on shapes (mxamp.lists.conditions)
            # infer them from the block's real inputs, named as Gluon names its input vars
            STATE.amp_graph_blocks.add(block)
            local = STATE.thread_local()
            outer = getattr(local, "graph_input_shapes", None)
            local.graph_input_shapes = graph_input_shapes(args)
            # kept for convert_hybrid_block: the AMX guard needs shapes (unknown holds)
            block.__dict__[_INPUT_SHAPES_ATTR] = local.graph_input_shapes
            try:
                _weights_to_default_layout(block)
                with building_block(addto_names(block)):   # every trace below builds casts
                    # first: the treatments then see the dtypes the folded graph computes in
                    build_folded_graph(block, args, block.__dict__.get(FOLD_ATTR, ""))
                    build_depthwise_graph(block, args, _depthwise_treatment(block, args))
                    build_pooling_graph(block, args, _pooling_treatment(block, args))
                    build_clip_graph(block, args, _clip_treatment(block, args))
                    with _backward_segments(block, args):
                        return original(block, *args)
            finally:
                local.graph_input_shapes = outer
        return original(block, *args)

    call_cached_op.__name__ = original.__name__
    call_cached_op.__doc__ = original.__doc__
    replace(HybridBlock, mxp.BLOCK_CALL_METHOD, call_cached_op, kind="block hook")


def _weights_to_default_layout(block):
    """Before a graph with AMP's casts is built: weights that a float32 inference pass left in
    oneDNN's blocked layout go back to MXNet's (``mxnet_private.to_default_layout``), which
    ``amp_cast`` can read. Once per graph, not per call."""
    for param in block.collect_params().values():
        for array in mxp.ParamView(param).data or ():
            if array.context.device_type == "cpu":
                mxp.to_default_layout(array)


def _called_on_cpu(args):
    first = next((a for a in args if isinstance(a, mx.nd.NDArray)), None)
    return first is not None and first.context.device_type == "cpu"


#: Graphs with these operators keep MXNet's backward segments (see ``graph_memory.py``: segments of
#: one cost ResNet-50 about 2% of its step, in a balanced order, for 0-10 MB).
_KEEPS_SEGMENTS = frozenset(("Convolution", "Deconvolution"))


@contextlib.contextmanager
def _backward_segments(block, args):
    """While a graph without convolutions that AMP builds for the CPU is made: the block's
    flags carry mxamp's backward segment size where the user chose none
    (``graph_memory.backward_segment_flags``: there the segments hold freed low-precision weight
    gradients and buy no speed). The block's own flags are back after."""
    view = mxp.BlockView(block)
    kept = view.flags
    chosen = graph_memory.backward_segment_flags(kept)
    if chosen != kept and _called_on_cpu(args) and \
            not _KEEPS_SEGMENTS & op_names(view.trace(*args)[1]):
        view.flags = chosen
    try:
        yield
    finally:
        view.flags = kept


def _depthwise_treatment(block, args):
    """The treatment of graphs with depthwise convolutions
    (:mod:`mxamp.runtime.depthwise_graphs`) for a block called on the CPU."""
    return _cpu_treatment(block, args, TREATMENT_ATTR, "depthwise_graphs")


def leave_graph_treatments(block, dplan, fold_round_trips_to=""):
    """Leave the graph treatments of ``dplan`` (a ``DevicePlan``) on ``block``, as
    ``cast_model`` does: the block hook then gives them to its graphs whatever plan is in force;
    with ``fold_round_trips_to`` (O2's compute dtype) they fold the round trips to it
    (:mod:`mxamp.runtime.cast_folding`).

    >>> from types import SimpleNamespace
    >>> net = mx.gluon.nn.Dense(2)
    >>> leave_graph_treatments(net, SimpleNamespace(depthwise_graphs='', pooling_graphs='x',
    ...                                             clip_graphs='y'))
    >>> _pooling_treatment(net, (mx.nd.ones((1, 2)),)), _clip_treatment(net, (mx.nd.ones(1),))
    ('x', 'y')
    """
    block.__dict__[TREATMENT_ATTR] = dplan.depthwise_graphs
    block.__dict__[POOLING_TREATMENT_ATTR] = dplan.pooling_graphs
    block.__dict__[CLIP_TREATMENT_ATTR] = dplan.clip_graphs
    block.__dict__[FOLD_ATTR] = fold_round_trips_to


def _cpu_treatment(block, args, attr, field):
    """A graph treatment for a block called on the CPU: the one ``cast_model`` left on it
    (``attr``), else the plan in force's (its CPU plan's ``field``)."""
    if not _called_on_cpu(args):
        return ""
    if attr in block.__dict__:
        return block.__dict__[attr]
    return getattr(STATE.plan.cpu, field) if STATE.plan is not None else ""


def _pooling_treatment(block, args):
    """The treatment of graphs with a global pooling into a convolution
    (:mod:`mxamp.runtime.pooling_graphs`)."""
    return _cpu_treatment(block, args, POOLING_TREATMENT_ATTR, "pooling_graphs")


def _clip_treatment(block, args):
    """The treatment of graphs with a ReLU6 after a BatchNorm (:mod:`mxamp.runtime.clip_graphs`)."""
    return _cpu_treatment(block, args, CLIP_TREATMENT_ATTR, "clip_graphs")


_DEPTHWISE_LAYER_ATTR = "_mxamp_has_depthwise_layer"


def hook_imperative_depthwise():
    """Give a block that runs without ``hybridize()`` and holds depthwise convolutions the
    treatment its plan asks for graphs with them (:mod:`mxamp.runtime.depthwise_graphs`).

    Where it runs, from the outermost such block's call to its return: ``FLOAT32_GRAPH``
    computes in float32 (AMP's casts off, as in ``amp.disabled()``); ``STEER_BATCHNORM`` hands
    each BatchNorm layer its input through a Reshape. Without it, MobileNet 1.0 trained
    without ``hybridize()`` at 0.07x float32 on an AMX Xeon, under ``'auto'`` too (BatchNorm
    backward's reference kernel). ``amp.init`` and ``cast_model`` install it only where their
    plan has a treatment, so elsewhere a block call costs what it did.

    >>> hook_imperative_depthwise(); is_replaced(Block, '__call__')
    True
    >>> from mxamp import amp; amp.reset(); is_replaced(Block, '__call__')
    False
    """
    if is_replaced(Block, "__call__"):
        return
    original = vars(Block)["__call__"]

    def __call__(block, *args, **kwargs):
        local = STATE.thread_local()
        running = getattr(local, "imperative_treatment", "")
        if running:     # inside a treated block: steer its BatchNorm layers
            if running == STEER_BATCHNORM and isinstance(block, BatchNorm) and args and \
                    isinstance(args[0], mx.nd.NDArray):
                args = (steered_input(args[0]),) + args[1:]
            return original(block, *args, **kwargs)
        treatment = "" if mxp.is_hybridized(block) else _imperative_treatment(block, args)
        if not treatment:   # hybridized (the graph hook treats it), or nothing to treat
            return original(block, *args, **kwargs)
        local.imperative_treatment = treatment
        try:
            with (STATE.disabled_region() if treatment == FLOAT32_GRAPH
                  else contextlib.nullcontext()):
                return original(block, *args, **kwargs)
        finally:
            local.imperative_treatment = ""

    __call__.__doc__ = original.__doc__
    replace(Block, "__call__", __call__, kind="block hook")


def _imperative_treatment(block, args):
    """The treatment of a block called without ``hybridize()``: its plan's, where it holds a
    depthwise convolution (remembered per AMP generation)."""
    treatment = _depthwise_treatment(block, args)
    if treatment not in IMPERATIVE_TREATMENTS:
        return ""
    known = block.__dict__.get(_DEPTHWISE_LAYER_ATTR)
    if known is None or known[0] != STATE.generation:
        known = (STATE.generation, has_depthwise_layer(block))
        block.__dict__[_DEPTHWISE_LAYER_ATTR] = known
    return treatment if known[1] else ""


def record_input_shapes():
    """Remember the input shapes each hybridized block builds its graph with, for the life of
    the process (``amp.reset`` keeps it: it changes no result).

    ``import mxamp`` installs it where AMX is on: ``convert_hybrid_block`` then knows the
    shapes of a block that ran before it, and the AMX guard keeps only the convolutions whose
    shapes corrupt the heap in float32 (an unknown shape counts as one of them). It costs
    nothing per call: MXNet builds a graph once.

    ``tests/test_depthwise_graphs.py`` installs it in a fresh process and reads what it recorded.
    """
    original = vars(HybridBlock)[mxp.BLOCK_BUILD_METHOD]
    if getattr(original, "_mxamp_records_shapes", False):
        return

    def build_cache(block, *args):
        block.__dict__[_INPUT_SHAPES_ATTR] = graph_input_shapes(args)
        return original(block, *args)

    build_cache._mxamp_records_shapes = True
    build_cache.__name__, build_cache.__doc__ = original.__name__, original.__doc__
    setattr(HybridBlock, mxp.BLOCK_BUILD_METHOD, build_cache)


def graph_holds_amp_casts(block):
    """True when ``block``'s cached graph was built while mxamp's block hook was installed
    (under ``amp.init``, ``cast_model`` or ``amp.tune``'s candidates, the one in force too):
    it holds that generation's casts.

    >>> graph_holds_amp_casts(mx.gluon.nn.Dense(2))
    False
    """
    return _GENERATION_ATTR in block.__dict__


def drop_amp_graphs():
    """Forget the graphs blocks built while :func:`hook_block_graphs` was installed: each is
    rebuilt at the block's next call (for ``reset``: without AMP's casts). The input
    variables of each dropped graph are kept (:func:`dropped_graph_inputs`), so that
    ``convert_hybrid_block`` can still trace a block that ran under AMP."""
    for block in list(STATE.amp_graph_blocks):
        view = mxp.BlockView(block)
        if view.cached_graph:
            block.__dict__[_DROPPED_INPUTS_ATTR] = view.cached_graph[0]
        if view.cached_op is not None or view.cached_graph:
            view.clear_cached_op()
        block.__dict__.pop(_GENERATION_ATTR, None)
    STATE.amp_graph_blocks.clear()


def dropped_graph_inputs(block):
    """The input variables of the graph :func:`drop_amp_graphs` took from ``block``, or None
    (the block has built a graph since, or never lost one).

    >>> dropped_graph_inputs(mx.gluon.nn.Dense(2)) is None
    True
    """
    if mxp.BlockView(block).cached_graph:
        return None
    return block.__dict__.get(_DROPPED_INPUTS_ATTR)
