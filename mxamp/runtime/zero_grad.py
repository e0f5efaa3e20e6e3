"""Inputs that get no gradient, and the recorded casts in front of them that crash backward.

MXNet 1.9.1's imperative autograd keeps an op's input for backward only when the op's
gradient function (``FGradient``), called once at record time with a placeholder output
gradient, refers to it. The casts (``amp_cast``, ``Cast``) and the other element-wise ops
whose gradient ignores their data (``ElemwiseGradUseNone``) keep nothing. But when their
output gradient turns out to be zero (``zeros_like``/``_zeros``), ``MakeNonlossGradNode``
returns ``zeros_like(input)`` instead: a node that reads the input they never kept. Where that
input came from an op whose backward always runs and does not keep its own output
(``FullyConnected``, ``Convolution``, ``Deconvolution``, ...), ``Imperative::Backward`` feeds
the empty placeholder array to ``zeros_like`` and ``SetDependency`` dereferences it:
"Segmentation fault: 11" at ``l.backward()``. Hybridized blocks keep every array and are safe.

An op of :data:`ZERO_GRAD_INPUTS` (a comparison, ``argmax``, ``one_hot``, numpy ``var``,
...) gives such an input a zero gradient, and keeps the input itself. Without AMP it keeps the
FullyConnected output and backward runs; under ``amp.init`` the input it keeps is AMP's cast,
and the FullyConnected output behind the cast is lost: ``(dense(x) > 0) * v`` crashed. So
wherever mxamp casts an input of one of these ops while autograd records, it also keeps the
array it cast (:func:`keep_for_backward`): the graph and every gradient are the ones of the
same code without AMP (the score weights of a hard gate get their zero gradient, fresh), at
the memory cost float32 has anyway (the kept array is the one float32 keeps, here in
bfloat16).

Not covered: a chain of ops that keep nothing between the producer and the zero gradient.
``(dense(x) * 2) > 0`` or ``dense(x).reshape(-1) > 0`` crash without AMP as well (MXNet's own
bug); ``abs(dense(x)) > 0.1`` and ``(dense(x) * y) > 0`` (``y`` a tensor) run in float32 but
crash under ``amp.init``, where ``abs``/``mul`` keep AMP's cast instead of the Dense output.
Keeping every recorded cast's input would cover them, at the memory of each low-precision
output that only a cast reads (a Transformer's residual branches), so it is not done.

>>> zero_grad_positions('_greater_scalar'), zero_grad_positions('where')
(None, (0,))
>>> zero_grad_positions('FullyConnected') is NOT_ZERO_GRAD
True
"""
import functools

import mxnet as mx

from mxamp.backend import registry

# Captured before any patching, like mxamp's casts (mxamp.runtime.casting).
_ND_SHAPE_ARRAY = mx.nd.shape_array
_NDArray = mx.nd.NDArray

#: Answer of :func:`zero_grad_positions` for ops whose inputs all get a gradient.
NOT_ZERO_GRAD = ()

# Forward ops whose FGradient is MakeZeroGradNodes in MXNet 1.9.1 (every input gets
# ``zeros_like(input)``), by canonical name; aliases are found in the registry. From
# src/operator/**/*.cc of the v1.x branch (grep MakeZeroGradNodes).
_ALL_INPUTS = (
    # comparisons and logic, legacy and numpy
    "_equal", "_not_equal", "_greater", "_greater_equal", "_lesser", "_lesser_equal",
    "_logical_and", "_logical_or", "_logical_xor", "_equal_scalar", "_not_equal_scalar",
    "_greater_scalar", "_greater_equal_scalar", "_lesser_scalar", "_lesser_equal_scalar",
    "_logical_and_scalar", "_logical_or_scalar", "_logical_xor_scalar", "logical_not",
    "broadcast_equal", "broadcast_not_equal", "broadcast_greater", "broadcast_greater_equal",
    "broadcast_lesser", "broadcast_lesser_equal", "broadcast_logical_and",
    "broadcast_logical_or", "broadcast_logical_xor",
    "_npi_equal", "_npi_not_equal", "_npi_greater", "_npi_less", "_npi_greater_equal",
    "_npi_less_equal", "_npi_equal_scalar", "_npi_not_equal_scalar", "_npi_greater_scalar",
    "_npi_less_scalar", "_npi_greater_equal_scalar", "_npi_less_equal_scalar",
    "_npi_logical_not", "_npi_isnan", "_npi_isinf", "_npi_isfinite", "_npi_isposinf",
    "_npi_isneginf", "_np_all", "_np_any",
    # indices of extrema and orderings
    "argmax", "argmin", "_npi_argmax", "_npi_argmin", "argsort",
    # rounding
    "ceil", "floor", "round", "rint", "fix", "trunc", "_npi_ceil", "_npi_floor", "_npi_rint",
    "_npi_fix", "_npi_trunc", "_npi_around",
    # statistics and counts without a gradient in 1.9.1 (np.var and np.std among them)
    "_npi_var", "_npi_std", "_npi_percentile", "_npi_bincount", "_npi_unique", "_npx_nonzero",
    # indices, shapes and constants made from a tensor
    "one_hot", "shape_array", "size_array", "zeros_like", "ones_like", "_npi_full_like",
    "BlockGrad", "_contrib_arange_like", "_contrib_index_array", "_npi_diag_indices_from",
    "_ravel_multi_index", "_unravel_index", "_np_atleast_1d", "_np_atleast_2d",
    "_np_atleast_3d",
    # box coding, numpy linear algebra without a gradient, quantization
    "_contrib_box_encode", "_contrib_box_decode", "_npi_eig", "_npi_eigh", "_npi_eigvals",
    "_npi_eigvalsh", "_npi_pinv", "_npi_pinv_scalar_rcond", "_contrib_quantize",
    "_contrib_quantize_v2", "_contrib_dequantize", "_contrib_requantize",
    "_npi_boolean_mask_assign_scalar", "_npi_boolean_mask_assign_tensor",
)

# Ops with a gradient for some inputs only: canonical name -> positions of the inputs that get
# ``zeros_like`` (keyword names in :func:`_slot_keys`).
_SOME_INPUTS = {
    "where": (0,), "_npi_where": (0,), "_npi_where_lscalar": (0,), "_npi_where_rscalar": (0,),
    "broadcast_like": (1,), "reshape_like": (1,), "pick": (1,),
}

# topk's gradient is zero unless it returns values (ret_typ 'value' or 'both').
_TOPK = ("topk",)


@functools.lru_cache(maxsize=None)
def _canonical_table():
    table = {name: None for name in _ALL_INPUTS}
    table.update(_SOME_INPUTS)
    table.update({name: "topk" for name in _TOPK})
    return {registry.canonical_name(name): where for name, where in table.items()}


def zero_grad_positions(op_name):
    """Where ``op_name``'s inputs (any alias) get a zero gradient: None (all of them), a tuple
    of positions, ``'topk'`` (all, unless it returns values) or :data:`NOT_ZERO_GRAD`."""
    return _canonical_table().get(registry.canonical_name(op_name), NOT_ZERO_GRAD)


def _input_names(func):
    code = getattr(func, "__code__", None)
    return code.co_varnames[:code.co_argcount] if code is not None else ()


def zero_grad_slots(op_name, func):
    """A test ``(slot, kwargs) -> bool``: does the input in ``slot`` (``('a', i)`` or
    ``('k', name)``, :mod:`mxamp.patching.wrappers`' slots) get a zero gradient from this call?
    None when no input of ``op_name`` ever does (the common case: nothing to do at run time).
    """
    where = zero_grad_positions(op_name)
    if where == NOT_ZERO_GRAD:
        return None
    if where is None:
        return lambda slot, kwargs: True
    if where == "topk":
        return lambda slot, kwargs: str(kwargs.get("ret_typ", "indices")) not in ("value",
                                                                                 "both")
    names = _input_names(func)
    keys = {("a", i) for i in where} | {("k", names[i]) for i in where if i < len(names)}
    return lambda slot, kwargs: slot in keys


def keep_for_backward(arr):
    """Make autograd keep ``arr`` (an NDArray it records) for backward: record a tiny op whose
    gradient refers to its input (``shape_array``), and drop its result. Its node is never in
    a backward graph; what it leaves is ``arr`` saved in its producer's record, where the
    ``zeros_like`` of a cast's backward finds it (see the module docstring)."""
    if not isinstance(arr, _NDArray) or arr.stype != "default":
        return
    legacy = arr.as_nd_ndarray() if isinstance(arr, mx.np.ndarray) else arr
    _ND_SHAPE_ARRAY(legacy)
