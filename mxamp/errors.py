"""The one exception type mxamp raises for a bad argument, from every entry point.

A wrong argument to any public function (an unknown operator name, an op in two lists, a
dtype that is not a target, a list that is not a list of strings, an object of the wrong
kind) raises :class:`AmpArgumentError`. It is a :class:`ValueError` (what mxamp documents), an
:class:`AssertionError` (what ``mxnet.contrib.amp`` raised for the same mistakes, so code
written for the reference keeps catching it) and a :class:`TypeError` (what mxamp 0.1.0 raised
for an argument of the wrong type). State errors (``amp.init`` twice with other arguments, a
float16 model on a CPU) stay :class:`RuntimeError`.

>>> from mxamp import amp
>>> try:
...     amp.list_fp32_ops('int8')
... except AssertionError as err:          # the reference's exception type
...     print(type(err).__name__, isinstance(err, ValueError))
AmpArgumentError True
"""


class AmpArgumentError(ValueError, TypeError, AssertionError):
    """A bad argument to an mxamp function; the message names the argument and what it accepts.

    >>> isinstance(AmpArgumentError('x'), (ValueError, TypeError, AssertionError))
    True
    """


def check_name_list(value, what):
    """``value`` as a list of strings, or None; anything else is an :class:`AmpArgumentError`.

    >>> check_name_list(('relu', 'Flatten'), 'fp32_ops')
    ['relu', 'Flatten']
    >>> check_name_list('softmax', 'fp32_ops')
    Traceback (most recent call last):
    ...
    mxamp.errors.AmpArgumentError: fp32_ops must be a list of strings, got str
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise AmpArgumentError("%s must be a list of strings, got %s"
                               % (what, type(value).__name__))
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise AmpArgumentError("%s must be a list of strings; these are not: %r" % (what, bad))
    return list(value)


def check_condition_list(value):
    """``value`` (``conditional_fp32_ops``) as a list of ``(op name, parameter name, [values])``
    entries, or None; anything else, or an op named twice, is an :class:`AmpArgumentError`.

    >>> check_condition_list([('Activation', 'act_type', ['softrelu'])])
    [('Activation', 'act_type', ['softrelu'])]
    >>> check_condition_list('Activation')
    Traceback (most recent call last):
    ...
    mxamp.errors.AmpArgumentError: conditional_fp32_ops must be a list of (op name, parameter name, [values]) tuples, got str
    """
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise AmpArgumentError("conditional_fp32_ops must be a list of (op name, parameter name, "
                               "[values]) tuples, got %s" % type(value).__name__)
    seen = set()
    for entry in value:
        ok = (isinstance(entry, (list, tuple)) and len(entry) == 3 and isinstance(entry[0], str)
              and isinstance(entry[1], str) and isinstance(entry[2], (list, tuple)))
        if not ok:
            raise AmpArgumentError("conditional_fp32_ops entries must be (op name, parameter "
                                   "name, [parameter values]), got %r" % (entry,))
        if entry[0] in seen:
            raise AmpArgumentError("conditional_fp32_ops names %r twice" % entry[0])
        seen.add(entry[0])
    return list(value)


def as_input_tuple(value, what=None, empty_ok=True):
    """``value``, one model input or a list/tuple of them (one per forward argument), as a tuple.

    With ``what``, the message of the :class:`AmpArgumentError` it raises, every item must be
    an NDArray (and, with ``empty_ok=False``, there must be one); without it the items are
    not checked (Symbols pass, for callers that trace or whose input was vetted already).

    >>> import mxnet as mx
    >>> len(as_input_tuple(mx.nd.ones((2, 3)))), as_input_tuple([1, 2])
    (1, (1, 2))
    >>> as_input_tuple([mx.nd.ones(1), 'x'], 'example_inputs must be an NDArray or a list/tuple '
    ...                'of NDArrays')
    Traceback (most recent call last):
    ...
    mxamp.errors.AmpArgumentError: example_inputs must be an NDArray or a list/tuple of NDArrays
    """
    inputs = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if what is not None:
        # imported here: mxamp.launch reads this module where MXNet is not importable
        import mxnet as mx
        if (not inputs and not empty_ok) or not all(isinstance(x, mx.nd.NDArray) for x in inputs):
            raise AmpArgumentError(what)
    return inputs
