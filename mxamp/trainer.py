"""Gluon Trainer integration: ``init_trainer``, ``scale_loss``, ``unscale`` and a fused norm.

How a step flows (the reference's design, kept because MXNet's Trainer expects it):

1. ``scale_loss`` yields ``loss * scale`` and sets ``trainer._scale = original / scale``, so
   the optimizer's ``rescale_grad`` undoes the scale for free inside the update kernel.
2. ``Trainer._update`` calls ``trainer._amp_loss_scaler.has_overflow(params)`` (a
   :class:`~mxamp.trainer_scaler.TrainerScaler`) and returns before touching any weight,
   optimizer state or update counter when a gradient holds Inf/NaN.
3. The scaler adapts; the new scale is used by the very next ``scale_loss``.

Also arranged by ``init_trainer``: ``update_on_kvstore=False`` (an update inside the kvstore
runs before the check and cannot be skipped; an explicit True is overridden with a warning, a
kvstore already updating is moved off when local, refused when distributed or async);
``save_states``/``load_states`` carry the scaler state in the same file (either order of
``load_states`` and ``init_trainer`` resumes it); bfloat16 parameters get float32 master
weights (:mod:`mxamp.optimizers`). Diagnostics: :func:`loss_scaler`.

``init_trainer`` keywords (all optional)::

    target_dtype     'float16' | 'bfloat16'. Default: amp.init's target, else 'bfloat16' when a
                     parameter is bfloat16, else 'float16'.
    init_scale       first loss scale. Default 2**16 (float16), 1.0 (bfloat16).
    dynamic          adapt the scale. Default True (float16), False (bfloat16).
    growth_factor    2.0     scale *= growth_factor after growth_interval clean steps.
    growth_interval  2000    clean steps in a row before growing.
    backoff_factor   0.5     scale *= backoff_factor on overflow.
    min_scale        1.0     lower bound; overflow there keeps skipping and warns once.
    max_scale        2**24   upper bound.
    hysteresis       1       back off on the N-th overflow since the last scale change.
    skip_nonfinite   True    skip steps with Inf/NaN gradients. False (static scale only)
                             removes the check entirely.

>>> from mxamp import amp                                     # doctest: +SKIP
>>> amp.init_trainer(trainer)                                 # doctest: +SKIP
>>> with amp.scale_loss(loss, trainer) as scaled:             # doctest: +SKIP
...     mx.autograd.backward(scaled)
>>> trainer.step(batch_size)                                  # doctest: +SKIP
"""
# This module hooks into the Trainer's private state by design (as MXNet's own AMP does).
# pylint: disable=protected-access
import contextlib
import functools
import logging
import math
import threading
import warnings
import weakref

import mxnet as mx
from mxnet.gluon import Trainer
from mxnet.optimizer import Optimizer

from . import distributed, dtypes, optimizers, patching
from .scaler import LossScaler
from .trainer_scaler import TrainerScaler, trainable_grads

__all__ = ["init_trainer", "scale_loss", "unscale", "global_norm_and_overflow",
           "loss_scaler", "current_scaler"]

LOG = logging.getLogger("mxamp")

_DEFAULTS = {"float16": {"init_scale": 2.0 ** 16, "dynamic": True},
             "bfloat16": {"init_scale": 1.0, "dynamic": False}}
_SCALER_OPTIONS = ("init_scale", "dynamic", "growth_factor", "growth_interval",
                   "backoff_factor", "min_scale", "max_scale", "hysteresis")
_OPTIONS = _SCALER_OPTIONS + ("target_dtype", "skip_nonfinite")
# Where the scaler state rides inside trainer.save_states' file: an attribute of the pickled
# optimizer, so the file stays loadable by plain MXNet and load_states brings it back.
_STATE_ATTR = "_mxamp_loss_scaler_state"

_ACTIVE = threading.local()                 # stack of trainers inside scale_loss, per thread
_INITIALISED = []                           # weakrefs, in init_trainer order
_REGISTRY_LOCK = threading.Lock()


def _check_trainer(obj, what):
    if isinstance(obj, Trainer):
        return obj
    if isinstance(obj, Optimizer):
        raise TypeError("%s needs the gluon.Trainer that owns this %s optimizer, not the "
                        "optimizer itself" % (what, type(obj).__name__))
    raise TypeError("%s expects a mxnet.gluon.Trainer, got %s" % (what, type(obj).__name__))


def _hook(trainer, what):
    hook = getattr(trainer, "_amp_loss_scaler", None)
    if not isinstance(hook, TrainerScaler):
        raise RuntimeError("%s: this Trainer has no mxamp loss scaler; call "
                           "amp.init_trainer(trainer) once after creating it" % what)
    return hook


def init_trainer(optimizer_or_trainer, **options):
    """Attach loss scaling and skip-on-overflow to a Gluon Trainer; return its scaler.

    Keywords are listed in the module docstring. Calling it again with no keyword returns
    the existing scaler unchanged; with keywords it installs a fresh scaler with them. The
    learning rate is never changed. When the trainer would update on the kvstore (where an
    overflowed step cannot be skipped), it is switched to ``update_on_kvstore=False``.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
    >>> t = mx.gluon.Trainer([p], 'sgd', {'learning_rate': 0.1}, kvstore=None)
    >>> init_trainer(t, init_scale=1024.0).loss_scale
    1024.0
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.init_trainer")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError("amp.init_trainer got unknown keyword(s) %s; valid: %s"
                        % (", ".join(unknown), ", ".join(_OPTIONS)))
    existing = getattr(trainer, "_amp_loss_scaler", None)
    if isinstance(existing, TrainerScaler) and not options:
        return existing
    target = _resolve_target(trainer, options.pop("target_dtype", None))
    scaler_options = dict(_DEFAULTS[target])
    scaler_options.update({k: options[k] for k in _SCALER_OPTIONS if k in options})
    hook = TrainerScaler(LossScaler(**scaler_options), target,
                         options.get("skip_nonfinite", True))
    _configure_kvstore(trainer)
    if not hasattr(trainer, "_amp_original_scale"):
        # Kept from the first call: a second call must not fold the loss scale into it.
        trainer._amp_original_scale = trainer._scale
    saved = trainer._optimizer.__dict__.pop(_STATE_ATTR, None)  # load_states ran first
    if saved is not None:
        hook.load_state_dict(saved)
        LOG.info("mxamp: resumed loss scaler from the loaded trainer states: %r", hook)
    trainer._amp_loss_scaler = hook
    _wrap_checkpointing(trainer)
    optimizers.install_master_weights(trainer)
    with _REGISTRY_LOCK:
        _INITIALISED[:] = [r for r in _INITIALISED if r() is not None and r() is not trainer]
        _INITIALISED.append(weakref.ref(trainer))
    return hook


def _resolve_target(trainer, explicit):
    if explicit is not None:
        return dtypes.normalize(explicit)
    active = patching.target_dtype()
    if active:
        return active
    if any(dtypes.name_of(p.dtype) == "bfloat16" for p in trainer._params):
        return "bfloat16"
    return "float16"


def _configure_kvstore(trainer):
    """Make sure ``Trainer._update`` (and so the overflow check) runs before any update."""
    config = trainer._kvstore_params
    store = config.get("kvstore")
    kind = store if isinstance(store, str) else getattr(store, "type", "")
    if "async" in str(kind):
        raise RuntimeError("amp.init_trainer: kvstore %r applies updates on the servers as "
                           "they arrive, so an overflowed step cannot be skipped; use "
                           "dist_sync or dist_device_sync" % (kind,))
    if trainer._contains_sparse_weight or (
            "dist" in str(kind) and trainer._contains_sparse_grad):
        raise RuntimeError("amp.init_trainer: sparse weights (or sparse gradients on a dist "
                           "kvstore) force update_on_kvstore=True, where an overflowed step "
                           "cannot be skipped")
    if not trainer._kv_initialized:
        if config.get("update_on_kvstore"):
            warnings.warn("amp.init_trainer: update_on_kvstore=True is overridden to False: "
                          "updates inside the kvstore run before the overflow check and "
                          "could not be skipped", UserWarning, stacklevel=3)
        elif store is not None:
            LOG.info("mxamp: trainer set to update_on_kvstore=False so that overflowed "
                     "steps can be skipped before any update")
        config["update_on_kvstore"] = False
        return
    if not (trainer._kvstore and trainer._update_on_kvstore):
        return
    if "dist" in trainer._kvstore.type or not isinstance(store, str):
        raise RuntimeError(
            "amp.init_trainer: this trainer's kvstore already updates the weights itself "
            "(update_on_kvstore=True), so overflowed steps could not be skipped. Create the "
            "Trainer with update_on_kvstore=False, or call amp.init_trainer before the first "
            "step / load_states")
    _move_updates_off_kvstore(trainer)


def _move_updates_off_kvstore(trainer):
    """Local kvstore already running the optimizer: move its states to the trainer."""
  
    states = trainer._kvstore._updater.get_states(dump_optimizer=False)
    for updater in trainer._updaters:
        updater.set_states(states)
        updater.optimizer = trainer._optimizer
    trainer._kvstore_params["update_on_kvstore"] = False
    trainer._reset_kvstore()
    LOG.info("mxamp: moved optimizer states out of the %r kvstore; the trainer now updates "
             "locally (update_on_kvstore=False) so overflowed steps can be skipped",
             trainer._kvstore_params["kvstore"])


def _wrap_checkpointing(trainer):
    """Wrap this trainer's save_states/load_states so they carry the scaler state."""
    if getattr(trainer, "_mxamp_checkpointing", False):
        return
    # Class functions and a weak reference: no reference cycle through instance attributes.
    save, load = type(trainer).save_states, type(trainer).load_states
    owner = weakref.ref(trainer)

    @functools.wraps(save)
    def save_states(fname):
        this = owner()
        optimizer = this._updaters[0].optimizer  # the object that gets pickled
        setattr(optimizer, _STATE_ATTR, this._amp_loss_scaler.state_dict())
        try:
            save(this, fname)
        finally:
            optimizer.__dict__.pop(_STATE_ATTR, None)

    @functools.wraps(load)
    def load_states(fname):
        this = owner()
        load(this, fname)
        state = this._optimizer.__dict__.pop(_STATE_ATTR, None)
        for updater in this._updaters:
            updater.optimizer.__dict__.pop(_STATE_ATTR, None)
        if state is None:
            LOG.info("mxamp: %s holds no loss-scaler state; keeping the current one", fname)
        else:
            this._amp_loss_scaler.load_state_dict(state)

    trainer.save_states, trainer.load_states = save_states, load_states
    trainer._mxamp_checkpointing = True


def _before_first_step(trainer, lock):
    """THE call site of ``mxamp.distributed.before_first_step(trainer)``.

    Runs once per trainer, at its first ``scale_loss`` (parameters are initialised by then,
    and no gradient has been pushed yet).
    """
    with lock:
        if getattr(trainer, "_mxamp_first_step_done", False):
            return
        with mx.autograd.pause():
            distributed.before_first_step(trainer)
        trainer._mxamp_first_step_done = True  # only once it succeeded


def _check_loss(loss):
    if not isinstance(loss, mx.nd.NDArray):  # mx.np.ndarray is a subclass
        raise TypeError("scale_loss expects an NDArray, an mx.np.ndarray or a list/tuple of "
                        "them, got %s" % type(loss).__name__)
    return loss


@contextlib.contextmanager
def scale_loss(loss, optimizer_or_trainer):
    """Context manager yielding the loss (or list of losses) multiplied by the loss scale.

    Call ``autograd.backward`` on what it yields, then ``trainer.step`` as usual; the
    gradients are unscaled inside the optimizer at no cost. With a scale of 1.0 (bfloat16's
    default) the loss itself is yielded, untouched. Thread-safe; each trainer has its own scale.

    >>> with scale_loss(loss, trainer) as scaled:              # doctest: +SKIP
    ...     mx.autograd.backward(scaled)
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.scale_loss")
    hook = _hook(trainer, "amp.scale_loss")
    items = [_check_loss(x) for x in loss] if isinstance(loss, (list, tuple)) else None
    if items is None:
        _check_loss(loss)
    _before_first_step(trainer, hook.lock)
    with hook.lock:
        scale = hook.loss_scale
        trainer._scale = trainer._amp_original_scale / scale
    if scale == 1.0:
        result = loss if items is None else items
    else:
        result = loss * scale if items is None else [x * scale for x in items]
    stack = _ACTIVE.__dict__.setdefault("stack", [])
    stack.append(trainer)
    try:
        yield result
    finally:
        stack.pop()


def unscale(optimizer_or_trainer):
    """Divide the gradients by this step's loss scale, in place, once.

    Use it before reading or clipping gradients (``gluon.utils.clip_global_norm``).
    ``trainer._scale`` returns to its original value, so the optimizer does not unscale
    again. A second call in the same step (or a call with scale 1.0) is a no-op.

    >>> amp.unscale(trainer)                                   # doctest: +SKIP
    >>> gluon.utils.clip_global_norm(grads, 1.0)               # doctest: +SKIP
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.unscale")
    hook = _hook(trainer, "amp.unscale")
    with hook.lock:
        factor = trainer._scale / trainer._amp_original_scale
        if factor == 1.0:
            return
        with mx.autograd.pause():
            for grad in trainable_grads(trainer._params)[0]:
                grad *= factor
        trainer._scale = trainer._amp_original_scale


def global_norm_and_overflow(optimizer_or_trainer):
    """Return ``(global L2 norm of the true gradients, has_nonfinite)`` from one pass.

    "True" means divided by the loss scale when :func:`unscale` has not run yet. The norm is
    that of the first context's gradients (after ``allreduce_grads`` every context holds the
    same sum); the overflow flag covers every context. One pass, one host sync.

    >>> norm, overflowed = global_norm_and_overflow(trainer)   # doctest: +SKIP
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.global_norm_and_overflow")
    hook = _hook(trainer, "amp.global_norm_and_overflow")
    with hook.lock:
        grads = trainable_grads(trainer._params)[0]
        report = hook.checker.check(grads, squares_for_all=True)
        first = trainer._contexts[0]
        squares = [sq for g, sq in zip(grads, report.sum_squares) if g.context == first]
        norm = float("nan") if report.has_nonfinite else math.sqrt(sum(squares))
        factor = trainer._scale / trainer._amp_original_scale
    return norm * factor, report.has_nonfinite


def loss_scaler(optimizer_or_trainer):
    """The trainer's :class:`~mxamp.trainer_scaler.TrainerScaler`: scale and diagnostics.

    ``.loss_scale``, ``.skipped_steps``, ``.nonfinite_params`` (parameters whose gradient
    held Inf/NaN in the last skipped step), ``.scale_history``, ``.state_dict()``.

    >>> loss_scaler(trainer).nonfinite_params                 # doctest: +SKIP
    ['dense0_weight']
    """
    trainer = _check_trainer(optimizer_or_trainer, "amp.loss_scaler")
    return _hook(trainer, "amp.loss_scaler")


def current_scaler():
    """The :class:`TrainerScaler` loss-output ops should follow, or None.

    That is the trainer whose ``scale_loss`` is active in this thread, else the trainer most
    recently passed to ``init_trainer`` that is still alive.

    >>> current_scaler() is None or current_scaler().loss_scale > 0
    True
    """
    stack = getattr(_ACTIVE, "stack", None)
    if stack:
        return stack[-1]._amp_loss_scaler
    with _REGISTRY_LOCK:
        for ref in reversed(_INITIALISED):
            trainer = ref()
            if trainer is not None:
                return getattr(trainer, "_amp_loss_scaler", None)
    return None
