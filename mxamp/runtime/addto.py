"""Gradients that MXNet *adds* into their buffer, and the casts that would drop them.

MXNet 1.9.1's oneDNN ``amp_cast`` and ``amp_multicast`` (every CPU cast but float16's) ignore
a backward request to add into the gradient buffer: they compute the gradient and never
commit it. Measured on the Zen 4 before this module (``tests/test_addto_gradients.py``):

* ``grad_req='add'`` (gradient accumulation): a Dense layer under ``amp.init('bfloat16')``
  ended three passes with a zero weight gradient, hybridized or not, in mxamp and in the
  reference alike (float32: 6, the right sum);
* a hybridized ``foreach`` whose body uses a weight: the loop adds each step's gradient into
  it, and only the first step's arrived (a 5-step loop over a batch of 3: 3 instead of 27).

Only graph inputs receive added gradients: parameters whose ``grad_req`` is ``'add'``, the
free variables of a control-flow body, and leaf NDArrays. mxamp puts an ``identity`` between
such an input and its cast; ``identity``'s backward adds as asked, and the cast's backward
writes into the fresh buffer between them. It costs a float32 copy of that input for the
length of the cast, so it goes only where an add can come:

* in a graph a hybridized block builds, on its parameters with ``grad_req='add'`` (the
  block hook names them, :func:`building_block`; a later change of ``grad_req`` to or from
  ``'add'`` rebuilds the graphs), and on every input of a control-flow body
  (:func:`building_control_flow`);
* in a Symbol built outside a block (the Module API binds ``grad_req`` later), on every
  variable;
* imperatively, on a CPU array marked with ``grad_req='add'`` (by ``attach_grad`` or a
  Gluon parameter), while autograd records. MXNet does not tell an array's ``grad_req``, so
  ``import mxamp`` hooks the three ways to mark one and keeps the addresses of those marked
  ``'add'`` (:func:`note_marked`). An address MXNet reuses for another array costs that
  array a copy, never a gradient. Copying every leaf instead cost the imperative MLP 17-25%
  of its step time.

>>> import mxnet as mx
>>> w = mx.nd.ones((2,)); note_marked(w, 'add')
>>> with mx.autograd.record():
...     kept = addto_safe_array(w) is w
>>> kept
False
"""
import contextlib
import threading

import mxnet as mx

_ND_COPY = mx.nd.identity
_SYM_COPY = mx.sym.identity
_BUILD = threading.local()
#: Handle addresses of the arrays last marked with ``grad_req='add'``.
_ADDED = set()
_ADD_REQS = ("add", 3)   # as written, and MXNet's code for it (autograd._GRAD_REQ_MAP)


def note_marked(arrays, reqs):
    """Remember which of ``arrays`` (one or a list) were just marked ``grad_req='add'``;
    ``reqs`` is one request for all, or one each. Called by the hooks of ``import mxamp``.

    >>> a = mx.nd.ones((1,)); note_marked(a, 'add'); a.handle.value in _ADDED
    True
    >>> note_marked([a], ['write']); a.handle.value in _ADDED
    False
    """
    arrays = arrays if isinstance(arrays, (list, tuple)) else [arrays]
    reqs = reqs if isinstance(reqs, (list, tuple)) else [reqs] * len(arrays)
    for array, req in zip(arrays, reqs):
        if req in _ADD_REQS:
            _ADDED.add(array.handle.value)
        else:
            _ADDED.discard(array.handle.value)


@contextlib.contextmanager
def building_block(addto_names):
    """While a hybridized block builds its graph: the names of its parameters whose gradients
    are added (``grad_req='add'``); the other parameters get no copy."""
    outer = getattr(_BUILD, "addto_names", None)
    _BUILD.addto_names = frozenset(addto_names)
    try:
        yield
    finally:
        _BUILD.addto_names = outer


@contextlib.contextmanager
def building_control_flow():
    """While a ``foreach``/``while_loop``/``cond`` body is built: every input is copied."""
    _BUILD.control_flow = getattr(_BUILD, "control_flow", 0) + 1
    try:
        yield
    finally:
        _BUILD.control_flow -= 1


def addto_names(block):
    """The names of ``block``'s parameters whose ``grad_req`` is ``'add'``.

    >>> addto_names(mx.gluon.nn.Dense(2, in_units=2))
    []
    """
    return [p.name for p in block.collect_params().values() if p.grad_req == "add"]


def gets_added(sym):
    """True when MXNet may add, not write, ``sym``'s gradient in the graph being built."""
    if sym.get_children() is not None:
        return False        # an operator's output: its gradient is written, never added
    if getattr(_BUILD, "control_flow", 0):
        return True
    names = getattr(_BUILD, "addto_names", None)
    return names is None or sym.name in names


def addto_safe_symbol(sym):
    """``sym`` behind an ``identity`` when its gradient may be added, else ``sym`` itself.

    >>> x = mx.sym.var('x')
    >>> addto_safe_symbol(x) is x, addto_safe_symbol(x * 2).name.startswith('_mul')
    (False, True)
    >>> with building_block(['w']):
    ...     addto_safe_symbol(x) is x
    True
    """
    return _SYM_COPY(sym) if gets_added(sym) else sym


def addto_safe_array(arr, marked=None):
    """``arr`` copied first when ``marked`` (default: ``arr`` itself, of which ``arr`` may be
    a legacy view) is a CPU array marked ``grad_req='add'`` and autograd records; else
    ``arr`` itself."""
    if (marked if marked is not None else arr).handle.value in _ADDED and \
            mx.autograd.is_recording() and arr.context.device_type == "cpu":
        return _ND_COPY(arr)
    return arr
