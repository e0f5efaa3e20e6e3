"""The loss-scale state machine: when to grow, when to back off, what to remember.

This module knows nothing about MXNet. It is told, once per optimizer step, whether the
gradients were finite, and answers with the scale the next step must use. The Trainer
integration (:mod:`mxamp.trainer`) feeds it and applies its answer.

Rules, with the default values of :class:`LossScaler`:

* an overflowed step is always skipped by the caller; ``hysteresis`` (1) overflows since the
  last scale change make the scale back off: ``scale * backoff_factor`` (0.5), never below
  ``min_scale`` (1.0);
* after ``growth_interval`` (2000) clean steps in a row the scale grows:
  ``scale * growth_factor`` (2.0), never above ``max_scale`` (2**24);
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

#: How many scale changes :attr:`LossScaler.history` keeps (oldest dropped first).
HISTORY_LENGTH = 1000

StepOutcome = collections.namedtuple(
    "StepOutcome", ["skipped", "old_scale", "new_scale", "stuck_at_min_scale"])
StepOutcome.__doc__ = """What :meth:`LossScaler.update` decided for one step.

skipped: the step had non-finite gradients and must not be applied.
old_scale / new_scale: the scale before and after the decision (equal when unchanged).
stuck_at_min_scale: an overflow happened while the scale already sat at ``min_scale``.
"""

_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale",
               "max_scale", "hysteresis", "dynamic", "clean_steps", "overflows_since_change",
               "steps", "skipped_steps", "history")


def _positive_finite(name, value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError("%s must be a number, got %r" % (name, value)) from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("%s must be a finite number > 0, got %r" % (name, value))
    return value


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("%s must be an integer >= 1, got %r" % (name, value))
    return value


class LossScaler:
    """Dynamic (or static) loss scale with growth, backoff, bounds and hysteresis.

    Parameters
    ----------
    init_scale : float, default 2**16
        The scale of the first step.
    growth_factor : float, default 2.0
        Multiplier applied after ``growth_interval`` clean steps in a row (> 1).
    backoff_factor : float, default 0.5
        Multiplier applied on overflow (between 0 and 1).
    growth_interval : int, default 2000
        Clean steps in a row before the scale grows.
    min_scale : float, default 1.0
        The scale never backs off below this; overflow at ``min_scale`` keeps skipping steps.
    max_scale : float, default 2**24
        The scale never grows above this.
    hysteresis : int, default 1
        Back off on the N-th overflow since the last scale change (1 = on every overflow).
    dynamic : bool, default True
        False keeps ``init_scale`` forever (static loss scaling).

    >>> LossScaler(init_scale=4.0, dynamic=False).update(True).new_scale
    4.0
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, min_scale=1.0, max_scale=2.0 ** 24, hysteresis=1,
                 dynamic=True):
        self.growth_factor = _positive_finite("growth_factor", growth_factor)
        self.backoff_factor = _positive_finite("backoff_factor", backoff_factor)
        if self.growth_factor <= 1.0:
            raise ValueError("growth_factor must be > 1, got %r" % (growth_factor,))
        if self.backoff_factor >= 1.0:
            raise ValueError("backoff_factor must be < 1, got %r" % (backoff_factor,))
        self.growth_interval = _positive_int("growth_interval", growth_interval)
        self.hysteresis = _positive_int("hysteresis", hysteresis)
        self.min_scale = _positive_finite("min_scale", min_scale)
        self.max_scale = _positive_finite("max_scale", max_scale)
        if self.min_scale > self.max_scale:
            raise ValueError("min_scale (%r) must not exceed max_scale (%r)"
                             % (min_scale, max_scale))
        self.dynamic = bool(dynamic)
        self._scale = self._clamped(_positive_finite("init_scale", init_scale), "init_scale")
        self.clean_steps = 0            # clean steps since the last overflow or growth
        self.overflows_since_change = 0  # counts towards ``hysteresis``
        self.steps = 0
        self.skipped_steps = 0
        self.history = collections.deque(maxlen=HISTORY_LENGTH)

    def _clamped(self, value, name):
        if self.dynamic and not self.min_scale <= value <= self.max_scale:
            raise ValueError("%s=%r is outside [min_scale, max_scale] = [%r, %r]"
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
        """Everything needed to resume: options, scale, counters and history (plain Python).

        >>> LossScaler(init_scale=8.0).state_dict()['scale']
        8.0
        """
        state = {key: getattr(self, key) for key in _STATE_KEYS if key != "scale"}
        state["scale"] = self._scale
        state["history"] = list(self.history)
        return state

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned; unknown or missing keys are a ValueError.

        >>> a = LossScaler(init_scale=8.0); a.update(True).new_scale
        4.0
        >>> b = LossScaler(); b.load_state_dict(a.state_dict()); b.scale, b.skipped_steps
        (4.0, 1)
        """
        if not isinstance(state, dict):
            raise TypeError("load_state_dict expects the dict from state_dict(), got %s"
                            % type(state).__name__)
        missing = set(_STATE_KEYS) - set(state)
        unknown = set(state) - set(_STATE_KEYS)
        if missing or unknown:
            raise ValueError("not a LossScaler state: missing keys %s, unknown keys %s"
                             % (sorted(missing), sorted(unknown)))
        # Validate everything on a fresh instance first so a bad state changes nothing here.
        fresh = LossScaler(init_scale=state["scale"], growth_factor=state["growth_factor"],
                           backoff_factor=state["backoff_factor"],
                           growth_interval=state["growth_interval"],
                           min_scale=state["min_scale"], max_scale=state["max_scale"],
                           hysteresis=state["hysteresis"], dynamic=state["dynamic"])
        for key in ("clean_steps", "overflows_since_change", "steps", "skipped_steps"):
            if isinstance(state[key], bool) or not isinstance(state[key], int) or state[key] < 0:
                raise ValueError("%s must be an integer >= 0, got %r" % (key, state[key]))
            setattr(fresh, key, state[key])
        fresh.history.extend(tuple(entry) for entry in state["history"])
        self.__dict__.update(fresh.__dict__)

    def __repr__(self):
        return ("LossScaler(scale=%g, dynamic=%s, clean_steps=%d, skipped_steps=%d)"
                % (self._scale, self.dynamic, self.clean_steps, self.skipped_steps))
