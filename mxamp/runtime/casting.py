"""Cast insertion: differentiable ``amp_cast`` / ``amp_multicast`` for NDArrays and Symbols.

Casts go through MXNet's ``amp_cast`` operator so that they are differentiable, show up in
symbols, and leave non-float tensors alone. The original operator functions are captured when
this module is imported, so casting keeps working while :mod:`mxamp.patching.patcher` has the
namespaces patched.

Symbols cannot carry Python attributes (``Symbol`` has ``__slots__``) nor weak references, so
:class:`SymbolDtypes` remembers, by object identity, which dtype AMP gave each Symbol it built
and which casts of it exist already: a Symbol consumed by three float32 ops is cast once.

Their instances, shared by the patched functions, live in :data:`mxamp.runtime.state.STATE`.

>>> import mxnet as mx
>>> from mxamp.runtime import casting
>>> casting.cast(mx.nd.ones((2,)), 'float16').dtype
<class 'numpy.float16'>
"""
import collections
import threading

import mxnet as mx

from mxamp import dtypes
from mxamp.backend.mxnet_private import NumpySymbol
from mxamp.runtime.addto import addto_safe_array, addto_safe_symbol, gets_added
from mxamp.runtime.zero_grad import keep_for_backward

# Captured before any patching: mxamp's own casts must never go through wrapped functions.
_ND_AMP_CAST = mx.nd.amp_cast
_ND_AMP_MULTICAST = mx.nd.amp_multicast
_SYM_AMP_CAST = mx.sym.amp_cast
_SYM_AMP_MULTICAST = mx.sym.amp_multicast

NDArray = mx.nd.NDArray
NPArray = mx.np.ndarray
Symbol = mx.sym.Symbol
NPSymbol = NumpySymbol

# ``NDArray.dtype`` is a numpy scalar type for legacy arrays and a numpy dtype for mx.np arrays;
# both spellings map to a canonical name without the cost of ``np.dtype()`` on every call.
_DTYPE_NAMES = dtypes.FLOAT_NAMES_BY_DTYPE


def array_dtype(arr):
    """Canonical float name of an NDArray's dtype, or None for non-float arrays.

    >>> array_dtype(mx.nd.ones((1,), dtype='float16'))
    'float16'
    """
    return _DTYPE_NAMES.get(arr.dtype)


def cast(x, to):
    """``x`` in the float dtype named ``to``, through MXNet's differentiable ``amp_cast``.

    The one cast of mxamp, for every kind of tensor: NDArrays and ``mx.np`` arrays (returned in
    their own interface; a no-op, returning ``x`` itself, when ``x`` already has dtype ``to``;
    float64 goes through float32, which ``amp_cast`` needs; non-float arrays are converted with
    ``astype`` when ``to`` is not a float type and pass through unchanged otherwise) and
    Symbols (legacy or numpy; ``amp_cast`` leaves non-float inputs alone at run time). Casts to
    bfloat16 round to nearest (``astype`` would truncate). An input whose gradient MXNet may
    add rather than write is copied first (:mod:`mxamp.runtime.addto`); while autograd records,
    the array cast is kept for backward (:mod:`mxamp.runtime.zero_grad`). Anything else is
    returned as is.

    >>> cast(mx.np.ones((2,)), 'float16').dtype
    dtype('float16')
    >>> cast(mx.nd.ones((1,), dtype='float64'), 'bfloat16').dtype == dtypes.BFLOAT16
    True
    >>> cast(mx.nd.ones((1,), dtype='int32'), 'float32').dtype
    <class 'numpy.int32'>
    """
    if isinstance(x, Symbol):
        legacy = x.as_nd_ndarray() if isinstance(x, NPSymbol) else x
        out = _SYM_AMP_CAST(addto_safe_symbol(legacy), dtype=dtypes.to_mx(to))
        return out.as_np_ndarray() if isinstance(x, NPSymbol) else out
    if not isinstance(x, NDArray):
        return x
    cur = _DTYPE_NAMES.get(x.dtype)
    if cur == to:
        return x
    is_np = isinstance(x, NPArray)
    legacy = x.as_nd_ndarray() if is_np else x
    if cur is None:                      # not a float: only an explicit non-float target
        if to in _DTYPE_NAMES.values():
            return x
        out = legacy.astype(to)
    else:
        legacy = addto_safe_array(legacy, x)   # before any cast: Cast drops added gradients too
        if cur == "float64":
            legacy = legacy.astype("float32")
        out = _ND_AMP_CAST(legacy, dtype=dtypes.to_mx(to)) if to != "float64" \
            else legacy.astype("float64")
        if mx.autograd.is_recording():   # a zero gradient reaching the cast reads its input
            keep_for_backward(legacy)
    return out.as_np_ndarray() if is_np else out


def cast_into(x, out):
    """Cast NDArray ``x`` into the existing array ``out`` (its dtype), rounding to nearest.

    >>> w = mx.nd.zeros((2,), dtype='float16'); cast_into(mx.nd.ones((2,)), w); w.asnumpy()
    array([1., 1.], dtype=float16)
    """
    _ND_AMP_CAST(x, dtype=out.dtype, out=out)


#: Elements of one workspace slice (4 MB of float32). Larger arrays are cast and used a slice
#: at a time, so that the workspace stays this size whatever the model's largest parameter (a
#: 30k x 1024 embedding would take 125 MB). Slices this long keep the per-slice Python cost
#: (~30 us) below 1% of the cast and the update they serve.
SLICE_ELEMENTS = 1 << 20


def slices(size, align=1, most=SLICE_ELEMENTS):
    """``(start, stop)`` ranges that cover ``size`` elements in order, each at most ``most``
    long and starting at a multiple of ``align`` (a row of ``align`` elements never splits;
    a row longer than ``most`` is a slice of its own).

    >>> list(slices(10, most=4)), list(slices(10, align=3, most=7)), list(slices(0))
    ([(0, 4), (4, 8), (8, 10)], [(0, 6), (6, 10)], [])
    """
    step = max(most // align, 1) * align
    return ((start, min(start + step, size)) for start in range(0, size, step))


class Float32Workspace:
    """One float32 buffer per device (and thread), reused for the float32 copies of
    low-precision arrays that are needed only for the length of one kernel (an optimizer
    update on a float32 master, a finite check).

    Casting every gradient of a model to float32 at once costs 4 B per parameter for a moment,
    and the allocator keeps that peak long after; writing each copy into this buffer costs
    4 B per element of :data:`SLICE_ELEMENTS` (4 MB), once: an array larger than that is
    cast and used a slice at a time (:func:`slices`), which every element-wise use allows.
    Every user of a view shares the buffer's engine
    variable, so MXNet runs a cast into it only after the previous reader is done (on every
    device): cast, then queue the view's use, before the next cast into it. Each thread has
    its own buffers, so that two threads' casts and reads never interleave.

    >>> ws = Float32Workspace()
    >>> view = ws.view(mx.cpu(), (2, 3)); view.shape, view.dtype
    ((2, 3), <class 'numpy.float32'>)
    >>> ws.view(mx.cpu(), (4,)).size, len(ws)   # one buffer, grown only when too small
    (4, 1)
    """

    def __init__(self):
        self._local = threading.local()

    def _buffers(self):
        return self._local.__dict__.setdefault("buffers", {})

    def __len__(self):
        return len(self._buffers())

    def reserve(self, context, size):
        """This thread's 1-D buffer on ``context``, at least ``size`` elements long."""
        buffers = self._buffers()
        held = buffers.get(context)
        if held is None or held.size < size:
            held = buffers[context] = mx.nd.empty((max(size, 1),), ctx=context, dtype="float32")
        return held

    def view(self, context, shape, offset=0):
        """A float32 view of ``shape`` into the buffer, starting at element ``offset``."""
        size = 1
        for extent in shape:
            size *= extent
        buffer = self.reserve(context, offset + size)
        return buffer[offset:offset + size].reshape(shape)

    def cast_slices(self, array, align=1):
        """Yield ``(start, stop, view)`` for each :func:`slices` range of ``array``'s
        flattened values, ``view`` holding that slice cast to float32. Each view shares the
        one buffer: queue its use before asking for the next.

        >>> ws = Float32Workspace()
        >>> [(a, b, v.size) for a, b, v in ws.cast_slices(mx.nd.ones((3, 2)), align=2)]
        [(0, 6, 6)]
        """
        flat = array.reshape((-1,))
        for start, stop in slices(array.size, align=align):
            view = self.view(array.context, (stop - start,))
            cast_into(flat[start:stop], view)
            yield start, stop, view

    def clear(self):
        """Free the buffers of every thread (``amp.reset``)."""
        self._local = threading.local()


#: The process's float32 workspace, shared by the optimizer and the finite checks.
WORKSPACE = Float32Workspace()


#: The name of :func:`cast` for NDArrays in mxamp 0.1.0.
cast_ndarray = cast


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

    def clear(self):
        """Drop every thread's casts (``amp.reset``)."""
        self._local = threading.local()

    def cast(self, arr, to):
        """Like :func:`cast`, reusing this scope's earlier cast of the same array."""
        entries = getattr(self._local, "entries", None)
        if entries is None or not mx.autograd.is_recording():
            return cast(arr, to)
        key = (id(arr), to)
        hit = entries.get(key)
        if hit is not None and hit[0] is arr:
            return hit[1]
        out = cast(arr, to)
        entries[key] = (arr, out)
        return out

    def __len__(self):
        return len(getattr(self._local, "entries", None) or ())



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
        self._entries = collections.OrderedDict()   # id(sym) -> [sym, dtype, {key: cast}]
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
        return dtypes.FLAG_NAMES.get(flag)

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
        # a parameter's Symbol lives across graph builds, which may copy it or not (addto)
        key = (to, gets_added(sym))
        with self._lock:
            entry = self._entry(sym)
            if entry is not None and key in entry[2]:
                return entry[2][key]
        out = cast(sym, to)
        self.record(out, to)
        with self._lock:
            entry = self._entry(sym)
            if entry is None:
                self._entries[id(sym)] = entry = [sym, None, {}]
            entry[2][key] = out
        return out

    def multicast(self, syms):
        """``amp_multicast`` of several Symbols: each output in the widest input type."""
        legacy = [addto_safe_symbol(s.as_nd_ndarray() if isinstance(s, NPSymbol) else s)
                  for s in syms]
        group = _SYM_AMP_MULTICAST(*legacy, num_outputs=len(legacy))
        outs = [group[i] for i in range(len(legacy))]
        return [o.as_np_ndarray() if isinstance(s, NPSymbol) else o for s, o in zip(syms, outs)]

    def clear(self):
        """Forget everything (used when AMP is switched off)."""
        with self._lock:
            self._entries.clear()

