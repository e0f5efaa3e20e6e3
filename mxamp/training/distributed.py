"""Keep loss scaling identical on every worker of MXNet's ``dist_*`` kvstores and of Horovod.

Why every worker already takes the same skip decision: with ``update_on_kvstore=False`` (which
:func:`mxamp.amp.init_trainer` forces) ``Trainer._update`` runs the overflow check on the
gradients *after* they were summed over all workers, and a sum holding an Inf or NaN is itself
non-finite (``inf + x = inf``, ``inf + -inf = nan``). Horovod's ``DistributedTrainer`` sums in
``_allreduce_grads`` before ``_update`` the same way. Same verdict, same scaler update, same scale.

What this module adds:

- :func:`make_updates_skippable`: the kvstore policy that :func:`mxamp.amp.init_trainer` applies,
  ``update_on_kvstore=False``, so that every update runs in ``Trainer._update``, after the check.
- :func:`before_first_step` makes the start deterministic. MXNet's Trainer sends the initial
  weights to the kvstore lazily inside the first ``step``; on ``dist_sync`` that broadcast races
  with the first gradient push, and workers can end up with different weights. mxamp calls it
  from the first ``amp.scale_loss``; call it yourself after ``net.initialize`` (and a forward
  pass, for deferred shapes) to also make the first forward pass use the broadcast weights.
- :func:`gather` / :func:`any_worker`: small collective reductions through the trainer's own
  kvstore (or Horovod), e.g. for a global flag.
- :func:`check_scaler_in_sync`: raises when the workers' loss scalers disagree (after a resume
  from a checkpoint, for instance).

Every function here is collective on a distributed trainer: all workers must call it at the
same point of the program, or they wait for each other forever.
"""
import logging
import sys
import warnings

import numpy as np
import mxnet as mx

from mxamp.backend import env
from mxamp.errors import AmpArgumentError
from mxamp.backend.mxnet_private import KVStoreView, ParamView, TrainerView, share_update_counts

__all__ = ["backend", "before_first_step", "gather", "any_worker", "check_scaler_in_sync"]

LOG = logging.getLogger("mxamp")

#: The Trainer uses keys 0..len(params)-1; mxamp's own reductions use keys from here on, one per
#: array shape (a kvstore key has a fixed shape).
RESERVED_KEY_BASE = 1 << 30


def _horovod_module(trainer):
    """``horovod.mxnet`` if ``trainer`` is a Horovod DistributedTrainer, else None."""
    hvd = sys.modules.get("horovod.mxnet")  # never import Horovod ourselves: it is optional
    if hvd is not None and isinstance(trainer, hvd.DistributedTrainer):
        return hvd
    return None


def kvstore_kind(trainer):
    """The kvstore ``trainer`` was created with, as a type string (``''`` for none).

    Read from the Trainer's arguments, so it is known before MXNet creates the kvstore.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
    >>> kvstore_kind(mx.gluon.Trainer([p], 'sgd', kvstore='device'))
    'device'
    """
    store = TrainerView(trainer).kvstore_params["kvstore"]
    if isinstance(store, str):
        return store
    return getattr(store, "type", "") or ""


def backend(trainer):
    """How ``trainer`` shares gradients between processes: ``'horovod'``, ``'kvstore'`` or None.

    ``'kvstore'`` means one of MXNet's ``dist_*`` kvstores; None means a single process.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
    >>> backend(mx.gluon.Trainer([p], 'sgd', kvstore='device')) is None
    True
    """
    if _horovod_module(trainer) is not None:
        return "horovod"
    if "dist" in kvstore_kind(trainer):
        return "kvstore"
    return None


# Not merged with before_first_step: this keeps overflowed steps skippable, that aligns weights.
def make_updates_skippable(trainer):
    """Make sure ``Trainer._update`` (and so the overflow check) runs before any update.

    The kvstore policy of :func:`mxamp.amp.init_trainer`: ``update_on_kvstore=False``. An
    explicit True is overridden with a warning; a local kvstore already updating is moved off
    (with its optimizer states); an ``async`` or sparse setup, or a distributed kvstore already
    updating on the servers, raises RuntimeError.
    """
    view = TrainerView(trainer)
    config = view.kvstore_params
    store = config.get("kvstore")
    kind = kvstore_kind(trainer)
    if "async" in kind:
        raise RuntimeError("amp.init_trainer: kvstore %r applies updates on the servers as "
                           "they arrive, so an overflowed step cannot be skipped; use "
                           "dist_sync or dist_device_sync" % (kind,))
    if view.contains_sparse_weight or ("dist" in kind and view.contains_sparse_grad):
        raise RuntimeError("amp.init_trainer: sparse weights (or sparse gradients on a dist "
                           "kvstore) force update_on_kvstore=True, where an overflowed step "
                           "cannot be skipped")
    if not view.kv_initialized:
        if config.get("update_on_kvstore"):
            # stacklevel 3: the warning points at the user's call of init_trainer
            warnings.warn("amp.init_trainer: update_on_kvstore=True is overridden to False: "
                          "updates inside the kvstore run before the overflow check and "
                          "could not be skipped", UserWarning, stacklevel=3)
        elif store is not None:
            LOG.info("mxamp: trainer set to update_on_kvstore=False so that overflowed "
                     "steps can be skipped before any update")
        config["update_on_kvstore"] = False
        return
    if not (view.kvstore and view.update_on_kvstore):
        return
    if "dist" in view.kvstore.type or not isinstance(store, str):
        raise RuntimeError(
            "amp.init_trainer: this trainer's kvstore already updates the weights itself "
            "(update_on_kvstore=True), so overflowed steps could not be skipped. Create the "
            "Trainer with update_on_kvstore=False, or call amp.init_trainer before the first "
            "step / load_states")
    _move_updates_off_kvstore(view)


def _move_updates_off_kvstore(view):
    """Local kvstore already running the optimizer: move its states to the trainer."""
    states = KVStoreView(view.kvstore).updater.get_states(dump_optimizer=False)
    for updater in view.updaters:
        updater.set_states(states)
        updater.optimizer = view.optimizer
    # each context's updater counts its own updates: all continue from the kvstore's count
    share_update_counts(view.optimizer, sorted({c.device_id for c in view.contexts}))
    view.kvstore_params["update_on_kvstore"] = False
    view.reset_kvstore()
    LOG.info("mxamp: moved optimizer states out of the %r kvstore; the trainer now updates "
             "locally (update_on_kvstore=False) so overflowed steps can be skipped",
             view.kvstore_params["kvstore"])


def started(trainer):
    """True once :func:`before_first_step` has completed for ``trainer``.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
    >>> t = mx.gluon.Trainer([p], 'sgd', kvstore=None)
    >>> started(t), (before_first_step(t), started(t))[1]
    (False, True)
    """
    return getattr(trainer, "_mxamp_started", False)


def _uninitialized(trainer):
    return [p.name for p in TrainerView(trainer).params if ParamView(p).deferred_init]


# Not merged with make_updates_skippable: this aligns the workers' weights, that keeps skips.
def before_first_step(trainer, batch_size=None):
    """Broadcast the initial weights and wait for every worker before any gradient is pushed.

    On a ``dist_*`` kvstore: creates the trainer's kvstore, sends rank 0's parameters to the
    servers, pulls them into every worker, waits for the pulls to land, then passes a kvstore
    barrier. With Horovod: broadcasts the parameters from rank 0. Otherwise it does nothing.
    Idempotent: later calls return at once. Collective: every worker must call it.

    ``batch_size`` is needed only when the optimizer runs on the servers
    (``update_on_kvstore=True``, which ``amp.init_trainer`` turns off): the servers receive
    the optimizer, with its ``rescale_grad = 1 / batch_size``, when the kvstore is created.

    >>> trainer = mx.gluon.Trainer(params, 'sgd', kvstore='dist_sync')  # doctest: +SKIP
    >>> net(first_batch)               # deferred shapes resolved        # doctest: +SKIP
    >>> before_first_step(trainer)     # every worker holds rank 0's weights  # doctest: +SKIP
    """
    if started(trainer):
        return
    kind = backend(trainer)
    if kind is None:
        trainer._mxamp_started = True  # pylint: disable=protected-access
        return
    pending = _uninitialized(trainer)
    if pending:
        raise RuntimeError(
            "before_first_step: parameters %s have no shape yet (deferred initialization); "
            "run one forward pass before calling it" % ", ".join(pending))
    if kind == "horovod":
        _broadcast_through_horovod(trainer)
    else:
        _broadcast_through_kvstore(trainer, batch_size)
    trainer._mxamp_started = True  # pylint: disable=protected-access
    LOG.info("mxamp: initial parameters broadcast (%s); all workers start from rank 0's", kind)


def _broadcast_through_horovod(trainer):
    params = TrainerView(trainer).params
    _horovod_module(trainer).broadcast_parameters({p.name: p for p in params}, root_rank=0,
                                                  prefix="mxamp.start.")
    for param in params:  # Horovod fills the first context only
        if len(param.list_ctx()) > 1:
            param.set_data(param.data())


def _broadcast_through_kvstore(trainer, batch_size):
    view = TrainerView(trainer)
    if not view.kv_initialized:
        if _servers_would_update(trainer) and batch_size is None:
            raise AmpArgumentError(
                "before_first_step: this trainer runs the optimizer on the kvstore servers, "
                "which receive it (with rescale_grad = 1/batch_size) now; pass batch_size=, "
                "or create the Trainer with update_on_kvstore=False")
        if batch_size is not None:
            view.optimizer.rescale_grad = view.scale / batch_size
        view.init_kvstore()
    if view.params_to_init:
        view.init_params()
    # The broadcast's pulls run asynchronously in MXNet's engine and a kvstore barrier does not
    # wait for them: wait here, or a fast worker's first push can overtake a slow worker's pull.
    for param in view.params:
        for data in param.list_data():
            data.wait_to_read()
    KVStoreView(view.kvstore).barrier()


def _servers_would_update(trainer):
    """Predict MXNet's choice of update_on_kvstore for a dist kvstore before it is created."""
    requested = TrainerView(trainer).kvstore_params["update_on_kvstore"]
    if "async" in kvstore_kind(trainer):
        return True
    if requested is not None:
        return bool(requested)
    return env.flag("MXNET_UPDATE_ON_KVSTORE")  # MXNet's own default: on


def _allreduce_sum(array, trainer):
    """Sum a float64 NumPy array over all workers (collective)."""
    hvd = _horovod_module(trainer)
    if hvd is not None:
        total = hvd.allreduce(mx.nd.array(array, dtype="float64"), op=hvd.Sum,
                              name="mxamp.gather.%d" % array.size)
        return total.asnumpy()
    before_first_step(trainer)
    view = TrainerView(trainer)
    store = view.kvstore
    if view.update_on_kvstore:
        raise RuntimeError(
            "this trainer's kvstore runs the optimizer on the servers (update_on_kvstore=True), "
            "which would apply it to mxamp's reductions too; create the Trainer with "
            "update_on_kvstore=False or call amp.init_trainer before the first step")
    # The registry lives on the kvstore: trainers sharing one kvstore share its keys.
    keys = store.__dict__.setdefault("_mxamp_reserved_keys", {})
    key = keys.get(array.shape)
    value = mx.nd.array(array, dtype="float64")
    if key is None:
        key = RESERVED_KEY_BASE + len(keys)
        store.init(key, mx.nd.zeros(array.shape, dtype="float64"))
        keys[array.shape] = key
    out = mx.nd.zeros(array.shape, dtype="float64")
    store.pushpull(key, value, out=out)
    return out.asnumpy()


def gather(values, trainer):
    """Return every worker's ``values`` (a list of floats), one row per rank (collective).

    Exact: each worker fills only its own row of a zero matrix and the rows are summed.
    A single-process trainer gets ``[values]`` back.

    >>> gather([scale, step], trainer)                 # on 2 workers  # doctest: +SKIP
    [[1024.0, 3.0], [1024.0, 3.0]]
    """
    row = [float(v) for v in values]
    kind = backend(trainer)
    if kind is None:
        return [row]
    if kind == "horovod":
        hvd = _horovod_module(trainer)
        rank, size = hvd.rank(), hvd.size()
    else:
        before_first_step(trainer)
        store = TrainerView(trainer).kvstore
        rank, size = store.rank, store.num_workers
    table = np.zeros((size, len(row)), dtype=np.float64)
    table[rank] = row
    return _allreduce_sum(table, trainer).tolist()


def any_worker(flag, trainer):
    """True on every worker if ``flag`` is true on at least one (collective).

    >>> if any_worker(loss_is_nan, trainer): stop_training()   # doctest: +SKIP
    """
    return any(row[0] for row in gather([1.0 if flag else 0.0], trainer))


def check_scaler_in_sync(trainer):
    """Raise RuntimeError unless every worker's loss scaler holds the same state (collective).

    Compares the scale and every counter of ``trainer._amp_loss_scaler``. Useful after loading
    a checkpoint: every worker must load the same scaler state. Returns the state compared.

    >>> check_scaler_in_sync(trainer)['scale']         # doctest: +SKIP
    65536.0
    """
    hook = TrainerView(trainer).amp_scaler_or_none()
    if hook is None or not hasattr(hook, "state_dict"):
        raise RuntimeError("check_scaler_in_sync: call amp.init_trainer(trainer) first")
    state = hook.state_dict()["scaler"]
    names = sorted(k for k, v in state.items()
                   if isinstance(v, (int, float, bool)) and v is not None)
    rows = gather([float(state[k]) for k in names], trainer)
    differing = [name for i, name in enumerate(names) if len({row[i] for row in rows}) > 1]
    if differing:
        detail = "; ".join("%s: %s" % (name, [row[names.index(name)] for row in rows])
                           for name in differing)
        raise RuntimeError("loss scalers differ between workers (per rank) - %s. Every worker "
                           "must load the same checkpoint" % detail)
    return {name: state[name] for name in names}
