"""Finite checks and norms over a list of gradients, in one pass and one host synchronisation.

The reference checks gradients with ``multi_all_finite``, whose CPU kernel is slow enough to
cost ~270 ms on ResNet-50's 25.6 M gradient values. Here every array is read once:

* large float32 arrays on a CPU, seen as (rows, columns): one FullyConnected against a zero
  vector each. It reads every value once at GEMV speed (2.8x faster than ``all_finite``, which
  runs well below memory bandwidth on CPUs) and gives a column of zeros, with a NaN in every
  row that holds an Inf or a NaN (IEEE: inf * 0 = nan, and NaN propagates through the sums);
  those columns join the small arrays' ``multi_sum_sq`` below;
* other large arrays (GPU, float64, 1-D): one ``all_finite`` each;
* small ones: a single ``multi_sum_sq`` per (context, dtype) group, so that a network's
  hundreds of biases and norm parameters cost one op instead of hundreds (NaN/Inf propagate
  into a sum of squares);
* float16/bfloat16 arrays are first cast to float32: MXNet's float16 reductions convert
  element by element in software (``all_finite`` on float16 is ~7x slower than cast +
  float32 check on this CPU), ``multi_sum_sq`` accumulates float16 in float16 (any value
  above 256 would look like an overflow), and ``all_finite``/``multi_sum_sq`` reject bf16.
  A large one is cast into the shared float32 workspace, a slice of at most
  :data:`~mxamp.runtime.casting.SLICE_ELEMENTS` at a time, and checked there before the
  next slice is cast, so the check never holds more than one slice in float32 (also for the
  sums of squares of :func:`global_norm`).

All per-array results are gathered into one small float32 vector and copied to the host once.
Which array takes which path costs ~20 us of Python per array to work out;
:class:`FiniteChecker` remembers it for a caller (the trainer's scaler) that checks the same
arrays every step.
A sum of squares can overflow although every value is finite (a float32 value above ~1.8e19
squared): such an array is re-checked exactly with ``all_finite``, which costs a second
synchronisation only on the steps where it happens.

>>> import mxnet as mx
>>> check_finite([mx.nd.ones((3,)), mx.nd.array([1, float('inf')])]).bad_indices
[1]
"""
import collections
import math
import types

import mxnet as mx
import numpy as np

from mxamp import dtypes
from mxamp.runtime.casting import WORKSPACE, cast

# The operator functions as MXNet ships them, captured when mxamp is imported (before
# amp.init can wrap them): the checks must see the gradients exactly as they are.
_ND = types.SimpleNamespace(amp_cast=mx.nd.amp_cast, all_finite=mx.nd.all_finite,
                            multi_sum_sq=mx.nd.multi_sum_sq, concat=mx.nd.concat,
                            fully_connected=mx.nd.FullyConnected, zeros=mx.nd.zeros,
                            min=mx.nd.min, sum=mx.nd.sum)
# Widest row a zero-vector probe takes; wider arrays keep all_finite (bounds the zero buffer).
_MAX_PROBE_COLUMNS = 1 << 20
# Keep each multi_sum_sq call well below any limit on the number of inputs of one op.
_MAX_ARRAYS_PER_CALL = 512
# Arrays at least this large get their own all_finite (fast kernel); smaller ones share one
# multi_sum_sq (fewer ops). Chosen with benchmark/bench_overflow.py.
LARGE_ARRAY = 1 << 16

FiniteReport = collections.namedtuple("FiniteReport", ["has_nonfinite", "bad_indices",
                                                       "sum_squares"])
FiniteReport.__doc__ = """Result of :func:`check_finite`.

has_nonfinite: True when any array holds an Inf or a NaN.
bad_indices: positions (in the input list) of the arrays that hold one.
sum_squares: per-array sums of squares as float64 (None for arrays checked by flag only).
"""


def _dense(array):
    """A classic dense NDArray view: np arrays are re-wrapped, sparse ones give their values."""
    if isinstance(array, mx.numpy.ndarray):
        array = array.as_nd_ndarray()
    # Row-sparse / CSR gradients: their stored values are what can be non-finite.
    return array.data if array.stype != "default" else array


class _Plan:
    """How to check one list of arrays, worked out once per list.

    Reading an array's dtype, size and context from Python costs ~20 us each, more than
    checking a small array, and a trainer passes the same gradient arrays every step.
    """

    def __init__(self, arrays, squares_for_all):
        self.arrays = list(arrays)    # to recognise the same list next time
        self.threshold = LARGE_ARRAY
        self.needs_cast = []
        self.flagged = []            # positions checked by their own all_finite
        self.summed = []             # lists of positions sharing one multi_sum_sq
        self.squared = []            # low-precision positions summed slice by slice
        self.probed = {}             # position -> columns: a zero-vector probe feeds the sums
        self.zeros = {}              # context -> the zero vector probes read (widest row)
        groups = collections.defaultdict(list)
        for i, array in enumerate(arrays):
            dense = _dense(array)
            needs_cast = dtypes.name_of(dense.dtype) not in ("float32", "float64")
            self.needs_cast.append(needs_cast)
            dtype = "float32" if needs_cast else dtypes.name_of(dense.dtype)
            columns = dense.size // dense.shape[0] if dense.ndim >= 2 and dense.size else 0
            if dense.size < LARGE_ARRAY or (squares_for_all and not needs_cast):
                groups[(dense.context, dtype)].append(i)
            elif squares_for_all:
                self.squared.append(i)   # its sum of squares, a workspace slice at a time
            elif (dtype == "float32" and dtypes.is_cpu(dense.context)
                  and 0 < columns <= _MAX_PROBE_COLUMNS):
                self.probed[i] = columns
                groups[(dense.context, dtype)].append(i)
                self.zeros[dense.context] = max(self.zeros.get(dense.context, 0), columns)
            else:
                self.flagged.append(i)
        self.zeros = {ctx: _ND.zeros((n,), ctx=ctx) for ctx, n in self.zeros.items()}
        for members in groups.values():
            for start in range(0, len(members), _MAX_ARRAYS_PER_CALL):
                self.summed.append(members[start:start + _MAX_ARRAYS_PER_CALL])
        self.kinds = {i: "flag" for i in self.flagged}
        self.kinds.update({i: "probe" if i in self.probed else "sum_sq"
                           for chunk in self.summed + [self.squared] for i in chunk})
        self.order = self.flagged + self.squared + [i for chunk in self.summed for i in chunk]

    def matches(self, arrays):
        """True when ``arrays`` are the very objects this plan was made for."""
        return (self.threshold == LARGE_ARRAY and len(arrays) == len(self.arrays)
                and all(a is b for a, b in zip(arrays, self.arrays)))

    def launch(self, arrays):
        """Queue the checks; return the per-array result vectors in :attr:`order`."""
        ready = [_dense(a) for a in arrays]
        # the large arrays one at a time: each is checked before the next is cast into the
        # shared workspace (the dict is built in that order)
        large = {i: self._check_large(i, ready[i]) for i in self.flagged + list(self.probed)}
        vectors = [large[i] for i in self.flagged]
        vectors += [self._sum_squares_in_slices(ready[i]) for i in self.squared]
        vectors += [_ND.multi_sum_sq(*[large[i] if i in large else self._float32(i, ready[i])
                                       for i in chunk], num_arrays=len(chunk))
                    for chunk in self.summed]
        return vectors

    def _float32(self, i, array):
        return cast(array, "float32") if self.needs_cast[i] else array

    def _check_large(self, i, array):
        """A large array's check: its probe column, or its ``all_finite`` flag. A
        low-precision one is cast into the shared workspace a slice at a time (whole rows for
        a probe), each slice checked before the next is cast: 4 B per element of one slice,
        not of the array."""
        columns = self.probed.get(i)
        if not self.needs_cast[i]:
            return self._check(array, columns)
        parts = [self._check(view, columns)
                 for _, _, view in WORKSPACE.cast_slices(array, align=columns or 1)]
        if len(parts) == 1:
            return parts[0]
        joined = _ND.concat(*parts, dim=0)
        # a probe's column, row by row; flags: finite only where every slice is
        return joined if columns else _ND.min(joined)   # a reduction to one value: shape (1,)

    def _check(self, array, columns):
        """``all_finite`` of ``array`` (no ``columns``), or the zero-vector probe of its rows."""
        if columns is None:
            return _ND.all_finite(array)
        zero = self.zeros[array.context][:columns].reshape((1, columns))  # a view
        return _ND.fully_connected(array.reshape((-1, columns)), zero, no_bias=True,
                                   num_hidden=1)

    @staticmethod
    def _sum_squares_in_slices(array):
        """A low-precision array's float32 sum of squares, one workspace slice at a time."""
        parts = [_ND.multi_sum_sq(view, num_arrays=1)
                 for _, _, view in WORKSPACE.cast_slices(array)]
        return parts[0] if len(parts) == 1 else _ND.sum(_ND.concat(*parts, dim=0))


def _gather_to_host(vectors):
    """One copy to the host for all per-array results, whatever their contexts."""
    home = vectors[0].context
    vectors = [v if v.context == home else v.as_in_context(home) for v in vectors]
    joined = vectors[0] if len(vectors) == 1 else _ND.concat(*vectors, dim=0)
    return joined.asnumpy().astype(np.float64)


def _exactly_finite(array):
    dense = _dense(array)
    if dtypes.name_of(dense.dtype) != "float64":
        dense = cast(dense, "float32")
    return bool(_ND.all_finite(dense).asscalar())


def _run(plan, arrays):
    """Execute a plan: one host copy, then the exact re-check of overflowed squares."""
    with mx.autograd.pause():
        flat = _gather_to_host(plan.launch(arrays))
    values = [0.0] * len(arrays)
    for offset, position in enumerate(plan.order):
        values[position] = float(flat[offset])
    bad = []
    for i, value in enumerate(values):
        if plan.kinds[i] == "flag":
            if value == 0.0:
                bad.append(i)
        elif math.isnan(value):
            bad.append(i)
        elif plan.kinds[i] == "probe":
            continue   # a probe's sum is 0 unless NaN: its squares say nothing of the array
        elif math.isinf(value) and not _exactly_finite(arrays[i]):
            bad.append(i)   # rare: re-checked exactly because a square may have overflowed
    squares = [v if plan.kinds[i] == "sum_sq" else None for i, v in enumerate(values)]
    return FiniteReport(bool(bad), bad, squares)


class FiniteChecker:
    """:func:`check_finite` for a caller that checks the same arrays every step.

    It remembers the plan of the last list it saw (holding references to those arrays, so
    keep the checker where the arrays live, e.g. on the trainer's scaler).

    >>> import mxnet as mx
    >>> grads = [mx.nd.ones((2,)), mx.nd.zeros((3,))]
    >>> checker = FiniteChecker()
    >>> checker.check(grads).has_nonfinite, checker.check(grads, squares_for_all=True).sum_squares
    (False, [2.0, 0.0])
    """

    def __init__(self):
        self._plans = {}

    def check(self, arrays, squares_for_all=False):
        """Same as :func:`check_finite`."""
        if not arrays:
            return FiniteReport(False, [], [])
        plan = self._plans.get(squares_for_all)
        if plan is None or not plan.matches(arrays):
            plan = self._plans[squares_for_all] = _Plan(arrays, squares_for_all)
        return _run(plan, arrays)


def check_finite(arrays, squares_for_all=False):
    """Check a list of NDArrays for Inf/NaN with one pass and one host sync.

    ``squares_for_all=True`` also returns every array's sum of squares (as float32 sums),
    which :func:`global_norm` uses; otherwise large arrays only get a finite flag.

    >>> import mxnet as mx
    >>> check_finite([mx.nd.array([3e19])]).has_nonfinite   # square overflows, value is finite
    False
    """
    if not arrays:
        return FiniteReport(False, [], [])
    return _run(_Plan(arrays, squares_for_all), arrays)


def global_norm(arrays):
    """Return ``(l2_norm, has_nonfinite)`` of a list of NDArrays from one pass.

    The norm is accumulated in float64 on the host from per-array float32 sums of squares;
    it is ``inf`` or ``nan`` when an array is not finite, and ``inf`` when the squares
    overflow float32 although every value is finite.

    >>> import mxnet as mx
    >>> global_norm([mx.nd.array([3.0]), mx.nd.array([4.0])])
    (5.0, False)
    """
    report = check_finite(arrays, squares_for_all=True)
    if report.has_nonfinite:
        return float("nan"), True
    return math.sqrt(sum(report.sum_squares)) if arrays else 0.0, False
