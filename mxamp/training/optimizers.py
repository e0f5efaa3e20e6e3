"""float32 master weights for bfloat16 parameters.

MXNet's optimizers keep a float32 master copy only for float16 weights
(``multi_precision=True``: ``mp_sgd_update``, ``multi_mp_sgd_mom_update``,
``mp_nag_mom_update``, ``mp_lamb_update_phase1/2``, ...), and every update kernel rejects
bfloat16 weights ("Unknown type enum 12"). For bfloat16 weights mxamp therefore always keeps
a float32 master copy, whatever ``multi_precision`` says (there is no working alternative):

1. the bfloat16 gradient is cast to float32, into the shared float32 workspace
   (:data:`mxamp.runtime.casting.WORKSPACE`), a chunk of small parameters or a slice of a
   large one at a time;
2. the optimizer's own float32 update runs on the master copy (aggregated
   ``multi_sgd_mom_update`` / ``multi_lamb_update`` etc. where MXNet aggregates);
3. the master copy is cast once into the bfloat16 weight.

Per parameter that is 2 B (weight) + 2 B (gradient) + 4 B (master) + the optimizer's float32
state (4 B for SGD momentum, 8 B for Adam): 12 B with momentum, float32's 4 + 4 + 4. The
workspace adds 4 B per element of the largest parameter, once, and at most 4 MB
(:data:`~mxamp.runtime.casting.SLICE_ELEMENTS` float32 values): a parameter larger than that
is updated a slice at a time. That needs an optimizer whose update is element by element
(:data:`ELEMENTWISE`); with others (LAMB, LARS, a custom one) the workspace grows to the
largest parameter.

float16 weights get MXNet's own float32 masters: :func:`install_master_weights` turns the
optimizer's ``multi_precision`` on (its ``mp_*`` update kernels, CUDA ones on a GPU), so that
O2 holds the same 12 B per parameter with either target. Without it, MXNet would update a
float16 weight in place, in float16, and keep float16 momentum (it warns: "Accumulating with
float16 in optimizer can lead to poor accuracy").

The master copy and the optimizer state live in the updater's ``states`` as
``(MASTER_TAG, master_fp32, inner_state)``, so ``trainer.save_states`` checkpoints them.

>>> import mxnet as mx
>>> from mxamp import dtypes
>>> p = mx.gluon.Parameter('w', shape=(2,), dtype=dtypes.BFLOAT16, init='zeros')
>>> p.initialize()
>>> t = mx.gluon.Trainer([p], 'sgd', {'learning_rate': 0.1}, kvstore=None)
>>> install_master_weights(t)
True
"""
import logging

from mxnet.optimizer import Updater

from mxamp import dtypes
from mxamp.runtime.casting import SLICE_ELEMENTS, WORKSPACE, cast, cast_into
from mxamp.backend.mxnet_private import (TrainerView, restore_update_count,
                                         set_optimizer_device, update_count)

_LOG = logging.getLogger("mxamp")

#: First element of a bfloat16 parameter's updater state (marks mxamp's layout).
MASTER_TAG = "mxamp-fp32-master"
#: MXNet's optimizers whose update of a weight is element by element and keeps no state
#: outside its arrays, so that updating a weight a slice at a time is the same update. Not
#: here: LAMB, LARS and LBSGD (norms of the whole weight), Nadam (its ``m_schedule``
#: advances on every call), DCASGD (tests an array's truth value), and any subclass.
ELEMENTWISE = frozenset(["SGD", "NAG", "Signum", "Adam", "AdaGrad", "RMSProp", "AdaDelta",
                         "Ftrl", "Adamax", "FTML", "SGLD"])


def updates_elementwise(optimizer):
    """True for an optimizer of MXNet's own :data:`ELEMENTWISE` classes (not a subclass).

    >>> import mxnet as mx
    >>> updates_elementwise(mx.optimizer.Adam()), updates_elementwise(mx.optimizer.LAMB())
    (True, False)
    """
    kind = type(optimizer)
    return kind.__module__ == "mxnet.optimizer.optimizer" and kind.__name__ in ELEMENTWISE


def _is_bf16(array):
    return dtypes.name_of(array.dtype) == "bfloat16"


def _is_master_state(state):
    # state[0] may be an NDArray, whose == does not compare with a str.
    return isinstance(state, tuple) and len(state) == 3 and isinstance(state[0], str) \
        and state[0] == MASTER_TAG


class MasterWeightUpdater(Updater):
    """An ``Updater`` that runs bfloat16 weights' updates on float32 master copies.

    Other weights go through MXNet's own ``Updater`` unchanged.

    >>> import mxnet as mx
    >>> up = MasterWeightUpdater(mx.optimizer.SGD(learning_rate=1.0))
    >>> w = mx.nd.amp_cast(mx.nd.array([1.0]), dtype=dtypes.BFLOAT16)
    >>> g = mx.nd.amp_cast(mx.nd.array([0.5]), dtype=dtypes.BFLOAT16)
    >>> up(0, g, w); float(master_weight(up, 0).asscalar())
    0.5
    """

    def __call__(self, index, grad, weight):
        many = isinstance(index, (list, tuple))
        entries = list(zip(index, grad, weight)) if many else [(index, grad, weight)]
        low = [e for e in entries if _is_bf16(e[2])]
        rest = [e for e in entries if not _is_bf16(e[2])]
        if rest:
            indices, grads, weights = (list(x) for x in zip(*rest))
            super().__call__(indices, grads, weights)
        if low:
            self._update_bf16(low)

    def _master_state(self, index, weight):
        state = self.states.get(index)
        if not _is_master_state(state):
            master = cast(weight, "float32")
            state = (MASTER_TAG, master, self.optimizer.create_state(index, master))
            self.states_synced[index] = True
        elif not self.states_synced.get(index, False):
            state = self.sync_state_context(state, weight.context)
            self.states_synced[index] = True
        self.states[index] = state
        return state

    def _update_bf16(self, entries):
        device = entries[0][2].context.device_id
        set_optimizer_device(self.optimizer, device)
        step = max(self.optimizer.aggregate_num if self.aggregate_updates else 1, 1)
        # The float32 gradients go to the shared workspace, one chunk (or slice) at a time:
        # the size of the largest parameter or of a slice, whichever is smaller, reused
        # every step, instead of 4 B per parameter.
        sliced = updates_elementwise(self.optimizer)
        whole, large = [], []
        for entry in entries:
            (large if sliced and entry[2].size > SLICE_ELEMENTS else whole).append(entry)
        budget = max([e[2].size for e in whole] or [0])
        budget = min(budget, SLICE_ELEMENTS) if sliced else budget
        for chunk in _chunks(whole, step, budget):
            self._update_chunk(chunk)
        for index, grad, weight in large:
            self._update_in_slices(index, grad, weight)

    def _update_chunk(self, entries):
        indices, masters, grads32, inner = [], [], [], []
        offset = 0
        for index, grad, weight in entries:
            _, master, state = self._master_state(index, weight)
            view = WORKSPACE.view(grad.context, grad.shape, offset)
            offset += grad.size
            cast_into(grad, view)
            indices.append(index)
            masters.append(master)
            grads32.append(view)
            inner.append(state)
        if len(indices) == 1:
            self.optimizer.update(indices[0], masters[0], grads32[0], inner[0])
        else:
            self.optimizer.update(indices, masters, grads32, inner)
        for (_, _, weight), master in zip(entries, masters):
            cast_into(master, weight)

    def _update_in_slices(self, index, grad, weight):
        """One large weight's update, a workspace slice at a time; every slice sees the
        optimizer's update count of one update (learning-rate schedules, Adam's bias
        correction). The master and the optimizer state are mxamp's own arrays, in MXNet's
        default layout, so their slices are views; the gradient is only read, and the weight
        is written whole."""
        _, master, state = self._master_state(index, weight)
        flat_master = master.reshape((-1,))
        before = update_count(self.optimizer, index)
        for start, stop, grad32 in WORKSPACE.cast_slices(grad):
            restore_update_count(self.optimizer, index, before)
            self.optimizer.update(index, flat_master[start:stop], grad32,
                                  _state_slice(state, start, stop))
        cast_into(master, weight)


def _state_slice(state, start, stop):
    """The ``[start:stop]`` slice of every array of an optimizer state (flattened views)."""
    if isinstance(state, (list, tuple)):
        return type(state)(_state_slice(s, start, stop) for s in state)
    if state is None:
        return None
    return state.reshape((-1,))[start:stop]


def _chunks(entries, most, budget):
    """``entries`` in runs of at most ``most`` whose sizes add up to at most ``budget``
    (MXNet's aggregated kernels for the small parameters, the big ones one at a time)."""
    chunk, used = [], 0
    for entry in entries:
        size = entry[2].size
        if chunk and (len(chunk) == most or used + size > budget):
            yield chunk
            chunk, used = [], 0
        chunk.append(entry)
        used += size
    if chunk:
        yield chunk


def master_weight(updater, index):
    """The float32 master copy an updater keeps for bfloat16 parameter ``index`` (or None).

    >>> import mxnet as mx
    >>> master_weight(MasterWeightUpdater(mx.optimizer.SGD()), 0) is None
    True
    """
    state = updater.states.get(index)
    if _is_master_state(state):
        return state[1]
    return None


def install_master_weights(trainer):
    """Give ``trainer`` float32 master weights for its low-precision parameters.

    bfloat16: replaces the trainer's per-context updaters by :class:`MasterWeightUpdater`
    (keeping any states they hold). float16: :func:`float16_masters`. Returns True when the
    trainer has bfloat16 parameters. ``amp.init_trainer`` calls it, and the trainer's first
    ``amp.scale_loss`` again (``cast_model`` may come after ``init_trainer``); calling it
    twice is harmless.

    >>> import mxnet as mx
    >>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
    >>> install_master_weights(mx.gluon.Trainer([p], 'sgd', kvstore=None))
    False
    """
    view = TrainerView(trainer)
    float16_masters(view)
    if not any(_is_bf16(p) for p in view.params):
        return False
    replaced = []
    for updater in view.updaters:
        if not isinstance(updater, MasterWeightUpdater):
            fresh = MasterWeightUpdater(updater.optimizer)
            fresh.states, fresh.states_synced = updater.states, updater.states_synced
            updater = fresh
        replaced.append(updater)
    view.updaters = replaced
    return True


_SAID_ATTR = "_mxamp_float16_without_masters_said"


def float16_masters(view):
    """Turn the optimizer's ``multi_precision`` on where the trainer (a ``TrainerView``) has
    float16 parameters and no optimizer state yet; True where it did. States made without it
    hold no master, and MXNet's multi-precision update would misread them, so a trainer that
    already stepped is left as it is.

    >>> import mxnet as mx
    >>> from mxamp.backend.mxnet_private import TrainerView
    >>> p = mx.gluon.Parameter('w', shape=(2,), dtype='float16'); p.initialize()
    >>> t = mx.gluon.Trainer([p], 'sgd', kvstore=None)
    >>> float16_masters(TrainerView(t)), t.optimizer.multi_precision
    (True, True)
    """
    optimizer = view.optimizer
    if optimizer.multi_precision or \
            not any(dtypes.name_of(p.dtype) == "float16" for p in view.params):
        return False
    if any(updater.states for updater in view.updaters):
        if not getattr(optimizer, _SAID_ATTR, False):   # init_trainer, then the first step
            setattr(optimizer, _SAID_ATTR, True)
            _LOG.warning("mxamp: this trainer updated its float16 parameters before "
                         "amp.init_trainer/cast_model, without float32 master weights; pass "
                         "multi_precision=True to its optimizer to keep them")
        return False
    optimizer.multi_precision = True
    _LOG.info("mxamp: float16 parameters get float32 master weights: the optimizer's "
              "multi_precision is now True (MXNet's mp_* updates)")
    return True
