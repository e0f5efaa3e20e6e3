"""One place that knows how MXNet spells its low-precision dtypes.

MXNet's bfloat16 is not a numpy scalar type: it is the structured dtype
``np.dtype([('bfloat16', np.uint16)])``, and ``nd.amp_cast`` rejects the string
``'bfloat16'``. Everything in mxamp normalises dtypes through this module.

>>> import numpy as np
>>> from mxamp import dtypes
>>> dtypes.normalize("bfloat16"), dtypes.normalize(np.float16)
('bfloat16', 'float16')
>>> dtypes.to_mx(dtypes.normalize("bfloat16")) == dtypes.BFLOAT16
True
"""
import numpy as np

from mxamp.errors import AmpArgumentError

#: MXNet's bfloat16 dtype object (what ``NDArray.dtype`` reports for bf16 arrays).
BFLOAT16 = np.dtype([("bfloat16", np.uint16)])
FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)

#: The low-precision targets mxamp supports, by canonical name.
TARGETS = ("float16", "bfloat16")
#: A request for the best target of the device (see :mod:`mxamp.precision.device_plan`).
AUTO = "auto"

#: MXNet's integer type flags (``mshadow::TypeFlag``) of the float types mxamp deals with.
TYPE_FLAGS = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 12}
#: The reverse: a type flag, as an int or as the string of a ``__dtype__`` attribute -> name.
FLAG_NAMES = dict([(flag, name) for name, flag in TYPE_FLAGS.items()] +
                  [(str(flag), name) for name, flag in TYPE_FLAGS.items()])
#: ``NDArray.dtype`` (a numpy scalar type for legacy arrays, a numpy dtype for mx.np ones) ->
#: canonical float name, for the hot paths that cannot afford ``np.dtype()``.
FLOAT_NAMES_BY_DTYPE = dict([(getattr(np, n), n) for n in ("float16", "float32", "float64")] +
                            [(np.dtype(n), n) for n in ("float16", "float32", "float64")] +
                            [(BFLOAT16, "bfloat16")])


def _as_dtype(dtype):
    if dtype is BFLOAT16 or (isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16")):
        return BFLOAT16
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def name_of(dtype):
    """Canonical name of any dtype spelling: ``'float32'``, ``'float16'``, ``'bfloat16'``, ...

    >>> name_of(BFLOAT16), name_of(np.float32), name_of('float16')
    ('bfloat16', 'float32', 'float16')
    """
    dt = _as_dtype(dtype)
    if dt is None:
        raise AmpArgumentError("%r is not a dtype" % (dtype,))
    if dt == BFLOAT16:
        return "bfloat16"
    return dt.name


def normalize(dtype):
    """Return ``'float16'`` or ``'bfloat16'`` for any accepted spelling of a target dtype.

    Accepts ``'float16'``, ``'bfloat16'``, ``numpy.float16``, ``numpy.dtype('float16')`` and
    MXNet's bfloat16 dtype object; anything else is a ``ValueError`` naming what is accepted.

    >>> normalize(np.float16)
    'float16'
    """
    try:
        name = name_of(dtype)
    except TypeError:
        name = None
    if name not in TARGETS:
        raise AmpArgumentError(
            "target_dtype must be float16 or bfloat16 ('float16', 'bfloat16', numpy.float16 or "
            "MXNet's bfloat16 dtype object)%s, got %r" % (_AUTO_HINT, dtype))
    return name


_AUTO_HINT = (", or 'auto' (float16 on a GPU, bfloat16 where the CPU computes it natively, "
              "float32 elsewhere)")


def normalize_request(dtype):
    """Like :func:`normalize`, but also accepts ``'auto'`` (returned as ``'auto'``).

    >>> normalize_request('AUTO'), normalize_request(np.float16)
    ('auto', 'float16')
    """
    if isinstance(dtype, str) and dtype.strip().lower() == AUTO:
        return AUTO
    return normalize(dtype)


def to_mx(name):
    """The dtype object MXNet expects for a canonical name (bfloat16 -> :data:`BFLOAT16`).

    >>> to_mx('float16')
    dtype('float16')
    """
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def is_cpu(ctx):
    """True for CPU contexts (``cpu``, ``cpu_pinned``, ``cpu_shared``): the one such test.

    >>> import mxnet as mx
    >>> is_cpu(mx.cpu()), is_cpu(mx.gpu(0))
    (True, False)
    """
    return ctx.device_type.startswith("cpu")


def is_float(dtype):
    """True for the floating types AMP may cast between (float16, bfloat16, float32, float64).

    >>> is_float(np.int32), is_float(BFLOAT16)
    (False, True)
    """
    dt = _as_dtype(dtype)
    return dt is not None and (dt == BFLOAT16 or dt.kind == "f")


def widest(names):
    """The widest of some canonical float names (float64 > float32 > float16/bfloat16).

    float16 and bfloat16 together widen to float32, since neither holds the other.

    >>> widest(['bfloat16', 'float32'])
    'float32'
    """
    names = set(names)
    for wide in ("float64", "float32"):
        if wide in names:
            return wide
    if len(names) > 1:
        return "float32"
    return names.pop() if names else "float32"
