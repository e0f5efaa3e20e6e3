"""Cast insertion: differentiable ``amp_cast`` / ``amp_multicast`` for NDArrays and Symbols.

Casts go through MXNet's ``amp_cast`` operator so that they are differentiable, show up in
symbols, and leave non-float tensors alone. The original operator functions are captured when
this module is imported, so casting keeps working while :mod:`mxamp.patching` has the
namespaces patched.

Symbols cannot carry Python attributes (``Symbol`` has ``__slots__``) nor weak references, so
:class:`SymbolDtypes` remembers, by object identity, which dtype AMP gave each Symbol it built
and which casts of it exist already: a Symbol consumed by three float32 ops is cast once.

>>> import mxnet as mx
>>> from mxamp import casting
>>> casting.cast_ndarray(mx.nd.ones((2,)), 'float16').dtype
<class 'numpy.float16'>
"""
import collections
import threading

import mxnet as mx
import numpy as np

from . import dtypes

# Captured before any patching: mxamp's own casts must never go through wrapped functions.
_ND_AMP_CAST = mx.nd.amp_cast
_ND_AMP_MULTICAST = mx.nd.amp_multicast
_SYM_AMP_CAST = mx.sym.amp_cast
_SYM_AMP_MULTICAST = mx.sym.amp_multicast

NDArray = mx.nd.NDArray
NPArray = mx.np.ndarray
Symbol = mx.sym.Symbol
NPSymbol = mx.sym.np._Symbol

# ``NDArray.dtype`` is a numpy scalar type for legacy arrays and a numpy dtype for mx.np arrays;
# both spellings map to a canonical name without the cost of ``np.dtype()`` on every call.
_DTYPE_NAMES = {}
for _name in ("float16", "float32", "float64"):
    _DTYPE_NAMES[getattr(np, _name)] = _name
    _DTYPE_NAMES[np.dtype(_name)] = _name
_DTYPE_NAMES[dtypes.BFLOAT16] = "bfloat16"

_FLAG_NAMES = {str(flag): name for name, flag in dtypes.TYPE_FLAGS.items()}


def array_dtype(arr):
    """Canonical float name of an NDArray's dtype, or None for non-float arrays.

    >>> array_dtype(mx.nd.ones((1,), dtype='float16'))
    'float16'
    """
    return _DTYPE_NAMES.get(arr.dtype)


def cast_ndarray(arr, to):
    """``arr`` cast to the float type named ``to`` with ``amp_cast`` (no-op if it already is).

    Works for legacy and ``mx.np`` arrays; the result has the input's array type.

    >>> cast_ndarray(mx.np.ones((2,)), 'float16').dtype
    dtype('float16')
    """
    cur = _DTYPE_NAMES.get(arr.dtype)
    if cur is None or cur == to:
        return arr
    if isinstance(arr, NPArray):
        return _ND_AMP_CAST(arr.as_nd_ndarray(), dtype=dtypes.to_mx(to)).as_np_ndarray()
    return _ND_AMP_CAST(arr, dtype=dtypes.to_mx(to))


class RecordingCastCache:
    """Casts made while autograd records, shared by every use inside one ``record()`` scope.

    A weight used three times in one recorded forward pass (a shared embedding, an unrolled
    RNN cell) is cast once. Entries live only until the outermost ``record()`` scope exits, so
    a cast never outlives the optimizer step that follows it; arrays cannot be modified in place
    while autograd records, so an entry cannot go stale inside its scope. Thread-local, like
    MXNet's recording state.

    >>> cache = RecordingCastCache()
    >>> w = mx.nd.ones((2,))
    >>> with mx.autograd.record():
    ...     cache.begin()
    ...     same = cache.cast(w, 'float16') is cache.cast(w, 'float16')
    >>> same
    True
    """

    def __init__(self):
        self._local = threading.local()

    def begin(self):
        """Start a new scope (called when ``autograd.record()`` starts recording)."""
        self._local.entries = {}

    def end(self):
        """Drop the scope's casts (called when recording stops)."""
        self._local.entries = None

    def cast(self, arr, to):
        """Like :func:`cast_ndarray`, reusing this scope's earlier cast of the same array."""
        entries = getattr(self._local, "entries", None)
        if entries is None or not mx.autograd.is_recording():
            return cast_ndarray(arr, to)
        key = (id(arr), to)
        hit = entries.get(key)
        if hit is not None and hit[0] is arr:
            return hit[1]
        out = cast_ndarray(arr, to)
        entries[key] = (arr, out)
        return out

    def __len__(self):
        return len(getattr(self._local, "entries", None) or ())


#: The process-wide cache used by the patched NDArray functions.
RECORDING_CASTS = RecordingCastCache()


class SymbolDtypes:
    """What AMP knows about the Symbols it built: their dtype, and their existing casts.

    Entries hold a strong reference to their Symbol, so an ``id`` is never reused while its
    entry lives; the table is bounded and forgets the oldest entries first. Forgetting is always
    safe: an unknown dtype only means a cast that may turn out to be a no-op at run time.

    >>> table = SymbolDtypes()
    >>> x = mx.sym.var('x', dtype='float32')
    >>> table.dtype_of(x)
    'float32'
    >>> table.cast(x, 'bfloat16') is table.cast(x, 'bfloat16')
    True
    """

    def __init__(self, capacity=50000):
        self._capacity = capacity
        self._entries = collections.OrderedDict()   # id(sym) -> [sym, dtype, {dtype: cast}]
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._entries)

    def _entry(self, sym):
        entry = self._entries.get(id(sym))
        return entry if entry is not None and entry[0] is sym else None

    def dtype_of(self, sym):
        """The dtype AMP recorded for ``sym``, else its ``__dtype__`` attribute, else None."""
        entry = self._entry(sym)
        if entry is not None and entry[1] is not None:
            return entry[1]
        try:
            flag = sym.attr("__dtype__")
        except Exception:  # pylint: disable=broad-except  (grouped symbols have no single attr)
            return None
        return _FLAG_NAMES.get(flag)

    def record(self, sym, dtype):
        """Remember that ``sym`` holds ``dtype`` (a canonical name or None for unknown)."""
        with self._lock:
            entry = self._entry(sym)
            if entry is None:
                self._entries[id(sym)] = [sym, dtype, {}]
                if len(self._entries) > self._capacity:
                    self._entries.popitem(last=False)
            else:
                entry[1] = dtype

    def cast(self, sym, to):
        """``amp_cast(sym, to)``, built once per (Symbol, dtype) and remembered."""
        with self._lock:
            entry = self._entry(sym)
            if entry is not None and to in entry[2]:
                return entry[2][to]
        if isinstance(sym, NPSymbol):
            out = _SYM_AMP_CAST(sym.as_nd_ndarray(), dtype=dtypes.to_mx(to)).as_np_ndarray()
        else:
            out = _SYM_AMP_CAST(sym, dtype=dtypes.to_mx(to))
        self.record(out, to)
        with self._lock:
            entry = self._entry(sym)
            if entry is None:
                self._entries[id(sym)] = entry = [sym, None, {}]
            entry[2][to] = out
        return out

    def multicast(self, syms):
        """``amp_multicast`` of several Symbols: each output in the widest input type."""
        legacy = [s.as_nd_ndarray() if isinstance(s, NPSymbol) else s for s in syms]
        group = _SYM_AMP_MULTICAST(*legacy, num_outputs=len(legacy))
        outs = [group[i] for i in range(len(legacy))]
        return [o.as_np_ndarray() if isinstance(s, NPSymbol) else o for s, o in zip(syms, outs)]

    def clear(self):
        """Forget everything (used when AMP is switched off)."""
        with self._lock:
            self._entries.clear()


#: The process-wide table used by the patched Symbol functions.
SYMBOL_DTYPES = SymbolDtypes()
