"""``amp.init``: patch MXNet's operator namespaces so every op runs in its listed precision.

The patch is recorded in :data:`mxamp.runtime.state.STATE` (target, op lists, device plans, every
function replaced), so that it can be inspected (:func:`patch_state`) and undone
(:func:`reset`). ``init`` takes a few milliseconds: it names each generated operator function
by the handle it embeds (:mod:`mxamp.backend.registry`), looks its op up in the lists once, and binds a
light wrapper (:mod:`mxamp.patching.wrappers`). Graphs that hybridized blocks built before are not
searched for: a block's cached graph carries the AMP *generation* it was built under, and a
block whose graph is from another generation rebuilds it at its next call.

>>> from mxamp import amp
>>> amp.init(target_dtype='bfloat16')
>>> amp.patch_state()['target_dtype']
'bfloat16'
>>> amp.reset()
"""
import contextlib
import gc
import logging
import time

import mxnet as mx

from mxamp import dtypes
from mxamp.backend import mxnet_private as mxp, registry
from mxamp.backend.devices import cpu_class, gpu_available
from mxamp.lists import get_op_lists
from mxamp.patching import wrappers
from mxamp.patching.loss_outputs import wrap_loss_output
from mxamp.precision import plan
from mxamp.runtime import patches
from mxamp.runtime.addto_hooks import hook_addto_sources
from mxamp.runtime.hooks import (drop_amp_graphs, fix_astype, hook_block_graphs, hook_record_scopes,
                                 keep_dtype_when_contexts_average)
from mxamp.runtime.patches import replace, undo_all
from mxamp.runtime.state import STATE

LOG = logging.getLogger(__name__)


@contextlib.contextmanager
def _collection_deferred():
    """No garbage collection inside: after ``import mxnet`` the heap holds hundreds of thousands
    of objects, and the few thousand small ones mxamp makes may trigger a full collection of
    them (~70-90 ms on two cores). It runs later, at the program's next allocations, as it
    would have without mxamp."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def prepare():
    """Compute once what every ``amp.init`` needs (called by ``import mxamp``, ~20 ms).

    The operator functions MXNet generated (:func:`mxamp.backend.registry.op_functions`), both
    targets' op lists, and the reference's module whose ``_amp_initialized`` flag ``init``
    sets: all facts of the process, so that ``init`` itself takes a few milliseconds.

    >>> prepare()
    """
    with _collection_deferred():
        registry.op_functions()
        for target in dtypes.TARGETS:
            get_op_lists(target)
    mxp.reference_amp_module()


def _apply(amp_plan):
    """Wrap every generated operator function according to the plan's rule for its op.

    A plan that computes everything in float32 by mxamp's own choice ('auto' where nothing
    pays) wraps only the loss-output ops: MXNet's own functions then run, at float32's speed
    (wrapped, the MLP ran at 0.90-0.94x float32 on an AMX Xeon, hw-runs 2026-11-25)."""
    categories, changes = STATE.categories, []
    loss_output, make_wrapper = amp_plan.lists.loss_output, wrappers.make_wrapper
    alone, rule_of, change = amp_plan.leaves_mxnet_alone, amp_plan.rule, changes.append
    for func, op_name, is_symbol, bindings in registry.op_functions():
        rule = rule_of(op_name)
        if rule is None or (alone and op_name not in loss_output) or (
                not is_symbol and rule.category == "neutral" and not rule.fp32_on_cpu
                and op_name not in loss_output):
            # a float32 plan of mxamp's choosing wraps loss outputs only (see above); an
            # NDArray's dtype is seen at call time: a dtype-neutral op needs no wrapper
            # (Symbols keep theirs, which track the dtype of what they build)
            continue
        wrapped = None
        for module, attr in bindings:
            if module.__dict__.get(attr) is not func:
                continue          # re-bound since import (by the user or another library)
            if wrapped is None:
                wrapped = func if alone else make_wrapper(func, rule, is_symbol)
                if op_name in loss_output:
                    wrapped = wrap_loss_output(wrapped, op_name, is_symbol)
                categories[rule.category] = categories.get(rule.category, 0) + 1
            setattr(module, attr, wrapped)
            change((module, attr, func, wrapped))
    patches.record(changes, kind="operator")
    # blocks built before rebuild (their loss outputs need the scale); depthwise treatments
    hook_block_graphs(amp_plan.cpu.depthwise_graphs)
    hook_addto_sources()  # casts of inputs whose gradients MXNet adds (runtime.addto)
    if alone:
        return
    hook_record_scopes()
    fix_astype()  # bfloat16 oneDNN outputs: astype through amp_cast
    keep_dtype_when_contexts_average()  # bfloat16 parameters saved from several contexts


def init(target_dtype=None, target_precision_ops=None, conditional_fp32_ops=None,
         fp32_ops=None, layout_optimization=False, policy=None):
    """Turn on automatic mixed precision: patch MXNet's operators for ``target_dtype``.

    Parameters are those of ``mxnet.contrib.amp.init``: ``target_dtype`` is ``'float16'``
    (GPU) or ``'bfloat16'`` (CPU) in any spelling, or ``'auto'``: float16 where the process
    has a GPU, bfloat16 where the CPU computes it faster than float32 (the probe), float32
    compute elsewhere (with one log line saying why; AMP, and so the loss scaler's skipping of
    non-finite steps, stays on). Without ``target_dtype`` it is what ``mxamp.install`` set,
    else float16 in a process with a GPU (the reference's default) and ``'auto'`` without one
    (one INFO line says so). ``layout_optimization=True`` (NVIDIA's GPU pass) warns once.
    ``target_precision_ops``, ``fp32_ops`` (op names) and ``conditional_fp32_ops``
    (``(op, parameter, [values])``) replace the default list of their category; names appended to the reference's module lists
    (``amp.lists.symbol_fp16.FP32_FUNCS``, ...) before ``init`` take effect too. Calling
    ``init`` again with no arguments, or with the same ones, keeps the configuration in force
    (as the reference does); other explicit arguments raise ``RuntimeError`` naming both
    requests (call :func:`reset` first). Hybridized blocks rebuild their graph at their next
    call. ``policy`` (mxamp's) is a :class:`~mxamp.precision.policy.Policy` that
    :func:`mxamp.tuning.tune` chose (a float32 policy keeps AMP on with float32 compute).
    :func:`mxamp.precision.plan.make` decides; ``amp.patch_state()`` reads its plan.

    On a CPU, ops without a kernel for the target compute in float32 with their inputs cast
    (float16 on any CPU; bfloat16 on class 'none', :mod:`mxamp.precision.device_plan`), and a
    bfloat16 request there or on an emulating CPU warns once; training then gives float32's
    results bit for bit.
    Bad arguments raise :class:`~mxamp.errors.AmpArgumentError` and leave AMP as it was.

    >>> import mxnet as mx
    >>> from mxamp import amp
    >>> amp.init('float16')
    >>> y = mx.nd.softmax(mx.nd.ones((2, 3), dtype='float16'))  # softmax runs in float32
    >>> y.dtype
    <class 'numpy.float32'>
    >>> amp.reset()
    """
    if STATE.patched and target_dtype is None and all(v is None for v in (
            target_precision_ops, conditional_fp32_ops, fp32_ops, policy)):
        return      # a library's own bare amp.init() keeps the configuration in force
    _say_layout_optimization(layout_optimization)
    # the plan is made (and every argument checked) before anything changes
    amp_plan = plan.make(_requested(target_dtype, policy),
                         target_precision_ops=target_precision_ops, fp32_ops=fp32_ops,
                         conditional_fp32_ops=conditional_fp32_ops, policy=policy)
    arguments = (amp_plan.requested, _frozen(target_precision_ops),
                 _frozen(conditional_fp32_ops), _frozen(fp32_ops),
                 None if policy is None else repr(policy))
    with STATE.lock:
        if STATE.patched:
            _check_same_configuration(amp_plan, arguments)
            return
        start = time.perf_counter()
        with _collection_deferred():
            STATE.plan, STATE.arguments = amp_plan, arguments
            STATE.generation += 1
            _apply(amp_plan)
            replace(mxp.reference_amp_module(), "_amp_initialized", True, kind="reference flag")
        STATE.init_seconds = time.perf_counter() - start
    amp_plan.announce()
    LOG.info("mxamp: AMP on, target %s; %d operator functions wrapped in %.1f ms",
             amp_plan.target, sum(STATE.categories.values()), STATE.init_seconds * 1e3)


def _check_same_configuration(amp_plan, arguments):
    """A second ``init`` with explicit arguments: the same ones keep the configuration in force,
    others raise (a process runs one AMP configuration)."""
    if STATE.arguments == arguments:
        return
    raise RuntimeError(
        "amp.init was already called with target_dtype=%r, and this call asks for "
        "target_dtype=%r%s; a process runs one AMP configuration. Call amp.reset() before "
        "initialising again, or amp.init() without arguments to keep the one in force."
        % (STATE.plan.requested, amp_plan.requested,
           "" if STATE.plan.requested != amp_plan.requested else
           " with other op-list overrides or policy"))


def _requested(target_dtype, policy):
    """What ``init`` was asked for: ``target_dtype``, else ``mxamp.install``'s target, else
    float16 where the process has a GPU (the reference's default) and 'auto' where it has none
    (float16 would compute in float32 on a CPU)."""
    if target_dtype is not None or policy is not None:
        return target_dtype
    if STATE.install_target is not None:
        return STATE.install_target
    if gpu_available():
        return "float16"
    LOG.info("mxamp: amp.init() without target_dtype in a process without a GPU means 'auto': "
             "bfloat16 where this CPU computes it faster than float32, float32 elsewhere "
             "(pass target_dtype='float16' for the reference's default)")
    return dtypes.AUTO


def _say_layout_optimization(layout_optimization):
    """NVIDIA's MXNet builds take ``layout_optimization``; mxamp accepts it and says that it
    does no layout pass."""
    if layout_optimization:
        STATE.warn_once("mxamp: amp.init(layout_optimization=True) asks for a GPU layout pass of "
                        "NVIDIA's MXNet builds; mxamp does not do it and goes on without it.",
                        stacklevel=4)


def _frozen(value):
    """An override argument, already checked to be a list, in a hashable form (for the
    re-init check)."""
    if value is None:
        return None
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)


def reset():
    """Undo :func:`init` and forget every process-wide state mxamp keeps (thread-safe).

    Restores every original operator function and clears :data:`mxamp.runtime.state.STATE`: the
    trainers seen by ``init_trainer``, the warnings given once, the cast caches. Graphs that
    hybridized blocks built under AMP are rebuilt at their next call.

    >>> from mxamp.patching import patcher as patching
    >>> patching.reset(); patching.is_initialized()
    False
    """
    with STATE.lock:
        drop_amp_graphs()
        undo_all()
        STATE.clear()


def is_initialized():
    """True once :func:`init` has patched MXNet.

    >>> isinstance(is_initialized(), bool)
    True
    """
    return STATE.patched


def target_dtype():
    """``'float16'`` or ``'bfloat16'`` after :func:`init`, else None.

    >>> from mxamp import amp
    >>> amp.init('bfloat16'); target_dtype()
    'bfloat16'
    >>> amp.reset(); target_dtype() is None
    True
    """
    return STATE.target


def op_lists():
    """The :class:`~mxamp.lists.OpLists` in force (with the user's overrides), or None.

    >>> op_lists() is None or op_lists().target in ('float16', 'bfloat16')
    True
    """
    return STATE.plan.lists if STATE.plan is not None else None


def patch_state():
    """A summary of the patch: target, what this CPU computes, wrapped functions, modules, timing.

    ``cpu_compute`` is the dtype the low-precision ops compute in on this CPU (``'float32'``
    where it has no kernels for the target, or where ``'auto'`` chose float32), and
    ``cpu_fp32_ops`` the ops computed in float32 here whatever their category. ``modules`` are
    the namespaces whose operators AMP governs; ``patched_modules`` those where it replaced a
    function (an NDArray op that is dtype-neutral needs no wrapper: it runs at its input's dtype).

    >>> sorted(patch_state())[:4]
    ['bindings', 'categories', 'cpu_class', 'cpu_compute']
    """
    # the operator functions and autograd's scopes (the counts of mxamp 0.x); astype, the block
    # hook and the reference's flag are in STATE.replaced too, but are not operator bindings
    replaced = patches.replaced("operator") + patches.replaced("recording scope")
    cpu_plan = STATE.plan.cpu if STATE.plan is not None else None
    patched = sorted({p.owner.__name__ for p in patches.replaced("operator")})
    # every namespace whose operators AMP governs: in mx.nd.image, say, all ops are
    # dtype-neutral, so NDArray calls there run unwrapped, at their input's dtype
    governed = sorted({module.__name__ for entry in registry.op_functions()
                       for module, _ in entry.bindings}) if STATE.patched else []
    return {
        "initialized": STATE.patched,
        "target_dtype": STATE.target,
        "requested_dtype": STATE.plan.requested if STATE.plan is not None else None,
        "policy": STATE.plan.policy.name if STATE.plan and STATE.plan.policy else None,
        "cpu_class": cpu_class(),
        "cpu_compute": cpu_plan.compute if cpu_plan else None,
        "cpu_fp32_ops": sorted(cpu_plan.fp32_ops) if cpu_plan else [],
        "cpu_plan": cpu_plan.describe() if cpu_plan else None,
        "wrapped_functions": len({id(p.replacement) for p in replaced}),
        "bindings": len(replaced),
        "categories": dict(STATE.categories),
        "modules": governed,
        "patched_modules": patched,
        "init_ms": round(STATE.init_seconds * 1e3, 1),
        "disabled": not plan.amp_enabled(),
        "tracked_symbols": len(STATE.symbol_dtypes),
        "generation": STATE.generation,
    }


def precision_of(op_name, data_shape=None, on_cpu=True, training=None, **params):
    """In which precision ``amp.init``'s patch runs one call of ``op_name``, and why.

    Returns ``(decision, why)``: ``decision`` is ``'bfloat16'``/``'float16'``/``'float32'``
    (inputs cast to it), ``'widest'`` (inputs cast to their widest float type) or ``'input'``
    (the op runs in its input's dtype). ``data_shape`` is the shape of the data input (for
    conditions on shapes), ``params`` the call's parameters, ``on_cpu`` where it runs,
    ``training`` whether it is recorded for training (None: as a call made here, inside
    ``autograd.record()`` or not). Nothing is run. Raises RuntimeError before :func:`init`.

    >>> from mxamp import amp
    >>> amp.init('bfloat16', conditional_fp32_ops=[('Convolution', 'kernel', ['(7, 7)'])])
    >>> amp.precision_of('Convolution', kernel=(7, 7), on_cpu=False)[0]
    'float32'
    >>> amp.precision_of('Convolution', kernel=(3, 3), on_cpu=False)[0]
    'bfloat16'
    >>> amp.reset()
    """
    if not STATE.patched:
        raise RuntimeError("amp.precision_of needs amp.init(...) first: it reads the patch")
    if training is None:
        training = mx.autograd.is_recording()
    return STATE.plan.precision_of(op_name, data_shape, on_cpu, training, **params)


@contextlib.contextmanager
def disabled():
    """A region (of this thread) where AMP puts no op into low precision.

    Low-precision-list, float32-list and conditional ops get their inputs cast to float32;
    dtype-neutral ops (reshape, Activation, optimizer updates, explicit casts) run in their
    input's dtype, as without AMP, so float32 inputs mean float32 everywhere. Imperative calls and
    graphs built inside the region are affected; a hybridized block keeps the graph it built.

    >>> import mxnet as mx
    >>> from mxamp import amp
    >>> amp.init('bfloat16')
    >>> x = mx.nd.ones((2, 4)); w = mx.nd.ones((3, 4))
    >>> with amp.disabled():
    ...     mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=3).dtype
    <class 'numpy.float32'>
    >>> amp.reset()
    """
    with STATE.disabled_region():
        yield
