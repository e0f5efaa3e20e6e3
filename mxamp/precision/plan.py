"""One place decides precision: the plan every AMP entry point reads.

``amp.init``, every ``convert_*``, ``cast_model``, ``tune``, ``python -m mxamp.doctor``,
``amp.precision_plan`` and ``amp.precision_of`` turn their request into a :class:`Plan` with
:func:`make`, and read from it what runs in which precision where. :func:`make`, in one pass:

1. the request: ``target_dtype`` (any spelling, or ``'auto'``) or a tuned
   :class:`~mxamp.precision.policy.Policy`, checked;
2. the op lists: mxamp's data (:mod:`mxamp.lists`), edits made to the reference's module lists,
   the caller's overrides and the policy's additions, every name resolved through the operator
   registry (:func:`mxamp.precision.resolve.lists_for`);
3. per device the model runs on (a GPU, or this CPU's bfloat16 class): the ops without a working
   kernel there, the shapes it must not run in bfloat16, and for ``'auto'`` the probe's verdict
   (:func:`mxamp.precision.device_plan`);
4. per operator, an :class:`OpRule`; :func:`decide` applies it per call (the wrappers),
   :meth:`Plan.graph_lists` per graph node (the converter); ``o2`` reads the device plan.

>>> from mxamp.precision import plan
>>> p = plan.make('bfloat16', ['native'])
>>> p.on('native').compute, p.rule('FullyConnected').category
('bfloat16', 'low_precision')
>>> plan.decide(p.rule('softmax'), {}, lambda: True, lambda: (2, 4))
('to', 'float32')
"""
import functools
import logging
from dataclasses import dataclass, field
from typing import NamedTuple

from mxamp.backend.devices import GPU, cpu_class, device_of, symbol_device
from mxamp.precision.device_plan import cpu_notice, device_plan, op_summary, target_for
from mxamp import dtypes
from mxamp.errors import AmpArgumentError
from mxamp.precision.resolve import lists_for
from mxamp.precision.policy import FLOAT32, Policy
from mxamp.runtime.state import STATE

LOG = logging.getLogger("mxamp")

# ------------------------------------------------------------------------------ one operator


class OpRule(NamedTuple):
    """What the plan says about one operator (a named tuple: ``amp.init`` makes hundreds).

    >>> OpRule('fp32', 'bfloat16', 'softmax').category
    'fp32'
    """

    category: str                    # one of mxamp.lists.CATEGORIES
    target: str                      # 'float16' or 'bfloat16'
    op_name: str = ""
    fp32_params: tuple = ()          # input names kept float32 by low-precision ops
    conditions: tuple = ()           # mxamp.lists.conditions.Condition s of conditional_fp32
    fp32_on_cpu: bool = False        # computed in float32 on this CPU (no kernel / no gain)
    warn_on_cpu: bool = False        # warn once when it falls back to float32 on a CPU
    unknown_is_fp32: bool = False    # Symbols of unknown dtype are float32 (nothing is low)
    base: str = "neutral"            # a conditional op's category where no condition holds
    cpu_conditions: tuple = ()       # float32 on this CPU's class where one of these holds


def amp_enabled():
    """False inside ``amp.disabled()`` on this thread.

    >>> amp_enabled()
    True
    """
    return not STATE.disabled_depth()


def first_holding(conditions, params, data_shape, training=None):
    """The first of ``conditions`` that holds for a call's ``params``, or None; ``data_shape()``
    and ``training()`` are asked once, and only if a condition needs them.

    >>> from mxamp.lists.conditions import Condition
    >>> rule = Condition((('kernel', ['(7, 7)']),))
    >>> first_holding([rule], {'kernel': (7, 7)}, lambda: None) is rule
    True
    """
    shape = recording = None
    for cond in conditions:
        if shape is None and cond.needs_shapes():
            shape = data_shape() or ()
        if recording is None and training and cond.names_training():
            recording = (training(),)
        if cond.holds(params, shape, recording[0] if recording else None):
            return cond
    return None


def decide(rule, params, on_cpu, data_shape, training=None):
    """The precision of one call: ``('to', dtype)``, ``('widest', None)`` or ``('none', None)``.

    ``on_cpu()``, ``data_shape()`` and ``training()`` (where it runs, its data's shape, recorded
    for training; None: unknown) are asked only when needed: this runs at every operator call.

    >>> decide(OpRule('low_precision', 'bfloat16', 'FullyConnected'), {}, lambda: True, tuple)
    ('to', 'bfloat16')
    """
    cat = rule.category
    if rule.fp32_on_cpu and on_cpu():
        # no kernel for the target on this CPU (or no gain): float32 even inside disabled()
        return "to", "float32"
    if not amp_enabled():
        # amp.disabled(): nothing is put into low precision. Dtype-neutral ops (optimizer
        # updates writing `out=`, explicit casts...) are left exactly as without AMP.
        return ("none", None) if cat == "neutral" else ("to", "float32")
    if rule.cpu_conditions and on_cpu() and first_holding(rule.cpu_conditions, params, data_shape,
                                                          training):
        # a shape this CPU class must not (or should not) run in low precision
        return "to", "float32"
    if cat == "conditional_fp32":
        # float32 where a condition holds; the op's own list elsewhere
        cat = "fp32" if first_holding(rule.conditions, params, data_shape, training) else rule.base
    if cat == "low_precision":
        return "to", rule.target
    if cat == "fp32":
        return "to", "float32"
    if cat == "widest":
        return "widest", None
    return "none", None


def explain(rule, params, on_cpu, data_shape, training=None):
    """Why :func:`decide` decided what it did for one call, in words.

    >>> explain(OpRule('fp32', 'bfloat16', 'softmax'), {}, True, None)
    "softmax is in the 'fp32' list for bfloat16"
    """
    where = "on this CPU" if on_cpu else "on a GPU"
    if rule.fp32_on_cpu and on_cpu:
        return "%s computes in float32 %s (no %s kernel or no gain here)" % (
            rule.op_name, where, rule.target)
    if not amp_enabled():
        return "inside amp.disabled()"
    cond = first_holding(rule.cpu_conditions, params, lambda: data_shape,
                         lambda: training) if on_cpu else None
    if cond is not None:
        return "%s: %s holds %s: %s" % (rule.op_name, cond.describe(), where, cond.reason)
    if rule.category == "conditional_fp32":
        cond = first_holding(rule.conditions, params, lambda: data_shape, lambda: training)
        if cond is not None:
            return "%s: its float32 condition %s holds" % (rule.op_name, cond.describe())
        return "%s: no float32 condition holds, so its own list decides (%r)" % (
            rule.op_name, rule.base)
    return "%s is in the %r list for %s" % (rule.op_name, rule.category, rule.target)


# ---------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Plan:
    """A request resolved: its op lists, and what each device it runs on computes.

    >>> p = make('auto', ['none'])
    >>> p.target, p.on('none').compute
    ('bfloat16', 'float32')
    """

    requested: str                   #: 'float16', 'bfloat16' or 'auto', as asked
    target: str                      #: the op lists in force: 'float16' or 'bfloat16'
    lists: object                    #: mxamp.lists.OpLists: overrides and policy applied
    device_plans: tuple              #: mxamp.precision.device_plan.DevicePlan per device, primary first
    policy: object = None            #: the mxamp.precision.policy.Policy it came from, if any
    _rules: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def primary(self):
        """The plan of the device graphs built now run on (the first one asked for).

        >>> make('auto', ['gpu', 'none']).primary.compute
        'float16'
        """
        return self.device_plans[0]

    @property
    def leaves_mxnet_alone(self):
        """True when mxamp chose float32 everywhere: ``amp.init`` then wraps only loss outputs.

        >>> make('auto', ['none']).leaves_mxnet_alone, make('bfloat16', ['none']).leaves_mxnet_alone
        (True, False)
        """
        low = any(d.low_precision for d in self.device_plans)
        return self.requested == dtypes.AUTO and not low   # a float32 policy requests 'auto'

    def on(self, device):
        """The :class:`~mxamp.precision.device_plan.DevicePlan` of ``device`` ('gpu' or a CPU class).

        >>> make('bfloat16', ['none']).on('amx').compute
        'bfloat16'
        """
        for dplan in self.device_plans:
            if dplan.device == device:
                return dplan
        return device_plan(self.requested, self.lists, device,
                                   _float32_because(self.policy))

    @functools.cached_property
    def cpu(self):
        """The plan of the CPU it runs on (where NDArray calls on CPU arrays run): the first
        CPU class asked for, else this CPU's (found once: ``amp.init`` asks for every op).

        >>> make('bfloat16', ['gpu', 'amx']).cpu.device
        'amx'
        """
        for dplan in self.device_plans:
            if dplan.device != GPU:
                return dplan
        return self.on(cpu_class())

    def rule(self, op_name):
        """The :class:`OpRule` of ``op_name`` (None for an op in no list), made once.

        >>> make('float16', ['gpu']).rule('softmax').category
        'fp32'
        """
        found = self._rules.get(op_name, self._rules)
        if found is not self._rules:
            return found
        lists, cpu = self.lists, self.cpu
        category = lists.category(op_name)
        rule = None
        if category is not None:
            fp32_on_cpu = op_name in cpu.fp32_ops
            rule = OpRule(
                category=category, target=self.target, op_name=op_name,
                fp32_params=tuple(lists.fp32_params.get(op_name, ())),
                conditions=lists.conditions(op_name), base=lists.base_category(op_name),
                cpu_conditions=cpu.fp32_when.get(op_name, ()), fp32_on_cpu=fp32_on_cpu,
                # float16 GEMMs warn once each when they fall back to float32 on a CPU
                warn_on_cpu=(fp32_on_cpu and self.target == "float16"
                             and category == "low_precision"),
                # nothing AMP builds can be low precision: a Symbol of unknown dtype is float32
                unknown_is_fp32=not self.primary.low_precision)
        self._rules[op_name] = rule
        return rule

    def graph_lists(self):
        """The op lists a graph that runs on this plan's devices needs: ops without a kernel
        there (or, for 'auto', without a gain) in float32, and each device's float32
        conditions (:meth:`mxamp.lists.OpLists.with_device_conditions`). An explicit float16
        request is left as it is (a float16 graph on a CPU is refused where it is run).

        >>> make('bfloat16', ['none']).graph_lists().category('Convolution')
        'fp32'
        """
        if self.requested == "float16":
            return self.lists
        fp32_ops, conditions = set(), {}
        for dplan in self.device_plans:
            fp32_ops |= dplan.fp32_ops
            for op, conds in dplan.fp32_when.items():
                conditions[op] = conditions.get(op, ()) + tuple(conds)
        # an op another device computes in float32 anyway needs no condition
        return self.lists.computing_in_fp32(fp32_ops).with_device_conditions(
            {op: conds for op, conds in conditions.items() if op not in fp32_ops})

    def announce(self, what="mxamp", stacklevel=4):
        """Say what runs: one warning per process for a request a device cannot serve well
        (:func:`mxamp.precision.device_plan.cpu_notice`) or an override it cannot serve, and one
        log line per device for 'auto', a policy, or ops kept in float32 for want of a kernel.

        >>> make('auto', ['none']).announce()      # 'auto' never warns; it logs what it chose
        """
        for dplan in self.device_plans:
            STATE.warn_once(cpu_notice(dplan), stacklevel=stacklevel)
            if self.requested == dtypes.AUTO or self.policy is not None:
                LOG.info("%s: %s", what, self.describe(dplan))
            elif dplan.device != GPU:
                self._say_cpu_fp32(dplan, what, stacklevel)

    def _say_cpu_fp32(self, dplan, what, stacklevel):
        """Log the ops kept in float32 beyond the fp32 list; warn of overrides no CPU serves."""
        lists = self.lists
        beyond, refused = dplan.fp32_ops - lists.fp32, lists.low_precision & lists.fp32_on_every_cpu
        if beyond and dplan.low_precision:
            LOG.info("%s: no working %s kernel on a CPU of class %r, kept in float32: %s", what,
                     self.target, dplan.device, op_summary(beyond))
        if refused:
            STATE.warn_once("mxamp: target_precision_ops names ops that stay float32 on a CPU: "
                            + "; ".join("%s (%s)" % (o, lists.reasons[o]) for o in sorted(refused)),
                            stacklevel=stacklevel + 1)

    def describe(self, dplan=None):
        """One line: the request (or policy), the device, what runs.

        >>> make('auto', ['none']).describe().startswith("target_dtype='auto' on a CPU")
        True
        """
        text = (dplan or self.primary).describe()
        if self.policy is not None:
            text = "policy %r: %s" % (self.policy.name, text)
        return text

    def precision_of(self, op_name, data_shape=None, on_cpu=True, training=None, **params):
        """``(decision, why)`` for one call of ``op_name``: see :func:`mxamp.patching.patcher.precision_of`.

        >>> make('bfloat16', ['native']).precision_of('Convolution', kernel=(3, 3))[0]
        'bfloat16'
        """
        rule = self.rule(op_name)
        if rule is None:
            return "input", "%s is in no %s op list: MXNet runs it unchanged" % (
                op_name, self.target)
        shape = tuple(data_shape) if data_shape is not None else None
        mode, to = decide(rule, params, lambda: on_cpu, lambda: shape, lambda: training)
        decision = {"to": to, "widest": "widest", "none": "input"}[mode]
        return decision, explain(rule, params, on_cpu, shape, training)


# ------------------------------------------------------------------------------- making one


def _request(target_dtype, policy, default_dtype):
    """(request, policy) from ``target_dtype`` and a policy (whose target wins where
    ``target_dtype`` is None or the caller's default ``default_dtype``; another explicit target
    is an error)."""
    if policy is None:
        return dtypes.normalize_request(target_dtype), None
    if not isinstance(policy, Policy):
        raise AmpArgumentError("policy must be an mxamp Policy (amp.tune's result, or "
                               "amp.Policy.load(path)), got %s" % type(policy).__name__)
    wanted = dtypes.AUTO if policy.target == FLOAT32 else dtypes.normalize_request(policy.target)
    if target_dtype is not None and target_dtype != default_dtype:
        asked = dtypes.normalize_request(target_dtype)
        if asked != wanted and not (asked == dtypes.AUTO and policy.target == FLOAT32):
            raise AmpArgumentError(
                "target_dtype=%r disagrees with the policy %r (tuned for %s); pass one or the "
                "other" % (target_dtype, policy.name, policy.target))
    return wanted, policy


def _float32_because(policy):
    """Why a float32 policy computes in float32 (the reason its device plans give), or ''."""
    if policy is None or policy.target != FLOAT32:
        return ""
    return "amp.tune chose float32: %s" % (policy.why or "float32 measured fastest")


def _check_widest(target, named):
    """``convert_*`` keep widest-list ops where they are, as the reference asserts."""
    widest = lists_for(target).widest
    for what, names in named:
        if isinstance(names, (list, tuple)):
            clash = sorted({n for n in names if isinstance(n, str) and n in widest})
            if clash:
                raise AmpArgumentError(
                    "%s names ops of the widest-type list, which convert_* keeps as they are "
                    "(as mxnet.contrib.amp does): %s; pass allow_widest_overrides=True to move "
                    "them" % (what, ", ".join(clash)))


def make(target_dtype="auto", where=None, target_precision_ops=None, fp32_ops=None,
         conditional_fp32_ops=None, policy=None, default_dtype=None,
         low_precision_argument="target_precision_ops", allow_widest_overrides=True):
    """The :class:`Plan` of a request, for the devices in ``where``.

    ``where`` lists the devices the model runs on ('gpu' or CPU classes; default: the GPU if
    the process has one, and this CPU); the first decides what ``'auto'`` means (float16 on a
    GPU, else bfloat16). The override lists are those of ``amp.init`` (the low-precision one
    named ``low_precision_argument`` in errors); ``policy`` is a tuned
    :class:`~mxamp.precision.policy.Policy`, whose target replaces ``target_dtype`` when that is the
    caller's default ``default_dtype``. ``allow_widest_overrides=False`` refuses widest-list
    ops in the overrides, as the reference's ``convert_*`` do. Bad arguments raise
    :class:`~mxamp.errors.AmpArgumentError`; nothing is changed.

    >>> make('bfloat16', ['none'], fp32_ops=['FullyConnected']).rule('FullyConnected').category
    'fp32'
    """
    requested, policy = _request(target_dtype, policy, default_dtype)
    if where is None:
        where = [symbol_device(), cpu_class()]
    where = list(dict.fromkeys(where))
    target = target_for(requested, where[0])
    if not allow_widest_overrides:
        _check_widest(target, [
            (low_precision_argument, target_precision_ops), ("fp32_ops", fp32_ops),
            ("conditional_fp32_ops", [e[0] for e in conditional_fp32_ops or ()
                                      if isinstance(e, (list, tuple)) and e])])
    lists = lists_for(target, target_precision_ops=target_precision_ops, fp32_ops=fp32_ops,
                      conditional_fp32_ops=conditional_fp32_ops,
                      low_precision_argument=low_precision_argument, policy=policy)
    because = _float32_because(policy)
    plans = tuple(device_plan(requested, lists, device, because) for device in where)
    return Plan(requested=requested, target=target, lists=lists, device_plans=plans,
                policy=policy)


def precision_plan(target_dtype="auto", ctx=None):
    """What AMP computes for ``target_dtype`` on ``ctx`` (default: a GPU if the process has one,
    else this CPU), as a :class:`~mxamp.precision.device_plan.DevicePlan`: nothing is changed, nothing is run.

    >>> import mxnet as mx
    >>> p = precision_plan('float16', mx.cpu())               # amp.precision_plan
    >>> p.compute, p.summary()[:40]
    ('float32', 'float16 requested; float32 compute: floa')
    """
    device = symbol_device() if ctx is None else device_of(ctx)
    return make(target_dtype, [device]).primary
