"""Op lists: which MXNet operator runs in which precision, per target dtype.

The lists themselves are plain data in :mod:`mxamp.lists.float16` and
:mod:`mxamp.lists.bfloat16`; this module turns them into an :class:`OpLists` value that the
patcher, the graph converter and the trainer hook read. Nothing here imports MXNet.

Categories (every forward operator registered in libmxnet 1.9.1 is in exactly one):

``low_precision``
    Inputs are cast to the target dtype (the ops that are faster there: GEMMs, convolutions).
``fp32``
    Inputs are cast to float32 (range-sensitive ops, and ops with no low-precision kernel).
``widest``
    Multi-input ops: every float input is cast to the widest float type among them.
``neutral``
    Run in whatever dtype their input has; never cause a cast.
``conditional_fp32``
    float32 only when a parameter has one of some values (``Activation(act_type='softrelu')``).

More tables qualify these: ``fp32_params`` names the inputs of a low-precision op that stay
float32 (BatchNorm statistics), ``no_cpu_kernel`` the low-precision ops that have no kernel
for the target on a CPU (they stay float32 there, so a GPU script still runs on a laptop), and
``fp32_on_every_cpu`` the ops no CPU class runs in the target (float32 on a CPU whatever an
override says: bfloat16's ``transpose`` corrupts the heap).

>>> from mxamp.lists import get_op_lists
>>> lists = get_op_lists('bfloat16')
>>> lists.category('Convolution')
'low_precision'
"""
import functools
from dataclasses import dataclass, field, replace

from mxamp.errors import AmpArgumentError
from mxamp.lists.conditions import Condition, from_reference_entry

CATEGORIES = ("low_precision", "fp32", "widest", "neutral", "conditional_fp32")


@dataclass(frozen=True)
class OpLists:
    """The classification of operators for one target dtype (immutable).

    >>> get_op_lists('float16').category('softmax')
    'fp32'
    """

    target: str
    low_precision: frozenset
    fp32: frozenset
    widest: frozenset
    neutral: frozenset
    #: op name -> (parameter name, tuple of values that make the op run in float32)
    conditional_fp32: dict
    loss_output: frozenset
    #: op name -> tuple of input names that stay float32 when the op runs in low precision
    fp32_params: dict
    no_cpu_kernel: frozenset
    reasons: dict = field(default_factory=dict, compare=False)
    #: CPU bfloat16 class (mxamp.backend.cpu.BF16_CLASSES) -> ops with no kernel for the target there
    no_kernel_by_cpu_class: dict = field(default_factory=dict)
    #: conditional op -> the category it has where its condition does not hold ('neutral' if
    #: absent): a conditional float32 rule leaves the op in its own list elsewhere
    conditional_base: dict = field(default_factory=dict)
    #: ops computed in float32 on every CPU whatever their category (no working kernel for the
    #: target on any class, or one that corrupts memory): an override cannot hand them the target
    fp32_on_every_cpu: frozenset = frozenset()
    #: CPU bfloat16 class -> {op: (Condition, ...)}: where these hold on that class the op runs
    #: in float32 whatever its category (shapes whose kernel is broken or slow there)
    fp32_when_by_cpu_class: dict = field(default_factory=dict)

    #: op -> conditions the device a graph is built for adds (set by convert_* per device)
    device_conditions: dict = field(default_factory=dict)

    def with_device_conditions(self, conditions):
        """A copy whose :attr:`device_conditions` are ``conditions`` (``{op: (Condition, ...)}``).

        >>> get_op_lists('bfloat16').with_device_conditions({}).device_conditions
        {}
        """
        return replace(self, device_conditions=dict(conditions))

    def base_category(self, op_name):
        """The category ``op_name`` has where its conditions do not hold (its own category for
        an unconditional op).

        >>> get_op_lists('bfloat16').with_overrides(
        ...     conditional_fp32_ops=[('Convolution', 'kernel', ['(9, 9)'])]
        ...     ).base_category('Convolution')
        'low_precision'
        """
        cat = self.category(op_name)
        if cat == "conditional_fp32":
            return self.conditional_base.get(op_name, "neutral")
        return cat

    def conditions(self, op_name):
        """The :class:`~mxamp.lists.conditions.Condition` s under which ``op_name`` runs in
        float32 by its conditional rule (empty for other ops).

        >>> [c.describe() for c in get_op_lists('bfloat16').conditions('Pooling')]
        ['pool_type=sum|lp']
        """
        rule = self.conditional_fp32.get(op_name)
        if not rule:
            return ()
        return (from_reference_entry(rule[0], rule[1], self.reasons.get(op_name, "")),)

    def fp32_when(self, cpu_class):
        """``{op: conditions}`` under which ops run in float32 on a CPU of ``cpu_class``.

        >>> sorted(get_op_lists('bfloat16').fp32_when('amx'))[:1]
        ['Convolution']
        """
        return self.fp32_when_by_cpu_class.get(cpu_class, {})

    def missing_kernels(self, cpu_class):
        """Ops with no kernel for the target on a CPU of ``cpu_class`` (see ``mxamp.backend.cpu``).

        >>> 'Convolution' in get_op_lists('bfloat16').missing_kernels('none')
        True
        >>> get_op_lists('bfloat16').missing_kernels('native')
        frozenset()
        """
        return self.no_kernel_by_cpu_class.get(cpu_class, frozenset())

    def category(self, op_name):
        """The category of ``op_name`` (one of :data:`CATEGORIES`), or None if unclassified.

        >>> get_op_lists('float16').category('Concat')
        'widest'
        """
        return self.categories.get(op_name)

    @functools.cached_property
    def categories(self):
        """Every op name -> its category, computed once per lists (``amp.init`` asks hundreds).

        >>> get_op_lists('bfloat16').categories['FullyConnected']
        'low_precision'
        """
        found = dict.fromkeys(self.conditional_fp32, "conditional_fp32")
        for cat in ("neutral", "widest", "fp32", "low_precision"):  # first match wins below
            found.update(dict.fromkeys(getattr(self, cat), cat))
        return found

    def all_ops(self):
        """Every op name any category holds.

        >>> 'FullyConnected' in get_op_lists('float16').all_ops()
        True
        """
        return (set(self.low_precision) | set(self.fp32) | set(self.widest) | set(self.neutral)
                | set(self.conditional_fp32))

    def reason(self, op_name):
        """The short reason recorded for an op's category ('' where it is obvious).

        >>> isinstance(get_op_lists('bfloat16').reason('dot'), str)
        True
        """
        return self.reasons.get(op_name, "")

    def computing_in_fp32(self, ops):
        """A copy in which ``ops`` leave their category for ``fp32`` (ops a device lacks
        kernels for).

        >>> lists = get_op_lists('bfloat16').computing_in_fp32({'Convolution', 'BatchNorm'})
        >>> lists.category('Convolution'), lists.category('BatchNorm')
        ('fp32', 'fp32')
        """
        ops = frozenset(ops) & frozenset(self.all_ops())
        if not ops:
            return self
        return replace(self, low_precision=self.low_precision - ops, fp32=self.fp32 | ops,
                       widest=self.widest - ops, neutral=self.neutral - ops,
                       conditional_fp32={k: v for k, v in self.conditional_fp32.items()
                                         if k not in ops})

    def with_overrides(self, target_precision_ops=None, conditional_fp32_ops=None,
                       fp32_ops=None, canonical=None):
        """A copy in which the given lists replace the defaults of their category.

        The parameters mean what they mean in ``amp.init``: ``target_precision_ops`` and
        ``fp32_ops`` are lists of op names, ``conditional_fp32_ops`` a list of
        ``(op name, parameter name, [values])``. An op named in an override leaves its old
        category; an op that a replaced default list held and no override names becomes
        neutral. Given ``canonical`` (alias -> canonical op name), a name stands for its
        operator: every alias of it moves with it (an alias the caller names in
        ``conditional_fp32_ops`` keeps its own entry), and two lists may not name the same
        operator under different names. The lists come checked
        (:func:`mxamp.precision.resolve.lists_for` checks their types, entries and operator
        names once); an op in two lists is an :class:`~mxamp.errors.AmpArgumentError`.

        >>> lists = get_op_lists('float16').with_overrides(fp32_ops=['flatten'],
        ...                                                canonical={'flatten': 'Flatten'})
        >>> lists.category('Flatten'), lists.category('flatten')
        ('fp32', 'fp32')
        """
        given = {what: list(names) for what, names in (("target_precision_ops", target_precision_ops),
                                                       ("fp32_ops", fp32_ops)) if names is not None}
        conditional = None
        if conditional_fp32_ops is not None:
            conditional = {e[0]: (e[1], tuple(str(v) for v in e[2])) for e in conditional_fp32_ops}
            given["conditional_fp32_ops"] = list(conditional)
        check_disjoint(given, canonical or {})
        if canonical:
            given, conditional = self._with_aliases(given, conditional, canonical)
        named = {n for names in given.values() for n in names}
        low = set(self.low_precision) - named
        fp32 = set(self.fp32) - named
        cond = {k: v for k, v in self.conditional_fp32.items() if k not in named}
        neutral = set(self.neutral) - named
        widest = set(self.widest) - named
        if "target_precision_ops" in given:
            neutral |= low
            low = set(given["target_precision_ops"])
        if "fp32_ops" in given:
            neutral |= fp32
            fp32 = set(given["fp32_ops"])
        base = dict(self.conditional_base)
        if conditional is not None:
            neutral |= set(cond)
            cond = conditional
            replaced = {"low_precision": "target_precision_ops" in given,
                        "fp32": "fp32_ops" in given}
            base = {}
            for op in cond:
                # where the condition does not hold, the op keeps the category it had
                # (unless an override replaced that whole list)
                before = self.base_category(op) or "neutral"
                base[op] = "neutral" if replaced.get(before) else before
        return replace(self, low_precision=frozenset(low), fp32=frozenset(fp32),
                       widest=frozenset(widest),
                       neutral=frozenset(neutral - low - fp32 - set(cond)),
                       conditional_fp32=cond,
                       conditional_base={k: v for k, v in base.items()
                                         if k in cond and v != "neutral"})

    def _with_aliases(self, given, conditional, canonical):
        """``given``'s lists and ``conditional`` extended to every name of each operator they
        name (the names these lists and the overrides know)."""
        same = names_by_operator(set(self.all_ops()).union(*given.values()), canonical)
        expanded = {}
        for what, names in given.items():
            out = list(dict.fromkeys(names))
            out += sorted({a for n in names for a in same(n)} - set(out))
            expanded[what] = out
        if conditional is not None:
            conditional = dict(conditional)
            for op, rule in list(conditional.items()):
                for alias in sorted(same(op)):
                    conditional.setdefault(alias, rule)
        return expanded, conditional


def __getattr__(name):
    """``amp.lists.symbol``: the MXNet 1.5/1.6 name of :mod:`mxamp.lists.symbol_fp16` (GluonNLP
    0.7/0.8 scripts use it; the 1.9.1 reference no longer has it).

    >>> from mxamp import lists
    >>> lists.symbol is lists.symbol_fp16
    True
    """
    if name == "symbol":
        import importlib
        return importlib.import_module("mxamp.lists.symbol_fp16")
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def names_by_operator(names, canonical=None):
    """A function from an op name to every name among ``names`` (and itself) that runs the
    same operator: the one alias-aware grouping, for overrides and for edits to the
    reference's lists. ``canonical`` maps an alias to its operator's real name (the registry's
    alias map); without it, each name stands alone.

    >>> same = names_by_operator({'Flatten', 'flatten', 'relu'}, {'flatten': 'Flatten'})
    >>> sorted(same('Flatten')), sorted(same('relu'))
    (['Flatten', 'flatten'], ['relu'])
    """
    canonical = canonical or {}
    groups = {}
    for name in names:
        groups.setdefault(canonical.get(name, name), set()).add(name)
    return lambda op: groups.get(canonical.get(op, op), set()) | {op}


def check_disjoint(given, canonical):
    """No operator (by its real name in ``canonical``) in two of the ``given`` lists (argument
    name -> op names): an :class:`~mxamp.errors.AmpArgumentError` naming both arguments.

    >>> check_disjoint({'fp32_ops': ['exp'], 'target_dtype_ops': ['dot']}, {})
    """
    keys = list(given)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            ops = {canonical.get(n, n) for n in given[b]}
            both = sorted({n for n in given[a] if canonical.get(n, n) in ops})
            if both:
                raise AmpArgumentError("ops placed in both %s and %s: %s; an op runs in one "
                                       "precision" % (a, b, ", ".join(both)))


@functools.lru_cache(maxsize=None)
def get_op_lists(target):
    """The default :class:`OpLists` for ``'float16'`` or ``'bfloat16'`` (computed once).

    These are mxamp's data as written. What ``amp.init`` and ``convert_*`` use also takes
    the caller's overrides and edits to the reference's module lists into account
    (:func:`mxamp.precision.resolve.lists_for`).

    >>> get_op_lists('bfloat16').target
    'bfloat16'
    """
    if target not in _DATA:
        raise AmpArgumentError("op lists exist for 'float16' and 'bfloat16', not %r" % (target,))
    data = _DATA[target]
    reasons = {}
    for table in ("LOW_PRECISION", "FP32", "WIDEST", "NEUTRAL"):
        reasons.update({k: v for k, v in getattr(data, table).items() if v})
    reasons.update({k: v[2] for k, v in data.CONDITIONAL_FP32.items() if v[2]})
    by_class = {cls: frozenset(ops) for cls, ops in data.NO_KERNEL_BY_CPU_CLASS.items()}
    fp32_when = {cls: {op: tuple(Condition(*c) for c in rules) for op, rules in table.items()}
                 for cls, table in getattr(data, "FP32_WHEN_BY_CPU_CLASS", {}).items()}
    return OpLists(
        target=target,
        low_precision=frozenset(data.LOW_PRECISION),
        fp32=frozenset(data.FP32),
        widest=frozenset(data.WIDEST),
        neutral=frozenset(data.NEUTRAL),
        conditional_fp32={k: (v[0], tuple(v[1])) for k, v in data.CONDITIONAL_FP32.items()},
        loss_output=frozenset(data.LOSS_OUTPUT),
        fp32_params={k: tuple(v) for k, v in data.FP32_PARAMS.items()},
        no_cpu_kernel=frozenset(data.NO_CPU_KERNEL),
        reasons=reasons,
        no_kernel_by_cpu_class=by_class,
        fp32_on_every_cpu=frozenset(getattr(data, "FP32_ON_EVERY_CPU", {})),
        fp32_when_by_cpu_class=fp32_when,
    )


# The data modules, imported with the package (not at the first amp.init): they are large, and
# compiling them takes milliseconds where no bytecode cache is written.
from mxamp.lists import bfloat16 as _bfloat16, float16 as _float16  # noqa: E402

_DATA = {"float16": _float16, "bfloat16": _bfloat16}
