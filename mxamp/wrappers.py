"""Wrap one operator function so that it runs in the precision its op list gives it.

``make_wrapper`` reads a :class:`Policy` (what the op lists say about one operator) and returns a
function with the original's name, doc and signature behaviour that casts the tensor inputs
before calling the original:

* ``low_precision``: float inputs to the target dtype (``fp32_params`` inputs excepted);
* ``fp32``: low-precision inputs to float32;
* ``widest``: every float input to the widest float type among them;
* ``neutral``: nothing (on Symbols the output's dtype is still tracked);
* ``conditional_fp32``: like ``fp32`` where one of its conditions holds (a parameter value,
  or a shape: :mod:`mxamp.lists.conditions`), its own category (``base``) elsewhere.

A CPU class may add conditions of its own (``cpu_conditions``: shapes whose bfloat16 kernel
corrupts memory there): where one holds on a CPU the op computes in float32.

Ops the CPU's :class:`~mxamp.devices.DevicePlan` computes in float32 (float16 GEMMs on any CPU,
oneDNN ops on a CPU without bfloat16 kernels) behave as ``fp32`` on CPU arrays, and in Symbols
when the process has no GPU; float16 GEMMs warn once each. When nothing AMP builds can be low
precision (``unknown_is_fp32``), a Symbol of unknown dtype counts as float32 and gets no cast:
a graph then has exactly the nodes it has without AMP, so it computes float32's results bit
for bit (an identity cast still reorders gradient sums). Inside
:func:`mxamp.patching.disabled` no op runs in low precision: every op but the dtype-neutral
ones behaves as ``fp32``.

>>> import mxnet as mx
>>> from mxamp.wrappers import Policy, make_wrapper
>>> relu = make_wrapper(mx.nd.relu, Policy('fp32', 'bfloat16'), is_symbol=False)
>>> relu(mx.nd.ones((2,), dtype='float16')).dtype
<class 'numpy.float32'>
"""
import warnings
from typing import NamedTuple

from . import dtypes
from .casting import NDArray, Symbol, array_dtype
from .mxnet_private import rebuild_symbol
from .opfuncs import gpu_available
from .gluon_graph import symbol_data_shape
from .state import STATE

_FLOATS = ("float16", "bfloat16", "float32")
_NOT_INPUTS = ("out", "name", "attr")
_CAST_OPS = ("Cast", "amp_cast", "_npi_cast")
_OUTPUT_FOLLOWS_LAST = ("Embedding", "_contrib_SparseEmbedding")

def amp_enabled():
    """False inside ``amp.disabled()`` on this thread.

    >>> amp_enabled()
    True
    """
    return not STATE.disabled_depth()


class Policy(NamedTuple):
    """What the op lists say about one operator, for one target dtype (immutable; a named
    tuple because ``amp.init`` makes hundreds).

    >>> Policy('fp32', 'bfloat16', 'softmax').category
    'fp32'
    """

    category: str                    # one of mxamp.lists.CATEGORIES
    target: str                      # 'float16' or 'bfloat16'
    op_name: str = ""
    fp32_params: tuple = ()          # input names kept float32 by low-precision ops
    conditions: tuple = ()           # mxamp.lists.conditions.Condition s of conditional_fp32
    fp32_on_cpu: bool = False        # computed in float32 on this CPU (no kernel / no gain)
    warn_on_cpu: bool = False        # warn once when it falls back to float32 on a CPU
    unknown_is_fp32: bool = False    # Symbols of unknown dtype are float32 (nothing is low)
    base: str = "neutral"            # a conditional op's category where no condition holds
    cpu_conditions: tuple = ()       # float32 on this CPU's class where one of these holds


def _warn_cpu_fallback(op_name):
    if STATE.first_time(op_name, STATE.warned_ops):
        warnings.warn("mxamp: %s runs in float32 on the CPU: float16 is computed on GPUs "
                      "only (MXNet has no float16 GEMM or convolution CPU kernel; float16 "
                      "needs a GPU context)" % op_name, RuntimeWarning, stacklevel=4)


def _tensor_slots(args, kwargs, tensor_type):
    """Positions (('a', i) or ('k', name)) of the tensor inputs of a call."""
    slots = [("a", i) for i, a in enumerate(args) if isinstance(a, tensor_type)]
    slots += [("k", k) for k, v in kwargs.items()
              if k not in _NOT_INPUTS and isinstance(v, tensor_type)]
    return slots


def _get(args, kwargs, slot):
    return args[slot[1]] if slot[0] == "a" else kwargs[slot[1]]


def _set(args, kwargs, slot, value):
    if slot[0] == "a":
        args[slot[1]] = value
    else:
        kwargs[slot[1]] = value


def _positional_names(func):
    """Names of ``func``'s positional-or-keyword parameters, from its code object (generated
    operator functions are plain functions; ``inspect.signature`` costs 100x more)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return ()
    return code.co_varnames[:code.co_argcount]


def _first_holding(conditions, kwargs, data_shape):
    """The first of ``conditions`` that holds, or None; ``data_shape()`` is asked only if one
    needs it."""
    shape = None
    for cond in conditions:
        if shape is None and cond.needs_shapes():
            shape = data_shape() or ()
        if cond.holds(kwargs, shape):
            return cond
    return None


def _plan(policy, kwargs, on_cpu, data_shape=lambda: None):
    """Decide ('to', dtype) / ('widest', None) / ('none', None) for one call."""
    cat = policy.category
    if policy.fp32_on_cpu and on_cpu():
        # no kernel for the target on this CPU (or no gain): float32 even inside disabled()
        if policy.warn_on_cpu and amp_enabled():
            _warn_cpu_fallback(policy.op_name)
        return "to", "float32"
    if not amp_enabled():
        # amp.disabled(): nothing is put into low precision. Dtype-neutral ops (optimizer
        # updates writing `out=`, explicit casts...) are left exactly as without AMP.
        return ("none", None) if cat == "neutral" else ("to", "float32")
    if policy.cpu_conditions and on_cpu() and _first_holding(policy.cpu_conditions, kwargs,
                                                             data_shape):
        # a shape this CPU class must not (or should not) run in low precision
        return "to", "float32"
    if cat == "conditional_fp32":
        # float32 where a condition holds; the op's own list elsewhere
        cat = "fp32" if _first_holding(policy.conditions, kwargs, data_shape) else policy.base
    if cat == "low_precision":
        return "to", policy.target
    if cat == "fp32":
        return "to", "float32"
    if cat == "widest":
        return "widest", None
    return "none", None


#: The decision of one call: ('to', dtype) / ('widest', None) / ('none', None).
decide = _plan


def explain(policy, kwargs, on_cpu, data_shape):
    """Why :func:`decide` decided what it did for one call, in words.

    >>> explain(Policy('fp32', 'bfloat16', 'softmax'), {}, True, None)
    "softmax is in the 'fp32' list for bfloat16"
    """
    where = "on this CPU" if on_cpu else "on a GPU"
    if policy.fp32_on_cpu and on_cpu:
        return "%s computes in float32 %s (no %s kernel or no gain here)" % (
            policy.op_name, where, policy.target)
    if not amp_enabled():
        return "inside amp.disabled()"
    cond = _first_holding(policy.cpu_conditions, kwargs, lambda: data_shape) if on_cpu else None
    if cond is not None:
        return "%s: %s holds %s: %s" % (policy.op_name, cond.describe(), where, cond.reason)
    if policy.category == "conditional_fp32":
        cond = _first_holding(policy.conditions, kwargs, lambda: data_shape)
        if cond is not None:
            return "%s: its float32 condition %s holds" % (policy.op_name, cond.describe())
        return "%s: no float32 condition holds, so its own list decides (%r)" % (
            policy.op_name, policy.base)
    return "%s is in the %r list for %s" % (policy.op_name, policy.category, policy.target)


_NO_SKIP = frozenset()


def _skip_names(policy, func):
    """Slot keys of inputs a low-precision op keeps in float32."""
    if not policy.fp32_params:
        return _NO_SKIP
    names = _positional_names(func)
    skip = {("k", n) for n in policy.fp32_params}
    skip |= {("a", i) for i, n in enumerate(names) if n in policy.fp32_params}
    return frozenset(skip)


def _ndarray_wrapper(func, policy):
    skip = _skip_names(policy, func)
    neutral = policy.category == "neutral" and not policy.fp32_on_cpu

    def wrapped(*args, **kwargs):
        if neutral:
            return func(*args, **kwargs)
        slots = _tensor_slots(args, kwargs, NDArray)
        if not slots:
            return func(*args, **kwargs)
        args = list(args)
        first = _get(args, kwargs, slots[0])
        mode, to = _plan(policy, kwargs, lambda: dtypes.is_cpu(first.context),
                         lambda: first.shape)
        if mode == "to":
            for slot in slots:
                if slot in skip and to != "float32":
                    continue
                arr = _get(args, kwargs, slot)
                cur = array_dtype(arr)
                if cur is not None and cur != to and (to != "float32" or cur != "float64"):
                    _set(args, kwargs, slot, STATE.recording_casts.cast(arr, to))
        elif mode == "widest":
            found = [array_dtype(_get(args, kwargs, s)) for s in slots]
            kinds = {d for d in found if d is not None}
            if len(kinds) > 1:
                wide = dtypes.widest(kinds)
                for slot, cur in zip(slots, found):
                    if cur is not None and cur != wide:
                        _set(args, kwargs, slot,
                             STATE.recording_casts.cast(_get(args, kwargs, slot), wide))
        return func(*args, **kwargs)

    return wrapped


def _symbol_output_dtype(policy, mode, to, in_dtypes, kwargs):
    if policy.op_name in _CAST_OPS and "dtype" in kwargs:
        try:
            return dtypes.name_of(kwargs["dtype"])
        except TypeError:
            return None
    if mode == "to":
        return to
    if not in_dtypes:
        return None
    if mode == "widest":
        return None if None in in_dtypes else dtypes.widest(set(in_dtypes))
    # A dtype-neutral op returns the dtype of its data input: the first one (BatchNorm's
    # statistics stay float32 while its data is low precision), or Embedding's weight.
    if policy.op_name in _OUTPUT_FOLLOWS_LAST:
        return in_dtypes[-1]
    return in_dtypes[0]


def _symbol_wrapper(func, policy):
    skip = _skip_names(policy, func)
    table = STATE.symbol_dtypes

    unknown = "float32" if policy.unknown_is_fp32 else None

    def wrapped(*args, **kwargs):
        slots = _tensor_slots(args, kwargs, Symbol)
        args = list(args)
        mode, to = _plan(policy, kwargs, lambda: not gpu_available(),
                         lambda: symbol_data_shape(_get(args, kwargs, slots[0]))
                         if slots else None)
        in_dtypes = [table.dtype_of(_get(args, kwargs, s)) or unknown for s in slots]
        if mode == "to":
            for slot, cur in zip(slots, in_dtypes):
                if (slot in skip and to != "float32") or cur == to or cur == "float64":
                    continue
                if cur is None or cur in _FLOATS:
                    _set(args, kwargs, slot, table.cast(_get(args, kwargs, slot), to))
        elif mode == "widest" and len(slots) > 1:
            known = {d for d in in_dtypes if d is not None}
            if None in in_dtypes:
                casted = table.multicast([_get(args, kwargs, s) for s in slots])
                for slot, sym in zip(slots, casted):
                    _set(args, kwargs, slot, sym)
            elif len(known) > 1:
                wide = dtypes.widest(known)
                for slot, cur in zip(slots, in_dtypes):
                    if cur != wide:
                        _set(args, kwargs, slot, table.cast(_get(args, kwargs, slot), wide))
        out = func(*args, **kwargs)
        if mode == "to" and to != "float32" and slots:
            explicit = {_get(args, kwargs, s).name for s in slots}
            out = _cast_implicit_inputs(out, explicit, to, policy)
        if isinstance(out, Symbol):
            table.record(out, _symbol_output_dtype(policy, mode, to, in_dtypes, kwargs))
        return out

    return wrapped


def _cast_implicit_inputs(out, explicit, to, policy):
    """Cast inputs MXNet created implicitly (``sym.FullyConnected(x, num_hidden=8)``).

    ``explicit`` holds the names of the inputs the caller passed (already cast)."""
    if not isinstance(out, Symbol) or len(out.list_outputs()) != 1:
        return out
    children = out.get_children()
    if children is None or len(children.list_outputs()) <= len(explicit):
        return out
    aux = set(out.list_auxiliary_states())
    inputs = []
    for i in range(len(children.list_outputs())):
        child = children[i]
        name = child.name
        keep = name in aux or any(name.endswith("_" + p) for p in policy.fp32_params)
        if keep or name in explicit:
            inputs.append(child)
        else:
            inputs.append(STATE.symbol_dtypes.cast(child, to))
    return rebuild_symbol(out, inputs, out.name)


def make_wrapper(func, policy, is_symbol):
    """A function that applies ``policy`` to ``func``'s inputs, then calls ``func``.

    It carries ``func``'s name, qualified name, module and docstring (what ``help()`` and
    tracebacks show), ``__wrapped__`` (the original) and ``__mxamp_policy__``.
    (``functools.wraps`` would also copy ``__dict__``; generated operator functions have none,
    and skipping it keeps ``amp.init`` fast.)

    >>> import mxnet as mx
    >>> w = make_wrapper(mx.sym.softmax, Policy('fp32', 'bfloat16', 'softmax'), is_symbol=True)
    >>> w(mx.sym.var('x')).get_children().name.startswith('amp_cast'), w.__name__
    (True, 'softmax')
    """
    build = _symbol_wrapper if is_symbol else _ndarray_wrapper
    wrapped = build(func, policy)
    wrapped.__name__, wrapped.__qualname__ = func.__name__, func.__qualname__
    wrapped.__module__, wrapped.__doc__ = func.__module__, func.__doc__
    wrapped.__wrapped__, wrapped.__mxamp_policy__ = func, policy
    return wrapped
