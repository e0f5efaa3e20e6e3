"""Gluon Trainer integration: ``init_trainer``, ``scale_loss``, ``unscale`` and a fused norm.

How a step flows (the reference's design, kept because MXNet's Trainer expects it):

1. ``scale_loss`` yields ``loss * scale`` and sets the trainer's private ``_scale`` to
   ``original / scale``, so the optimizer's ``rescale_grad`` undoes the scale for free inside
   the update kernel.
2. ``Trainer._update`` calls ``_amp_loss_scaler.has_overflow(params)`` (a
   :class:`~mxamp.training.trainer_scaler.TrainerScaler`) and returns before touching any weight,
   optimizer state or update counter when a gradient holds Inf/NaN.
3. The scaler adapts; the new scale is used by the very next ``scale_loss``.

Also arranged by ``init_trainer``: ``update_on_kvstore=False`` (an update inside the kvstore
runs before the check and cannot be skipped; an explicit True is overridden with a warning, a
kvstore already updating is moved off when local, refused when distributed or async: the kvstore
policy, :func:`mxamp.training.distributed.make_updates_skippable`);
``save_states``/``load_states`` carry the scaler state in the same file (either order of
``load_states`` and ``init_trainer`` resumes it); bfloat16 parameters get float32 master
weights (:mod:`mxamp.training.optimizers`). Diagnostics: :func:`loss_scaler`. The trainer's private
attributes are reached through :class:`mxamp.backend.mxnet_private.TrainerView`.

>>> import mxnet as mx
>>> from mxamp import amp
>>> net = mx.gluon.nn.Dense(1, in_units=2); net.initialize(mx.init.One())
>>> trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5},
...                            kvstore=None)
>>> scaler = amp.init_trainer(trainer, init_scale=4.0)
>>> with mx.autograd.record():
...     loss = net(mx.nd.ones((1, 2))).sum()
...     with amp.scale_loss(loss, trainer) as scaled:
...         mx.autograd.backward(scaled)
>>> trainer.step(1)                  # the gradient (1, 1) is unscaled inside the update
>>> net.weight.data().asnumpy().tolist()
[[0.5, 0.5]]
"""
# It hooks into the Trainer's private state by design (as MXNet's own AMP does), through
# mxamp.backend.mxnet_private.TrainerView; only mxamp's own marker attribute is set directly.
import contextlib
import dataclasses
import functools
import logging
import math
import weakref

import mxnet as mx
from mxnet.gluon import Trainer
from mxnet.optimizer import Optimizer

from mxamp import dtypes
from mxamp.training import distributed, optimizers
from mxamp.errors import AmpArgumentError
from mxamp.backend import heap
from mxamp.backend.mxnet_private import TrainerView
from mxamp.training.scaler import DEFAULTS, TARGET_DEFAULTS, LossScaler, ScalerConfig
from mxamp.runtime.state import STATE
from mxamp.training.trainer_scaler import TrainerScaler, trainable_grads

__all__ = ["init_trainer", "scale_loss", "unscale", "global_norm_and_overflow",
           "loss_scaler", "TrainerConfig"]

LOG = logging.getLogger("mxamp")

# Where the scaler state rides inside trainer.save_states' file: an attribute of the pickled
# optimizer, so the file stays loadable by plain MXNet and load_states brings it back.
_STATE_ATTR = "_mxamp_loss_scaler_state"


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """What ``init_trainer`` was asked for: the target, the scaler's options, the check.

    ``None`` for ``target_dtype``, ``init_scale`` or ``dynamic`` means "the target's default"
    (:data:`mxamp.training.scaler.TARGET_DEFAULTS`); :meth:`resolve` fills them in.

    >>> TrainerConfig(target_dtype='bfloat16').resolve('bfloat16').scaler.init_scale
    1.0
    """

    target_dtype: str = None
    init_scale: float = None
    dynamic: bool = None
    growth_factor: float = DEFAULTS.growth_factor
    growth_interval: int = DEFAULTS.growth_interval
    backoff_factor: float = DEFAULTS.backoff_factor
    min_scale: float = DEFAULTS.min_scale
    max_scale: float = DEFAULTS.max_scale
    hysteresis: int = DEFAULTS.hysteresis
    skip_nonfinite: bool = True

    @property
    def is_default(self):
        """True when nothing was asked for (every field at its default)."""
        return self == TrainerConfig()

    def resolve(self, target):
        """The :class:`ResolvedConfig` for ``target`` (its defaults where ``None`` was given)."""
        base = TARGET_DEFAULTS[target]
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ScalerConfig)}
        fields = {k: getattr(base, k) if v is None else v for k, v in fields.items()}
        return ResolvedConfig(target, ScalerConfig(**fields), bool(self.skip_nonfinite))


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """A :class:`TrainerConfig` with every default filled in for its target."""

    target: str
    scaler: ScalerConfig
    skip_nonfinite: bool


def _check_trainer(obj, what):
    if isinstance(obj, Trainer):
        return obj
    if isinstance(obj, Optimizer):
        raise AmpArgumentError("%s needs the gluon.Trainer that owns this %s optimizer, not the "
                               "optimizer itself" % (what, type(obj).__name__))
    raise AmpArgumentError("%s expects a mxnet.gluon.Trainer, got %s"
                           % (what, type(obj).__name__))


def _hook(trainer, what):
    hook = TrainerView(trainer).amp_scaler_or_none()
    if not isinstance(hook, TrainerScaler):
        raise RuntimeError("%s: this Trainer has no mxamp loss scaler; call "
                           "amp.init_trainer(trainer) once after creating it" % what)
    return hook


def init_trainer(optimizer_or_trainer, *, target_dtype=None, init_scale=None, dynamic=None,
                 growth_factor=DEFAULTS.growth_factor, growth_interval=DEFAULTS.growth_interval,
                 backoff_factor=DEFAULTS.backoff_factor, min_scale=DEFAULTS.min_scale,
                 max_scale=DEFAULTS.max_scale, hysteresis=DEFAULTS.hysteresis,
                 skip_nonfinite=True, **unknown):
    """Attach loss scaling and skip-on-overflow to a Gluon Trainer; return its scaler.

    Parameters (all keyword-only; see :class:`mxamp.training.scaler.ScalerConfig` for the scaler's)
    ----------
    target_dtype : 'float16' | 'bfloat16', default None
        Selects the defaults of ``init_scale`` and ``dynamic``. None: ``amp.init``'s target,
        else bfloat16 when a parameter is bfloat16, else float16.
    init_scale : float, default None
        First loss scale. None: 2**16 for float16, 1.0 for bfloat16.
    dynamic : bool, default None
        Adapt the scale. None: True for float16, False for bfloat16 (its scale stays 1.0).
    growth_factor, growth_interval, backoff_factor, min_scale, max_scale, hysteresis
        The scale grows by ``growth_factor`` after ``growth_interval`` clean steps, backs off by
        ``backoff_factor`` on the ``hysteresis``-th overflow, within [min_scale, max_scale].
    skip_nonfinite : bool, default True
        Skip steps with Inf/NaN gradients. False (static scale only) removes the check.

    Calling it again with every keyword at its default returns the existing scaler unchanged;
    any other value installs a fresh scaler with it. The learning rate is never changed.
    When the trainer would update on the kvstore (where an overflowed step cannot be skipped),
    it is switched to ``update_on_kvstore=False``. A bad argument raises
    :class:`~mxamp.errors.AmpArgumentError` and changes nothing.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
    >>> t = mx.gluon.Trainer([p], 'sgd', {'learning_rate': 0.1}, kvstore=None)
    >>> init_trainer(t, init_scale=1024.0).loss_scale
    1024.0
    >>> init_trainer(t) is init_trainer(t)            # defaults: the same scaler
    True
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.init_trainer")
    _reject_unknown_keywords(unknown)
    config = TrainerConfig(target_dtype=target_dtype, init_scale=init_scale, dynamic=dynamic,
                           growth_factor=growth_factor, growth_interval=growth_interval,
                           backoff_factor=backoff_factor, min_scale=min_scale,
                           max_scale=max_scale, hysteresis=hysteresis,
                           skip_nonfinite=skip_nonfinite)
    existing = TrainerView(trainer).amp_scaler_or_none()
    if isinstance(existing, TrainerScaler) and config.is_default:
        return existing
    hook = _new_scaler(trainer, config)  # before any change: a bad target_dtype raises here
    # Called from here, not from a step function: its warning's stacklevel points at our caller.
    distributed.make_updates_skippable(trainer)
    _attach_scaler(trainer, hook)
    _wrap_checkpointing(trainer)
    optimizers.install_master_weights(trainer)
    STATE.remember_trainer(trainer)
    return hook


def _reject_unknown_keywords(unknown):
    """Raise AmpArgumentError naming ``init_trainer``'s unknown keywords, if any."""
    if unknown:
        valid = ", ".join(f.name for f in dataclasses.fields(TrainerConfig))
        raise AmpArgumentError("amp.init_trainer got unknown keyword(s) %s; valid: %s"
                               % (", ".join(sorted(unknown)), valid))


def _new_scaler(trainer, config):
    """A fresh :class:`TrainerScaler` for ``config``, its defaults those of the trainer's target."""
    resolved = config.resolve(_resolve_target(trainer, config.target_dtype))
    return TrainerScaler(LossScaler.from_config(resolved.scaler), resolved.target,
                         resolved.skip_nonfinite)


def _attach_scaler(trainer, hook):
    """Install ``hook`` as the trainer's scaler, resuming the state a ``load_states`` left."""
    view = TrainerView(trainer)
    if not view.has_original_scale():
        # Kept from the first call: a second call must not fold the loss scale into it.
        view.amp_original_scale = view.scale
    saved = view.optimizer.__dict__.pop(_STATE_ATTR, None)  # load_states ran first
    if saved is not None:
        hook.load_state_dict(saved)
        LOG.info("mxamp: resumed loss scaler from the loaded trainer states: %r", hook)
    view.amp_loss_scaler = hook


def _resolve_target(trainer, explicit):
    if explicit is not None:
        return dtypes.normalize(explicit)
    if STATE.target:
        return STATE.target
    if any(dtypes.name_of(p.dtype) == "bfloat16" for p in TrainerView(trainer).params):
        return "bfloat16"
    return "float16"


def _wrap_checkpointing(trainer):
    """Wrap this trainer's save_states/load_states so they carry the scaler state."""
    if getattr(trainer, "_mxamp_checkpointing", False):
        return
    # Class functions and a weak reference: no reference cycle through instance attributes.
    save, load = type(trainer).save_states, type(trainer).load_states
    owner = weakref.ref(trainer)

    @functools.wraps(save)
    def save_states(fname):
        this = TrainerView(owner())
        optimizer = this.updaters[0].optimizer  # the object that gets pickled
        setattr(optimizer, _STATE_ATTR, this.amp_loss_scaler.state_dict())
        try:
            save(this.obj, fname)
        finally:
            optimizer.__dict__.pop(_STATE_ATTR, None)

    @functools.wraps(load)
    def load_states(fname):
        this = TrainerView(owner())
        load(this.obj, fname)
        state = this.optimizer.__dict__.pop(_STATE_ATTR, None)
        for updater in this.updaters:
            updater.optimizer.__dict__.pop(_STATE_ATTR, None)
        if state is None:
            LOG.info("mxamp: %s holds no loss-scaler state; keeping the current one", fname)
        else:
            this.amp_loss_scaler.load_state_dict(state)

    trainer.save_states, trainer.load_states = save_states, load_states
    trainer._mxamp_checkpointing = True  # pylint: disable=protected-access


def _before_first_step(trainer, lock):
    """THE call site of ``mxamp.training.distributed.before_first_step(trainer)``.

    Runs once per trainer, at its first ``scale_loss`` (parameters are initialised by then,
    and no gradient has been pushed yet).
    """
    with lock:
        if distributed.started(trainer):  # its own once-only flag: no second one kept here
            return
        # parameters cast (cast_model) after init_trainer get their masters now
        optimizers.install_master_weights(trainer)
        with mx.autograd.pause():
            distributed.before_first_step(trainer)


def _check_loss(loss):
    if not isinstance(loss, mx.nd.NDArray):  # mx.np.ndarray is a subclass
        raise AmpArgumentError("scale_loss expects an NDArray, an mx.np.ndarray or a "
                               "list/tuple of them, got %s" % type(loss).__name__)
    return loss


@contextlib.contextmanager
def scale_loss(loss, optimizer_or_trainer):
    """Context manager yielding the loss (or list of losses) multiplied by the loss scale.

    Call ``autograd.backward`` on what it yields, then ``trainer.step`` as usual; the
    gradients are unscaled inside the optimizer at no cost. With a scale of 1.0 (bfloat16's
    default) the loss itself is yielded, untouched. Thread-safe; each trainer has its own scale.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(1,)); p.initialize(mx.init.One())
    >>> t = mx.gluon.Trainer([p], 'sgd', kvstore=None); _ = init_trainer(t, init_scale=8.0)
    >>> with mx.autograd.record():
    ...     loss = p.data() * 3
    ...     with scale_loss(loss, t) as scaled:
    ...         mx.autograd.backward(scaled)
    >>> scaled.asscalar(), p.grad().asscalar()        # scaled loss and gradient
    (24.0, 24.0)
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.scale_loss")
    hook = _hook(trainer, "amp.scale_loss")
    items = [_check_loss(x) for x in loss] if isinstance(loss, (list, tuple)) else None
    if items is None:
        _check_loss(loss)
    # first, so that a forward's error that the wait for the losses raises leaves no state
    heap.trim_after_forward([loss] if items is None else items)   # while the peak grows
    _before_first_step(trainer, hook.lock)
    view = TrainerView(trainer)
    with hook.lock:
        scale = hook.loss_scale
        view.scale = view.amp_original_scale / scale
    if scale == 1.0:
        result = loss if items is None else items
    else:
        result = loss * scale if items is None else [x * scale for x in items]
    stack = STATE.trainer_stack()      # ends on the list it began with, even after a reset
    stack.append(trainer)
    try:
        yield result
    finally:
        stack.pop()


def unscale(optimizer_or_trainer):
    """Divide the gradients by this step's loss scale, in place, once.

    Use it before reading or clipping gradients (``gluon.utils.clip_global_norm``). The
    trainer's private ``_scale`` returns to its original value, so the optimizer does not
    unscale again. A second call in the same step (or a call with scale 1.0) is a no-op.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(1,)); p.initialize(mx.init.One())
    >>> t = mx.gluon.Trainer([p], 'sgd', kvstore=None); _ = init_trainer(t, init_scale=8.0)
    >>> with mx.autograd.record():
    ...     with scale_loss(p.data() * 3, t) as scaled:
    ...         mx.autograd.backward(scaled)
    >>> unscale(t); unscale(t); p.grad().asscalar()    # d(3w)/dw, once unscaled
    3.0
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.unscale")
    hook = _hook(trainer, "amp.unscale")
    view = TrainerView(trainer)
    with hook.lock:
        factor = view.scale / view.amp_original_scale
        if factor == 1.0:
            return
        with mx.autograd.pause():
            for grad in trainable_grads(view.params)[0]:
                grad *= factor
        view.scale = view.amp_original_scale


def global_norm_and_overflow(optimizer_or_trainer):
    """Return ``(global L2 norm of the true gradients, has_nonfinite)`` from one pass.

    "True" means divided by the loss scale when :func:`unscale` has not run yet. The norm is
    that of the first context's gradients (after ``allreduce_grads`` every context holds the
    same sum); the overflow flag covers every context. One pass, one host sync.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize(mx.init.One())
    >>> t = mx.gluon.Trainer([p], 'sgd', kvstore=None); _ = init_trainer(t, init_scale=2.0)
    >>> with mx.autograd.record():
    ...     with scale_loss((p.data() * mx.nd.array([3, 4])).sum(), t) as scaled:
    ...         mx.autograd.backward(scaled)
    >>> global_norm_and_overflow(t)
    (5.0, False)
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.global_norm_and_overflow")
    hook = _hook(trainer, "amp.global_norm_and_overflow")
    view = TrainerView(trainer)
    with hook.lock:
        grads = trainable_grads(view.params)[0]
        report = hook.checker.check(grads, squares_for_all=True)
        first = view.contexts[0]
        squares = [sq for g, sq in zip(grads, report.sum_squares) if g.context == first]
        norm = float("nan") if report.has_nonfinite else math.sqrt(sum(squares))
        factor = view.scale / view.amp_original_scale
    return norm * factor, report.has_nonfinite


def loss_scaler(optimizer_or_trainer):
    """The trainer's :class:`~mxamp.training.trainer_scaler.TrainerScaler`: scale and diagnostics.

    ``.loss_scale``, ``.skipped_steps``, ``.nonfinite_params`` (parameters whose gradient
    held Inf/NaN in the last skipped step), ``.scale_history``, ``.state_dict()``.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(1,)); p.initialize()
    >>> t = mx.gluon.Trainer([p], 'sgd', kvstore=None); _ = init_trainer(t)
    >>> loss_scaler(t).skipped_steps, loss_scaler(t).nonfinite_params
    (0, [])
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.loss_scaler")
    return _hook(trainer, "amp.loss_scaler")
