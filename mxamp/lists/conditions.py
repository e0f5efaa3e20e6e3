"""Conditions under which an operator runs in float32: "this op, when ..., in float32".

A :class:`Condition` is data: a conjunction of *tests*, each ``(name, values)``, where ``name``
is an operator parameter (``kernel``, ``act_type``, ...) or one of the shape words below, and
the test holds when the call's value matches one of ``values``. A conditional float32 rule runs
the op in float32 where one of its conditions holds, and leaves the op in its own list
elsewhere. Nothing here imports MXNet: callers hand over the call's parameters and the shape
of its data input.

Values are matched as MXNet users write them: ``'(7, 7)'``, ``(7, 7)`` and ``[7, 7]`` are the
same value, and a single number written for a tuple parameter (``'1'`` for ``kernel``) matches
a tuple of that number in every dimension. A parameter the call leaves out has MXNet's default
where one is known (``stride``, ``dilate``: 1; ``pad``: 0; ``num_group``: 1).

Shape words (computed from the data input, ``NC...`` layouts):

=================== =============================================================
``in_channels``     the data input's channel count
``spatial_size``    its per-image spatial size (H*W for images)
``depthwise``       ``True`` when ``num_group`` equals ``in_channels`` (and is > 1)
``conv_kind``       a convolution's kind, the first that fits: ``stem`` (at most 4
                    input channels), ``depthwise``, ``pointwise`` (1x1 kernel),
                    ``grouped`` (``num_group`` > 1) or ``dense``
=================== =============================================================

and one word of the call's context:

=================== =============================================================
``training``        ``True`` when the call is recorded for training (inside
                    ``autograd.record()``; a hybridized graph: when it was built);
                    ``False`` for the inference models ``convert_*`` builds
=================== =============================================================

Numeric values may be comparisons: ``'<=4'``, ``'>=24'``, ``'16..64'`` (a closed range),
``'%32'`` (a multiple of 32) or ``'!%16'`` (not a multiple of 16: a leading ``!`` negates).
A test whose value cannot be known (a Symbol whose shapes are not inferred yet) counts as
``if_unknown``: safety rules (a kernel that corrupts memory) say True, speed rules say False.

>>> c = Condition((('kernel', ('1',)), ('in_channels', ('<=4',))))
>>> c.holds({'kernel': (1, 1)}, (8, 3, 32, 32)), c.holds({'kernel': '(3, 3)'}, (8, 3, 32, 32))
(True, False)
>>> c.describe()
'kernel=1 and in_channels<=4'
"""
import ast
from typing import NamedTuple, Optional

#: The shape words a test may name beside operator parameters.
SHAPE_WORDS = ("in_channels", "spatial_size", "depthwise", "conv_kind")
#: The context word: oneDNN picks other kernels for training than for inference.
TRAINING = "training"
#: MXNet's defaults of the parameters conditions test most (Convolution and Pooling).
PARAM_DEFAULTS = {"stride": 1, "dilate": 1, "pad": 0, "num_group": 1}
_UNKNOWN = object()


def normalize_value(value):
    """A parameter value in one comparable form: tuples for sequences, ints and floats for
    numbers, ``True``/``False``, else the lower-case string.

    >>> normalize_value('(7, 7)'), normalize_value([7, 7]), normalize_value('softrelu')
    ((7, 7), (7, 7), 'softrelu')
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return {"true": True, "false": False}.get(text.lower(), text)
    if isinstance(value, (list, tuple)):
        return tuple(normalize_value(v) for v in value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        value = value.item()
    return value


def _numeric(actual):
    if isinstance(actual, bool) or not isinstance(actual, (int, float)):
        return None
    return actual


def value_matches(actual, wanted):
    """True when the normalized ``actual`` matches one written value ``wanted``.

    >>> value_matches((1, 1), '1'), value_matches(48, '%16'), value_matches(30, '16..64')
    (True, True, True)
    >>> value_matches((1, 2), '1'), value_matches(3, '>=4'), value_matches(72, '!%16')
    (False, False, True)
    """
    if isinstance(wanted, str) and wanted.strip().startswith("!"):
        return not value_matches(actual, wanted.strip()[1:])
    if isinstance(wanted, str):
        text = wanted.strip()
        number = _numeric(actual)
        for prefix, compare in (("<=", lambda a, b: a <= b), (">=", lambda a, b: a >= b),
                                ("%", lambda a, b: b != 0 and a % b == 0)):
            if text.startswith(prefix) and text[len(prefix):].strip().isdigit():
                return number is not None and compare(number, int(text[len(prefix):]))
        low, sep, high = text.partition("..")
        if sep and low.strip().isdigit() and high.strip().isdigit():
            return number is not None and int(low) <= number <= int(high)
    want = normalize_value(wanted)
    if want == actual:
        return True
    # one number written for a tuple parameter means that number in every dimension
    return (isinstance(actual, tuple) and bool(actual) and not isinstance(want, tuple)
            and all(v == want for v in actual))


def _channel_axis(attrs):
    layout = attrs.get("layout")
    layout = str(layout).strip("'\" ") if layout not in (None, "None") else ""
    return layout.index("C") if "C" in layout else 1


def shape_value(word, attrs, data_shape):
    """The value of a shape word for a call, or ``None`` when it cannot be known.

    >>> shape_value('spatial_size', {}, (2, 64, 6, 6)), shape_value('depthwise', {'num_group': 32}, (1, 32, 8, 8))
    (36, True)
    >>> shape_value('in_channels', {}, (0, 3, 0, 0)), shape_value('spatial_size', {}, (0, 3, 0, 0))
    (3, None)
    """
    if not data_shape or len(data_shape) < 2:
        return None
    axis = _channel_axis(attrs)
    if axis >= len(data_shape) or not data_shape[axis]:
        return None   # 0: a dimension shape inference left unknown
    channels = data_shape[axis]
    if word == "in_channels":
        return channels
    if word == "depthwise":
        groups = normalize_value(attrs.get("num_group", 1))
        return channels > 1 and groups == channels
    if word == "conv_kind":
        groups = normalize_value(attrs.get("num_group", 1))
        kernel = normalize_value(attrs.get("kernel", ()))
        kernel = kernel if isinstance(kernel, tuple) else (kernel,)
        if channels <= 4:
            return "stem"
        if channels > 1 and groups == channels:
            return "depthwise"
        if kernel and all(k == 1 for k in kernel):
            return "pointwise"
        return "grouped" if isinstance(groups, int) and groups > 1 else "dense"
    if word == "spatial_size":
        size = 1
        for i, d in enumerate(data_shape[1:], start=1):
            if i != axis:
                size *= d
        return size or None
    raise ValueError("unknown shape word %r (known: %s)" % (word, ", ".join(SHAPE_WORDS)))


class Condition(NamedTuple):
    """All ``tests`` hold (each ``(name, values)``: the call's value matches one of ``values``).

    ``if_unknown`` is what a test counts as when its value cannot be known; ``reason`` says why
    the rule exists (shown by ``python -m mxamp.lists --explain``).

    >>> Condition((('act_type', ('softrelu',)),)).holds({'act_type': 'softrelu'})
    True
    """

    tests: tuple
    if_unknown: bool = False
    reason: str = ""

    def needs_shapes(self):
        """True when a test names a shape word.

        >>> Condition((('in_channels', ('3',)),)).needs_shapes()
        True
        """
        return any(name in SHAPE_WORDS for name, _ in self.tests)

    def names_training(self):
        """True when a test names the context word ``training``.

        >>> Condition((('training', ('True',)),)).names_training()
        True
        """
        return any(name == TRAINING for name, _ in self.tests)

    def holds(self, attrs, data_shape: Optional[tuple] = None, training: Optional[bool] = None):
        """Whether the condition holds for a call with parameters ``attrs`` (a dict; values as
        written or as MXNet's graph attributes), data input shape ``data_shape``, recorded for
        training or not (``training``; None: unknown).

        >>> c = Condition((('training', ('True',)), ('in_channels', ('!%16',))))
        >>> c.holds({}, (2, 24, 8, 8), True), c.holds({}, (2, 24, 8, 8), False)
        (True, False)
        """
        for name, values in self.tests:
            actual = self._value(name, attrs, data_shape) if name != TRAINING else \
                (_UNKNOWN if training is None else bool(training))
            if actual is _UNKNOWN:
                if not self.if_unknown:
                    return False
                continue
            if not any(value_matches(actual, v) for v in values):
                return False
        return True

    @staticmethod
    def _value(name, attrs, data_shape):
        if name in SHAPE_WORDS:
            found = shape_value(name, attrs, data_shape)
            return _UNKNOWN if found is None else found
        if name in attrs and attrs[name] is not None:
            return normalize_value(attrs[name])
        if name in PARAM_DEFAULTS:
            return PARAM_DEFAULTS[name]
        return _UNKNOWN

    def describe(self):
        """The condition in words, as users would write it.

        >>> Condition((('kernel', ('1',)), ('stride', ('1',))), True).describe()
        'kernel=1 and stride=1 (unknown counts as true)'
        """
        parts = []
        for name, values in self.tests:
            shown = "|".join(str(v) for v in values)
            if len(values) == 1 and str(values[0]).startswith("%"):
                parts.append("%s a multiple of %s" % (name, str(values[0])[1:]))
            elif len(values) == 1 and str(values[0]).startswith("!%"):
                parts.append("%s not a multiple of %s" % (name, str(values[0])[2:]))
            elif len(values) == 1 and ".." in str(values[0]):
                parts.append("%s in %s" % (name, values[0]))
            else:
                parts.append("%s%s%s" % (name, "" if shown[:1] in "<>" else "=", shown))
        return " and ".join(parts) + (" (unknown counts as true)" if self.if_unknown else "")


def from_reference_entry(param, values, reason=""):
    """The :class:`Condition` of a reference-style ``(op, param, [values])`` entry.

    >>> from_reference_entry('kernel', ['(7, 7)']).holds({'kernel': (7, 7)})
    True
    """
    return Condition(((param, tuple(values)),), False, reason)
