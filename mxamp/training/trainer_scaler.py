"""The object :func:`mxamp.amp.init_trainer` puts at ``trainer._amp_loss_scaler``.

MXNet 1.9.1's ``Trainer._update`` already calls ``self._amp_loss_scaler.has_overflow(params)``
and returns early when it answers True, before the optimizer touches any weight or state.
:class:`TrainerScaler` answers that call: it checks every context's gradient of every
trainable parameter in one pass (:mod:`mxamp.training.overflow`), feeds the verdict to the pure
:class:`~mxamp.training.scaler.LossScaler`, logs scale changes and remembers which parameters
overflowed.

It also keeps the attribute names of the reference scaler (``loss_scale``, ``_loss_scale``,
``_next_loss_scale``, ``_unskipped``, ``_scale_seq_len``, ``_max_loss_scale``), because
Sockeye, GluonNLP and MLPerf scripts read and set them; setting one changes the behaviour.

>>> from mxamp.training.scaler import LossScaler
>>> hook = TrainerScaler(LossScaler(init_scale=1024.0), target_dtype='float16')
>>> hook.loss_scale, hook._scale_seq_len
(1024.0, 2000)
"""
import logging
import threading
import warnings

from mxamp.backend import mxnet_private as mxp
from mxamp.training import overflow
from mxamp.errors import AmpArgumentError
from mxamp.training.scaler import LossScaler

LOG = logging.getLogger("mxamp")


def _scaler_field(field, convert=None):
    """A property that reads ``self.scaler.<field>`` and sets it, converted by ``convert``
    (which raises for a bad value), under ``self.lock``."""
    def get(self):
        return getattr(self.scaler, field)

    def set_(self, value):
        value = convert(value) if convert is not None else value
        with self.lock:
            setattr(self.scaler, field, value)
    return property(get, set_)


def _growth_interval(value):
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise AmpArgumentError("_scale_seq_len (growth interval) must be an integer >= 1, "
                               "got %r" % (value,))
    return int(value)


class TrainerScaler:
    """Skip-on-overflow decision and loss-scale state of one Gluon Trainer.

    Parameters
    ----------
    scaler : LossScaler
        The state machine deciding the scale.
    target_dtype : str
        ``'float16'`` or ``'bfloat16'``; only reported (``repr``, logs, state).
    skip_nonfinite : bool, default True
        Check gradients and skip steps holding Inf/NaN. With a static scale and
        ``skip_nonfinite=False`` no check runs at all (zero cost, no protection).
    """

    def __init__(self, scaler, target_dtype, skip_nonfinite=True):
        if scaler.dynamic and not skip_nonfinite:
            raise AmpArgumentError("dynamic loss scaling needs skip_nonfinite=True: an "
                                   "overflowed step would otherwise write Inf/NaN into the "
                                   "weights")
        self.scaler = scaler
        self.target_dtype = target_dtype
        self.skip_nonfinite = bool(skip_nonfinite)
        #: Names of the parameters whose gradient held Inf/NaN in the last skipped step.
        self.nonfinite_params = []
        self.lock = threading.RLock()
        self.checker = overflow.FiniteChecker()   # remembers how to check these gradients
        self._warned_at_min_scale = False

    # ----- the reference's attribute names, kept meaningful -----
    @property
    def loss_scale(self):
        """The scale the current step's loss is multiplied by.

        >>> TrainerScaler(LossScaler(init_scale=8.0), 'float16').loss_scale
        8.0
        """
        return self.scaler.scale

    # The reference's private attributes, which scripts set: each reads and writes one field
    # of the scaler, under the lock.
    _loss_scale = _scaler_field("scale")
    # The reference applies a new scale one step late and keeps it in ``_next_loss_scale``;
    # here a new scale applies at once, so "next" and "current" are the same number and
    # setting either sets the scale of the next step.
    _next_loss_scale = _loss_scale
    _unskipped = _scaler_field("clean_steps", int)
    _scale_seq_len = _scaler_field("growth_interval", _growth_interval)

    @property
    def _max_loss_scale(self):
        return self.scaler.max_scale

    @_max_loss_scale.setter
    def _max_loss_scale(self, value):
        value = float(value)
        if value < self.scaler.min_scale:
            raise AmpArgumentError("_max_loss_scale=%r is below min_scale=%r"
                                   % (value, self.scaler.min_scale))
        with self.lock:
            self.scaler.max_scale = value
            if self.scaler.scale > value:
                self.scaler.scale = value

    # ----- diagnostics -----
    @property
    def skipped_steps(self):
        """How many steps were skipped because of non-finite gradients."""
        return self.scaler.skipped_steps

    @property
    def scale_history(self):
        """``[(step, new_scale, reason)]`` for every scale change (reason: overflow/growth)."""
        return list(self.scaler.history)

    # ----- the hook Trainer._update calls -----
    def has_overflow(self, params):
        """Check all gradients of ``params``; True means: skip this step (called by MXNet).

        Every context's gradient of every parameter whose ``grad_req`` is not ``'null'`` and
        that backward wrote since the last step (MXNet updates no other; a branch left unused
        keeps its last gradient) is checked in one pass with one host synchronisation.
        Parameters are named only on skipped steps, whose gradients count as consumed, as an
        applied step's do.

        >>> import mxnet as mx
        >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
        >>> TrainerScaler(LossScaler(), 'float16').has_overflow([p])
        False
        """
        with self.lock:
            if not self.skip_nonfinite:
                self.scaler.update(False)
                return False
            grads, owners = trainable_grads(params, fresh_only=True)
            report = self.checker.check(grads)
            outcome = self.scaler.update(report.has_nonfinite)
            if outcome.skipped:
                self.nonfinite_params = sorted({owners[i] for i in report.bad_indices})
                mxp.consume_fresh_grads(params)
                LOG.info("mxamp: step skipped, non-finite gradients in %s (loss scale %g)",
                         ", ".join(self.nonfinite_params), outcome.old_scale)
                if outcome.stuck_at_min_scale and not self._warned_at_min_scale:
                    self._warned_at_min_scale = True
                    # stacklevel 4: has_overflow <- Trainer._update <- step <- the caller
                    warnings.warn(self._stuck_message(), RuntimeWarning, stacklevel=4)
            if outcome.new_scale != outcome.old_scale:
                LOG.info("mxamp: loss scale %g -> %g (%s)", outcome.old_scale,
                         outcome.new_scale, "overflow" if outcome.skipped else "growth")
            return outcome.skipped

    def _stuck_message(self):
        where = ", ".join(self.nonfinite_params)
        if not self.scaler.dynamic:
            return ("mxamp: non-finite gradients at the static loss scale %g (which never "
                    "lowers), step skipped; in: %s. Look for Inf/NaN in the inputs or the loss."
                    % (self.scaler.scale, where))
        return ("mxamp: gradients still overflow at min_scale=%g, so steps keep being "
                "skipped; non-finite gradients in: %s. Look for Inf/NaN in the loss "
                "or lower min_scale in amp.init_trainer." % (self.scaler.min_scale, where))

    # ----- checkpoints -----
    def state_dict(self):
        """Scaler state plus this hook's options, as plain Python values.

        >>> TrainerScaler(LossScaler(), 'bfloat16', True).state_dict()['target_dtype']
        'bfloat16'
        """
        return {"scaler": self.scaler.state_dict(), "target_dtype": self.target_dtype,
                "skip_nonfinite": self.skip_nonfinite}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`; a malformed state raises and changes nothing.

        >>> a = TrainerScaler(LossScaler(init_scale=4.0), 'float16')
        >>> b = TrainerScaler(LossScaler(), 'float16'); b.load_state_dict(a.state_dict())
        >>> b.loss_scale
        4.0
        """
        if not isinstance(state, dict) or "scaler" not in state:
            raise AmpArgumentError("not an mxamp trainer-scaler state: %r" % (state,))
        scaler = LossScaler()
        scaler.load_state_dict(state["scaler"])
        skip = bool(state.get("skip_nonfinite", True))
        if scaler.dynamic and not skip:
            raise AmpArgumentError("state has dynamic scaling with skip_nonfinite=False")
        with self.lock:
            self.scaler = scaler
            self.skip_nonfinite = skip
            self.target_dtype = state.get("target_dtype", self.target_dtype)

    def __repr__(self):
        return "TrainerScaler(target=%s, %r)" % (self.target_dtype, self.scaler)


def trainable_grads(params, fresh_only=False):
    """Every context's gradient of the parameters with ``grad_req != 'null'``, with owners;
    with ``fresh_only``, those backward wrote since the last step (what a step updates).

    Returns ``(grads, owner_names)`` of equal length; a parameter whose gradient is not
    allocated yet is left out.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize(ctx=[mx.cpu(0), mx.cpu(1)])
    >>> len(trainable_grads([p])[0])
    2
    """
    grads, owners = [], []
    for param in params:
        if param.grad_req == "null" or mxp.ParamView(param).grad is None:
            continue
        for data, grad in zip(param.list_data(), param.list_grad()):
            if fresh_only and not mxp.has_fresh_grad(data):
                continue
            grads.append(grad)
            owners.append(param.name)
    return grads, owners
