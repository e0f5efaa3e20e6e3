"""The loss-scale state machine: when to grow, when to back off, what to remember.

This module knows nothing about MXNet. It is told, once per optimizer step, whether the
gradients were finite, and answers with the scale the next step must use. The Trainer
integration (:mod:`mxamp.training.trainer`) feeds it and applies its answer.

Rules (the options and their defaults are the fields of :class:`ScalerConfig`, written once
there and shown by ``help(LossScaler)`` and ``help(amp.init_trainer)``):

* an overflowed step is always skipped by the caller; ``hysteresis`` overflows since the last
  scale change make the scale back off: ``scale * backoff_factor``, never below ``min_scale``;
* after ``growth_interval`` clean steps in a row the scale grows: ``scale * growth_factor``,
  never above ``max_scale``;
* a new scale is in force from the very next step;
* ``dynamic=False`` keeps the scale fixed (static loss scaling; skipping still happens).

>>> s = LossScaler(init_scale=8.0, growth_interval=2)
>>> s.update(found_overflow=True).new_scale       # back off at once
4.0
>>> s.update(False).new_scale, s.update(False).new_scale   # grows after 2 clean steps
(4.0, 8.0)
"""
import collections
import math
from dataclasses import asdict, dataclass, fields

from mxamp.errors import AmpArgumentError

#: How many scale changes :attr:`LossScaler.history` keeps (oldest dropped first).
HISTORY_LENGTH = 1000
#: Version of :meth:`LossScaler.state_dict`'s format (mxamp 0.1.0's, without a version, is 0).
STATE_VERSION = 1


@dataclass(frozen=True)
class ScalerConfig:
    """Every option of :class:`LossScaler`, with its default: the one place they are written.

    The defaults are float16's; :data:`TARGET_DEFAULTS` holds each target's.

    >>> ScalerConfig().growth_interval, TARGET_DEFAULTS['bfloat16'].init_scale
    (2000, 1.0)
    """

    init_scale: float = 2.0 ** 16      #: the scale of the first step
    growth_factor: float = 2.0         #: multiplier after growth_interval clean steps (> 1)
    backoff_factor: float = 0.5        #: multiplier on overflow (between 0 and 1)
    growth_interval: int = 2000        #: clean steps in a row before the scale grows
    min_scale: float = 1.0             #: the scale never backs off below this
    max_scale: float = 2.0 ** 24       #: the scale never grows above this
    hysteresis: int = 1                #: back off on the N-th overflow since the last change
    dynamic: bool = True               #: False keeps init_scale forever (static scaling)


#: The float16 defaults, as used by signatures.
DEFAULTS = ScalerConfig()
#: Per target: float16 needs a large dynamic scale; bfloat16 (float32's exponent range) and
#: float32 compute need none: a static scale of 1.0, whose steps are still checked and skipped.
TARGET_DEFAULTS = {"float16": DEFAULTS,
                   "bfloat16": ScalerConfig(init_scale=1.0, dynamic=False),
                   "float32": ScalerConfig(init_scale=1.0, dynamic=False)}

StepOutcome = collections.namedtuple(
    "StepOutcome", ["skipped", "old_scale", "new_scale", "stuck_at_min_scale"])
StepOutcome.__doc__ = """What :meth:`LossScaler.update` decided for one step.

skipped: the step had non-finite gradients and must not be applied.
old_scale / new_scale: the scale before and after the decision (equal when unchanged).
stuck_at_min_scale: an overflow happened while the scale cannot go lower: it already sat at
``min_scale``, or it is static (``dynamic=False``: bfloat16's 1.0).
"""

#: The options a scaler keeps besides its scale (every field of ScalerConfig but init_scale).
_OPTIONS = tuple(f.name for f in fields(ScalerConfig) if f.name != "init_scale")
#: Counters a state carries (0 in a fresh scaler).
_COUNTERS = ("clean_steps", "overflows_since_change", "steps", "skipped_steps")
_STATE_KEYS = ("scale",) + _OPTIONS + _COUNTERS + ("history",)


def _positive_finite(name, value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise AmpArgumentError("%s must be a number, got %r" % (name, value)) from None
    if not math.isfinite(value) or value <= 0:
        raise AmpArgumentError("%s must be a finite number > 0, got %r" % (name, value))
    return value


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AmpArgumentError("%s must be an integer >= 1, got %r" % (name, value))
    return value


class LossScaler:
    """Dynamic (or static) loss scale with growth, backoff, bounds and hysteresis.

    The options are those of :class:`ScalerConfig` (its docs say what each does); overflow at
    ``min_scale`` keeps skipping steps. Bad options raise
    :class:`~mxamp.errors.AmpArgumentError` naming the option.

    >>> LossScaler(init_scale=4.0, dynamic=False).update(True).new_scale
    4.0
    >>> LossScaler.from_config(TARGET_DEFAULTS['bfloat16']).scale
    1.0
    """

    def __init__(self, init_scale=DEFAULTS.init_scale, growth_factor=DEFAULTS.growth_factor,
                 backoff_factor=DEFAULTS.backoff_factor,
                 growth_interval=DEFAULTS.growth_interval, min_scale=DEFAULTS.min_scale,
                 max_scale=DEFAULTS.max_scale, hysteresis=DEFAULTS.hysteresis,
                 dynamic=DEFAULTS.dynamic):
        self.growth_factor = _positive_finite("growth_factor", growth_factor)
        self.backoff_factor = _positive_finite("backoff_factor", backoff_factor)
        if self.growth_factor <= 1.0:
            raise AmpArgumentError("growth_factor must be > 1, got %r" % (growth_factor,))
        if self.backoff_factor >= 1.0:
            raise AmpArgumentError("backoff_factor must be < 1, got %r" % (backoff_factor,))
        self.growth_interval = _positive_int("growth_interval", growth_interval)
        self.hysteresis = _positive_int("hysteresis", hysteresis)
        self.min_scale = _positive_finite("min_scale", min_scale)
        self.max_scale = _positive_finite("max_scale", max_scale)
        if self.min_scale > self.max_scale:
            raise AmpArgumentError("min_scale (%r) must not exceed max_scale (%r)"
                                   % (min_scale, max_scale))
        self.dynamic = bool(dynamic)
        self._scale = self._clamped(_positive_finite("init_scale", init_scale), "init_scale")
        self.clean_steps = 0            # clean steps since the last overflow or growth
        self.overflows_since_change = 0  # counts towards ``hysteresis``
        self.steps = 0
        self.skipped_steps = 0
        self.history = collections.deque(maxlen=HISTORY_LENGTH)

    @classmethod
    def from_config(cls, config):
        """A scaler with the options of a :class:`ScalerConfig`."""
        return cls(**asdict(config))

    @property
    def config(self):
        """The options in force, as a :class:`ScalerConfig` (the scale is the current one).

        >>> LossScaler(hysteresis=2).config.hysteresis
        2
        """
        return ScalerConfig(init_scale=self._scale, **{k: getattr(self, k) for k in _OPTIONS})

    def _clamped(self, value, name):
        if self.dynamic and not self.min_scale <= value <= self.max_scale:
            raise AmpArgumentError("%s=%r is outside [min_scale, max_scale] = [%r, %r]"
                                   % (name, value, self.min_scale, self.max_scale))
        return value

    @property
    def scale(self):
        """The scale in force for the current step.

        >>> LossScaler(init_scale=2.0).scale
        2.0
        """
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = self._clamped(_positive_finite("scale", value), "scale")

    def update(self, found_overflow):
        """Record one step's verdict and return a :data:`StepOutcome`.

        >>> LossScaler(init_scale=2.0, min_scale=2.0).update(True).stuck_at_min_scale
        True
        """
        old = self._scale
        self.steps += 1
        stuck = False
        if found_overflow:
            self.skipped_steps += 1
            self.clean_steps = 0
            if self.dynamic:
                self.overflows_since_change += 1
                if self.overflows_since_change >= self.hysteresis:
                    stuck = old <= self.min_scale
                    self._change(max(old * self.backoff_factor, self.min_scale), "overflow")
            else:   # a static scale never lowers: non-finite gradients are not its doing
                stuck = True
        else:
            self.clean_steps += 1
            if self.dynamic and self.clean_steps >= self.growth_interval:
                self.clean_steps = 0
                self._change(min(old * self.growth_factor, self.max_scale), "growth")
        return StepOutcome(bool(found_overflow), old, self._scale, stuck)

    def _change(self, new_scale, reason):
        self.overflows_since_change = 0
        if new_scale != self._scale:
            self.history.append((self.steps, new_scale, reason))
            self._scale = new_scale

    def state_dict(self):
        """Everything needed to resume: options, scale, counters and history (plain Python),
        with the format's ``version``.

        >>> state = LossScaler(init_scale=8.0).state_dict()
        >>> state['scale'], state['version']
        (8.0, 1)
        """
        state = {key: getattr(self, key) for key in _STATE_KEYS if key != "scale"}
        state["scale"] = self._scale
        state["history"] = list(self.history)
        state["version"] = STATE_VERSION
        return state

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned, by this or an older mxamp.

        Only ``scale`` is required: an option or counter missing from an older format gets
        its default (so adding a key never breaks a saved checkpoint); mxamp 0.1.0's format
        (no ``version``) loads as is. Unknown keys, a newer version or bad values raise
        :class:`~mxamp.errors.AmpArgumentError`, and then nothing changes.

        >>> a = LossScaler(init_scale=8.0); a.update(True).new_scale
        4.0
        >>> b = LossScaler(); b.load_state_dict(a.state_dict()); b.scale, b.skipped_steps
        (4.0, 1)
        >>> c = LossScaler(); c.load_state_dict({'scale': 2.0}); c.scale, c.growth_interval
        (2.0, 2000)
        """
        if not isinstance(state, dict):
            raise AmpArgumentError("load_state_dict expects the dict from state_dict(), got %s"
                                   % type(state).__name__)
        version = state.get("version", 0)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise AmpArgumentError("not a LossScaler state: version %r" % (version,))
        if version > STATE_VERSION:
            raise AmpArgumentError(
                "this LossScaler state was saved by a newer mxamp (format version %d; this one "
                "reads versions up to %d): upgrade mxamp to load it" % (version, STATE_VERSION))
        missing = {"scale"} - set(state)
        unknown = set(state) - set(_STATE_KEYS) - {"version"}
        if missing or unknown:
            raise AmpArgumentError("not a LossScaler state: missing keys %s, unknown keys %s"
                                   % (sorted(missing), sorted(unknown)))
        options = {key: state.get(key, getattr(DEFAULTS, key)) for key in _OPTIONS}
        # Validate everything on a fresh instance first so a bad state changes nothing here.
        fresh = LossScaler(init_scale=state["scale"], **options)
        for key in _COUNTERS:
            value = state.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise AmpArgumentError("%s must be an integer >= 0, got %r" % (key, value))
            setattr(fresh, key, value)
        fresh.history.extend(tuple(entry) for entry in state.get("history", ()))
        self.__dict__.update(fresh.__dict__)

    def __repr__(self):
        return ("LossScaler(scale=%g, dynamic=%s, clean_steps=%d, skipped_steps=%d)"
                % (self._scale, self.dynamic, self.clean_steps, self.skipped_steps))
