"""``amp.init``: patch MXNet's operator namespaces so every op runs in its listed precision.

All of mxamp's global state lives in the one :class:`PatchRegistry` held by this module: which
target dtype is active, which op lists (with the user's overrides) apply, and every function it
replaced, so that the patch can be inspected (:func:`patch_state`) and undone (:func:`reset`).

>>> from mxamp import amp
>>> amp.init(target_dtype='bfloat16')                       # doctest: +SKIP
>>> amp.patch_state()['target_dtype']                      # doctest: +SKIP
'bfloat16'
"""
import contextlib
import gc
import logging
import threading
import time
import types

import mxnet as mx

from . import devices, dtypes, opfuncs, wrappers
from .casting import RECORDING_CASTS, SYMBOL_DTYPES
from .lists import get_op_lists

LOG = logging.getLogger(__name__)


class PatchRegistry:
    """The patch ``amp.init`` applied: target, op lists and the replaced functions."""

    def __init__(self):
        self.target = None
        self.lists = None
        self.arguments = None
        self.cpu_plan = None        # devices.DevicePlan of this CPU
        self.symbol_plan = None     # the plan graphs are built for (GPU if present, else CPU)
        self.replaced = []          # (module, attribute, original, wrapper)
        self.categories = {}        # category -> number of wrapped functions
        self.init_seconds = 0.0
        self.lock = threading.RLock()

    @property
    def active(self):
        return self.target is not None

    def apply(self, target, lists, cpu_plan, symbol_plan):
        """Wrap every generated operator function according to ``lists`` and the device plans."""
        start = time.perf_counter()
        from .loss_outputs import wrap_loss_output  # pylint: disable=import-outside-toplevel
        for fn in opfuncs.find_op_functions():
            policy = _policy(lists, fn.op_name, target, cpu_plan, symbol_plan)
            if policy is None:
                continue
            wrapped = wrappers.make_wrapper(fn.func, policy, fn.is_symbol)
            if fn.op_name in lists.loss_output:
                wrapped = wrap_loss_output(wrapped, fn.op_name, fn.is_symbol)
            for module, attr in fn.bindings:
                setattr(module, attr, wrapped)
                self.replaced.append((module, attr, fn.func, wrapped))
            self.categories[policy.category] = self.categories.get(policy.category, 0) + 1
        self._hook_record_scopes()
        self.target, self.lists = target, lists
        self.cpu_plan, self.symbol_plan = cpu_plan, symbol_plan
        self.init_seconds = time.perf_counter() - start

    def _hook_record_scopes(self):
        """Open and close the per-``record()`` cast cache with autograd's recording scopes."""
        scope = mx.autograd._RecordingStateScope  # pylint: disable=protected-access
        enter, exit_ = scope.__enter__, scope.__exit__

        def __enter__(this):
            was_recording = mx.autograd.is_recording()
            out = enter(this)
            if this._enter_is_record and not was_recording:  # pylint: disable=protected-access
                RECORDING_CASTS.begin()
            return out

        def __exit__(this, *exc):
            out = exit_(this, *exc)
            if not mx.autograd.is_recording():
                RECORDING_CASTS.end()
            return out

        for name, new, old in (("__enter__", __enter__, enter), ("__exit__", __exit__, exit_)):
            setattr(scope, name, new)
            self.replaced.append((scope, name, old, new))

    def restore(self):
        """Put every original function back."""
        for module, attr, original, wrapped in reversed(self.replaced):
            if getattr(module, attr, None) is wrapped:
                setattr(module, attr, original)
        self.__init__()


def _policy(lists, op_name, target, cpu_plan, symbol_plan):
    category = lists.category(op_name)
    if category is None:
        return None
    cond = lists.conditional_fp32.get(op_name, ())
    fp32_on_cpu = op_name in cpu_plan.fp32_ops
    return wrappers.Policy(
        category=category, target=target, op_name=op_name,
        fp32_params=tuple(lists.fp32_params.get(op_name, ())),
        condition=cond, fp32_on_cpu=fp32_on_cpu,
        # float16 ops named in NO_CPU_KERNEL warn once each when they fall back on a CPU
        warn_on_cpu=fp32_on_cpu and target == "float16" and category == "low_precision",
        # nothing AMP builds can be low precision: a Symbol of unknown dtype is float32
        unknown_is_fp32=not symbol_plan.low_precision)


REGISTRY = PatchRegistry()


def init(target_dtype="float16", target_precision_ops=None, conditional_fp32_ops=None,
         fp32_ops=None):
    """Turn on automatic mixed precision: patch MXNet's operators for ``target_dtype``.

    Parameters are those of ``mxnet.contrib.amp.init``: ``target_dtype`` is ``'float16'``
    (GPU) or ``'bfloat16'`` (CPU) in any spelling, or ``'auto'``: float16 where the process
    has a GPU, bfloat16 where the CPU computes it natively (AVX512-BF16, AMX), float32 compute
    elsewhere (with one log line saying why; AMP, and so the loss scaler's skipping of
    non-finite steps, stays on). ``target_precision_ops``, ``fp32_ops``
    (lists of op names) and ``conditional_fp32_ops`` (``(op, parameter, [values])``) replace
    the default list of their category. Calling ``init`` again with the same arguments does
    nothing; with different ones it raises ``RuntimeError`` (call :func:`reset` first).
    Hybridized blocks that already built their graph rebuild it on their next call.

    On a CPU, ops without a kernel for the target compute in float32 with their inputs cast
    (float16 on any CPU; bfloat16 on CPUs of class 'none', see :mod:`mxamp.devices`), and a
    bfloat16 request on a CPU that lacks kernels or only emulates them warns once. Where
    nothing can run in low precision, training gives float32's results bit for bit.

    >>> from mxamp import amp
    >>> amp.init('bfloat16')                                   # doctest: +SKIP
    >>> mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=4).dtype   # doctest: +SKIP
    dtype([('bfloat16', '<u2')])
    """
    requested = dtypes.normalize_request(target_dtype)
    target = devices.target_for(requested, devices.GPU if opfuncs.gpu_available()
                                else devices.cpu_class())
    arguments = (requested, _frozen(target_precision_ops), _frozen(conditional_fp32_ops),
                 _frozen(fp32_ops))
    with REGISTRY.lock:
        if REGISTRY.active:
            if REGISTRY.arguments == arguments:
                return
            raise RuntimeError(
                "amp.init was already called with target_dtype=%r%s; a process runs one AMP "
                "configuration. Call mxamp.patching.reset() before initialising again."
                % (REGISTRY.target, "" if REGISTRY.target != target else
                   " and other op-list overrides"))
        lists = get_op_lists(target).with_overrides(
            target_precision_ops=target_precision_ops, conditional_fp32_ops=conditional_fp32_ops,
            fp32_ops=fp32_ops, known_ops=opfuncs.registered_ops().names,
            canonical=opfuncs.registered_ops().canonical)
        lists = _canonicalize(lists)
        cpu_plan = devices.plan(requested, lists, devices.cpu_class())
        symbol_plan = devices.plan(requested, lists, devices.symbol_device())
        REGISTRY.apply(target, lists, cpu_plan, symbol_plan)
        REGISTRY.arguments = arguments
        _set_reference_flag(True)
        rebuilt = _drop_cached_graphs()
    devices.warn_once(devices.cpu_notice(cpu_plan))
    if requested == dtypes.AUTO:
        LOG.info("mxamp: %s", cpu_plan.describe())
    LOG.info("mxamp: AMP on, target %s; %d operator functions wrapped in %.0f ms%s", target,
             len(REGISTRY.replaced), REGISTRY.init_seconds * 1e3,
             "; %d hybridized blocks will rebuild their graph" % rebuilt if rebuilt else "")


def _frozen(value):
    if value is None:
        return None
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)


def _canonicalize(lists):
    """Lists may name an alias (``flatten``); the patcher looks ops up by canonical name."""
    canon = opfuncs.registered_ops().canonical
    from dataclasses import replace  # pylint: disable=import-outside-toplevel

    def names(ops):
        return frozenset(canon.get(o, o) for o in ops)

    return replace(
        lists, low_precision=names(lists.low_precision), fp32=names(lists.fp32),
        widest=names(lists.widest), neutral=names(lists.neutral),
        conditional_fp32={canon.get(k, k): v for k, v in lists.conditional_fp32.items()},
        loss_output=names(lists.loss_output), no_cpu_kernel=names(lists.no_cpu_kernel),
        fp32_params={canon.get(k, k): v for k, v in lists.fp32_params.items()},
        no_kernel_by_cpu_class={c: names(o) for c, o in lists.no_kernel_by_cpu_class.items()})


def _set_reference_flag(value):
    """Libraries test ``mxnet.contrib.amp.amp._amp_initialized`` (GluonNLP's attention cell)."""
    try:
        from mxnet.contrib.amp import amp as reference  # pylint: disable=import-outside-toplevel
    except ImportError:  # pragma: no cover - every MXNet 1.9 build ships contrib.amp
        return
    reference._amp_initialized = value  # pylint: disable=protected-access


def _drop_cached_graphs():
    """Make hybridized blocks that already built their graph rebuild it (now with casts)."""
    from mxnet.gluon import HybridBlock  # pylint: disable=import-outside-toplevel
    count = 0
    for obj in gc.get_objects():
        if isinstance(obj, HybridBlock) and getattr(obj, "_cached_graph", ()):
            obj._clear_cached_op()  # pylint: disable=protected-access
            count += 1
    return count


def reset():
    """Undo :func:`init`: restore every original operator function (mainly for tests).

    >>> from mxamp import patching
    >>> patching.reset(); patching.is_initialized()
    False
    """
    with REGISTRY.lock:
        was_active = REGISTRY.active
        REGISTRY.restore()
        SYMBOL_DTYPES.clear()
        RECORDING_CASTS.end()
        _set_reference_flag(False)
        if was_active:
            _drop_cached_graphs()


def is_initialized():
    """True once :func:`init` has patched MXNet.

    >>> isinstance(is_initialized(), bool)
    True
    """
    return REGISTRY.active


def target_dtype():
    """``'float16'`` or ``'bfloat16'`` after :func:`init`, else None.

    >>> target_dtype() in (None, 'float16', 'bfloat16')
    True
    """
    return REGISTRY.target


def op_lists():
    """The :class:`~mxamp.lists.OpLists` in force (with the user's overrides), or None.

    >>> op_lists() is None or op_lists().target in ('float16', 'bfloat16')
    True
    """
    return REGISTRY.lists


def patch_state():
    """A summary of the patch: target, what this CPU computes, wrapped functions, modules, timing.

    ``cpu_compute`` is the dtype the low-precision ops compute in on this CPU (``'float32'``
    where it has no kernels for the target, or where ``'auto'`` chose float32), and
    ``cpu_fp32_ops`` the ops computed in float32 here whatever their category.

    >>> sorted(patch_state())[:4]
    ['bindings', 'categories', 'cpu_class', 'cpu_compute']
    """
    modules = sorted({module.__name__ for module, _, _, _ in REGISTRY.replaced
                      if isinstance(module, types.ModuleType)})
    cpu_plan = REGISTRY.cpu_plan
    return {
        "initialized": REGISTRY.active,
        "target_dtype": REGISTRY.target,
        "requested_dtype": REGISTRY.arguments[0] if REGISTRY.arguments else None,
        "cpu_class": devices.cpu_class(),
        "cpu_compute": cpu_plan.compute if cpu_plan else None,
        "cpu_fp32_ops": sorted(cpu_plan.fp32_ops) if cpu_plan else [],
        "cpu_plan": cpu_plan.describe() if cpu_plan else None,
        "wrapped_functions": len({id(w) for _, _, _, w in REGISTRY.replaced}),
        "bindings": len(REGISTRY.replaced),
        "categories": dict(REGISTRY.categories),
        "modules": modules,
        "init_ms": round(REGISTRY.init_seconds * 1e3, 1),
        "disabled": not wrappers.amp_enabled(),
        "tracked_symbols": len(SYMBOL_DTYPES),
    }


@contextlib.contextmanager
def disabled():
    """A region (of this thread) where AMP puts no op into low precision.

    Low-precision-list, float32-list and conditional ops get their inputs cast to float32;
    dtype-neutral ops (reshape, relu, optimizer updates, explicit casts) run in their input's
    dtype, as without AMP, so float32 inputs mean float32 everywhere. Imperative calls and
    graphs built inside the region are affected; a hybridized block keeps the graph it built.

    >>> from mxamp import amp
    >>> with amp.disabled():                                 # doctest: +SKIP
    ...     loss = custom_loss(pred, label)                  # runs in float32
    """
    state = wrappers.STATE
    state.disabled = getattr(state, "disabled", 0) + 1
    try:
        yield
    finally:
        state.disabled -= 1
