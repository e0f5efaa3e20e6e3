"""Wrap one operator function so that it runs in the precision its op list gives it.

``make_wrapper`` reads an :class:`~mxamp.precision.plan.OpRule` (what the plan says about one operator)
and returns a function with the original's name, doc and signature behaviour that casts the
tensor inputs before calling the original:

* ``low_precision``: float inputs to the target dtype (``fp32_params`` inputs excepted);
* ``fp32``: low-precision inputs to float32;
* ``widest``: every float input to the widest float type among them;
* ``neutral``: nothing (on Symbols the output's dtype is still tracked);
* ``conditional_fp32``: like ``fp32`` where one of its conditions holds (a parameter value,
  or a shape: :mod:`mxamp.lists.conditions`), its own category (``base``) elsewhere.

A CPU class may add conditions of its own (``cpu_conditions``: shapes whose bfloat16 kernel
corrupts memory there): where one holds on a CPU the op computes in float32.

Which of these applies to one call is :func:`mxamp.precision.plan.decide`'s answer; this module only casts.
Ops the CPU's :class:`~mxamp.precision.device_plan.DevicePlan` computes in float32 (float16 GEMMs on any CPU,
oneDNN ops on a CPU without bfloat16 kernels) behave as ``fp32`` on CPU arrays, and in Symbols
when the process has no GPU; float16 GEMMs warn once each. When nothing AMP builds can be low
precision (``unknown_is_fp32``), a Symbol of unknown dtype counts as float32 and gets no cast:
a graph then has exactly the nodes it has without AMP, so it computes float32's results bit
for bit (an identity cast still reorders gradient sums). Inside
:func:`mxamp.patching.patcher.disabled` no op runs in low precision: every op but the dtype-neutral
ones behaves as ``fp32``.

>>> import mxnet as mx
>>> from mxamp.precision.plan import OpRule
>>> from mxamp.patching.wrappers import make_wrapper
>>> relu = make_wrapper(mx.nd.relu, OpRule('fp32', 'bfloat16'), is_symbol=False)
>>> relu(mx.nd.ones((2,), dtype='float16')).dtype
<class 'numpy.float32'>
"""

from mxnet.autograd import is_recording

from mxamp import dtypes
from mxamp.runtime.casting import NDArray, Symbol, array_dtype
from mxamp.backend.mxnet_private import NumpySymbol, rebuild_symbol
from mxamp.backend.devices import gpu_available
from mxamp.backend.graphs import symbol_data_shape
from mxamp.runtime.hooks import building_input_shapes
from mxamp.precision.plan import amp_enabled, decide
from mxamp.lists.bfloat16 import ONEDNN_TWINS
from mxamp.lists.float16 import NO_CPU_KERNEL_WHY
from mxamp.runtime.state import STATE

_FLOATS = ("float16", "bfloat16", "float32")
_NOT_INPUTS = ("out", "name", "attr")
_CAST_OPS = ("Cast", "amp_cast", "_npi_cast")
_OUTPUT_FOLLOWS_LAST = ("Embedding", "_contrib_SparseEmbedding")

def _warn_cpu_fallback(op_name):
    STATE.warn_once("mxamp: %s runs in float32 on the CPU: float16 is computed on GPUs only (%s; "
                    "float16 needs a GPU context)" % (op_name, NO_CPU_KERNEL_WHY),
                    key=op_name, kind="op", stacklevel=4)


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


def _decide(rule, kwargs, on_cpu, data_shape):
    """:func:`mxamp.precision.plan.decide`, warning once per float16 GEMM that falls back to float32
    on a CPU. A call is for training where autograd records it (a Symbol: where the graph is
    built inside ``autograd.record()``)."""
    if rule.warn_on_cpu and on_cpu() and amp_enabled():
        _warn_cpu_fallback(rule.op_name)
    return decide(rule, kwargs, on_cpu, data_shape, is_recording)


_NO_SKIP = frozenset()


def _skip_names(rule, func):
    """Slot keys of inputs a low-precision op keeps in float32."""
    if not rule.fp32_params:
        return _NO_SKIP
    names = _positional_names(func)
    skip = {("k", n) for n in rule.fp32_params}
    skip |= {("a", i) for i, n in enumerate(names) if n in rule.fp32_params}
    return frozenset(skip)


def _onednn_twin(rule):
    """The Activation ``act_type`` that computes ``rule``'s op with oneDNN on bfloat16 data
    (:data:`mxamp.lists.bfloat16.ONEDNN_TWINS`), or None: only under the default lists (an
    override or a policy decides for itself) and where Activation computes in bfloat16."""
    act = ONEDNN_TWINS.get(rule.op_name)
    if act is None or rule.target != "bfloat16" or rule.category != "fp32" or rule.fp32_on_cpu:
        return None
    plan, arguments = STATE.plan, STATE.arguments
    # arguments: (request, target_precision_ops, conditional_fp32_ops, fp32_ops, policy)
    if plan is None or arguments is None or any(a is not None for a in arguments[1:]):
        return None
    cpu = plan.cpu
    return act if cpu.low_precision and "Activation" not in cpu.fp32_ops else None


def _call_twin(data, act, name=None):
    """``Activation(data, act_type=act)`` in the namespace of ``data``'s type."""
    import mxnet as mx
    if isinstance(data, Symbol):
        if isinstance(data, NumpySymbol):
            return mx.sym.npx.activation(data, act_type=act, name=name)
        return mx.sym.Activation(data, act_type=act, name=name)
    if isinstance(data, mx.np.ndarray):
        return mx.npx.activation(data, act_type=act)
    return mx.nd.Activation(data, act_type=act)


def _ndarray_wrapper(func, rule):
    skip = _skip_names(rule, func)
    neutral = rule.category == "neutral" and not rule.fp32_on_cpu
    twin = _onednn_twin(rule)

    def wrapped(*args, **kwargs):
        if neutral:
            return func(*args, **kwargs)
        slots = _tensor_slots(args, kwargs, NDArray)
        if not slots:
            return func(*args, **kwargs)
        args = list(args)
        first = _get(args, kwargs, slots[0])
        mode, to = _decide(rule, kwargs, lambda: dtypes.is_cpu(first.context),
                         lambda: first.shape)
        if (twin and to == "float32" and len(slots) == 1 and kwargs.get("out") is None
                and array_dtype(first) == "bfloat16" and dtypes.is_cpu(first.context)):
            return _call_twin(first, twin)
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


def _symbol_output_dtype(rule, mode, to, in_dtypes, kwargs):
    if rule.op_name in _CAST_OPS and "dtype" in kwargs:
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
    if rule.op_name in _OUTPUT_FOLLOWS_LAST:
        return in_dtypes[-1]
    return in_dtypes[0]


def _symbol_wrapper(func, rule):
    skip = _skip_names(rule, func)
    table = STATE.symbol_dtypes
    twin = _onednn_twin(rule)

    unknown = "float32" if rule.unknown_is_fp32 else None

    def wrapped(*args, **kwargs):
        slots = _tensor_slots(args, kwargs, Symbol)
        args = list(args)
        mode, to = _decide(rule, kwargs, lambda: not gpu_available(),
                         lambda: symbol_data_shape(_get(args, kwargs, slots[0]),
                                                           building_input_shapes())
                         if slots else None)
        in_dtypes = [table.dtype_of(_get(args, kwargs, s)) or unknown for s in slots]
        if twin and to == "float32" and in_dtypes == ["bfloat16"] and kwargs.get("out") is None:
            return _call_twin(_get(args, kwargs, slots[0]), twin, kwargs.get("name"))
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
            out = _cast_implicit_inputs(out, explicit, to, rule)
        if isinstance(out, Symbol):
            table.record(out, _symbol_output_dtype(rule, mode, to, in_dtypes, kwargs))
        return out

    return wrapped


def _cast_implicit_inputs(out, explicit, to, rule):
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
        keep = name in aux or any(name.endswith("_" + p) for p in rule.fp32_params)
        if keep or name in explicit:
            inputs.append(child)
        else:
            inputs.append(STATE.symbol_dtypes.cast(child, to))
    return rebuild_symbol(out, inputs, out.name)


def make_wrapper(func, rule, is_symbol):
    """A function that applies ``rule`` to ``func``'s inputs, then calls ``func``.

    It carries ``func``'s name, qualified name, module and docstring (what ``help()`` and
    tracebacks show), ``__wrapped__`` (the original) and ``__mxamp_rule__``.
    (``functools.wraps`` would also copy ``__dict__``; generated operator functions have none,
    and skipping it keeps ``amp.init`` fast.)

    >>> import mxnet as mx
    >>> from mxamp.precision.plan import OpRule
    >>> w = make_wrapper(mx.sym.softmax, OpRule('fp32', 'bfloat16', 'softmax'),
    ...                  is_symbol=True)
    >>> w(mx.sym.var('x')).get_children().name.startswith('amp_cast'), w.__name__
    (True, 'softmax')
    """
    build = _symbol_wrapper if is_symbol else _ndarray_wrapper
    wrapped = build(func, rule)
    wrapped.__name__, wrapped.__qualname__ = func.__name__, func.__qualname__
    wrapped.__module__, wrapped.__doc__ = func.__module__, func.__doc__
    wrapped.__wrapped__, wrapped.__mxamp_rule__ = func, rule
    return wrapped
