"""The one home of mxamp's process-wide state, and the one ``reset`` that clears it.

Everything mxamp remembers between calls lives in :data:`STATE`:

* the patch ``amp.init`` applied (target, op lists, device plans, the replaced functions), and
  a *generation* number that changes with every ``init``/``reset``, so that a hybridized block
  whose graph was built under another generation rebuilds it on its next call;
* per thread: the depth of ``amp.disabled()`` regions and the trainers inside ``scale_loss``;
* the trainers passed to ``amp.init_trainer`` (weakly: a trainer's life is its owner's);
* the per-``record()`` cast cache and the dtype table of Symbols AMP built;
* the warnings already given once (per operator, per notice).

``amp.reset()`` (:func:`mxamp.patching.patcher.reset`) restores MXNet's functions and then calls
:meth:`ProcessState.clear` under :attr:`ProcessState.lock`, which is never replaced: a thread
blocked on it while another resets finds a clean state, not a new lock. Thread-local parts are
replaced by fresh ones; a region that began before a reset ends on the object it began with.

>>> from mxamp.runtime.state import STATE
>>> STATE.summary()['patched']
False
"""
import contextlib
import threading
import warnings
import weakref

from mxamp.backend.mxnet_private import TrainerView
from mxamp.runtime.casting import WORKSPACE, RecordingCastCache, SymbolDtypes


class ProcessState:
    """The state of mxamp in this process (one instance: :data:`STATE`).

    >>> ProcessState().disabled_depth()
    0
    """

    def __init__(self):
        self.lock = threading.RLock()     #: guards init/reset; created once, never replaced
        self.recording_casts = RecordingCastCache()
        self.symbol_dtypes = SymbolDtypes()
        self.generation = 0
        #: what a bare ``amp.init()`` means, set by ``mxamp.install`` (kept across resets)
        self.install_target = None
        self._clear_fields()

    def _clear_fields(self):
        # the patch amp.init applied
        self.plan = None              # mxamp.precision.plan.Plan in force (request, lists, devices)
        self.arguments = None         # amp.init's normalised arguments (re-init check)
        self.replaced = []            # (kind, [changes]) batches of mxamp.runtime.patches
        self.replaced_keys = set()    # (id(owner), attribute) of each entry, for lookups
        self.amp_graph_blocks = weakref.WeakSet()   # blocks that built a graph under the hook
        self.categories = {}          # category -> number of wrapped functions
        self.init_seconds = 0.0
        # trainers: weak references, in amp.init_trainer order
        self.trainers = []
        # warnings given once per process: the keys warn_once has seen, by kind
        self.warned = {"op": set(), "notice": set()}
        # per-thread: amp.disabled() depth, trainers inside scale_loss
        self.local = threading.local()

    @property
    def patched(self):
        """True while ``amp.init``'s patch is applied."""
        return self.plan is not None

    @property
    def target(self):
        """The op lists in force ('float16' or 'bfloat16'), None before ``amp.init``."""
        return self.plan.target if self.plan is not None else None

    def clear(self):
        """Forget everything but the lock; the next graph built is a new generation.

        >>> s = ProcessState(); s.warned['op'].add('FullyConnected'); s.clear(); s.warned['op']
        set()
        """
        with self.lock:
            self._clear_fields()
            self.recording_casts.clear()
            self.symbol_dtypes.clear()
            WORKSPACE.clear()
            self.generation += 1

    # ----- per thread -----
    @contextlib.contextmanager
    def disabled_region(self):
        """A region of this thread where AMP casts nothing (``amp.disabled()``)."""
        local = self.thread_local()     # a reset meanwhile must not unbalance a fresh state
        local.disabled = getattr(local, "disabled", 0) + 1
        try:
            yield
        finally:
            local.disabled -= 1

    def disabled_depth(self):
        """How many ``amp.disabled()`` regions this thread is inside."""
        return getattr(self.local, "disabled", 0)

    def thread_local(self):
        """This thread's state object (keep it to end what you began on it)."""
        return self.local

    def trainer_stack(self):
        """The trainers whose ``scale_loss`` this thread is inside, innermost last."""
        return self.local.__dict__.setdefault("trainers", [])

    # ----- trainers -----
    def remember_trainer(self, trainer):
        """Record ``trainer`` as the most recently initialised one (weakly)."""
        with self.lock:
            self.trainers = [r for r in self.trainers if r() is not None and r() is not trainer]
            self.trainers.append(weakref.ref(trainer))

    def current_trainer(self):
        """The trainer whose ``scale_loss`` is active in this thread, else the most recently
        initialised trainer still alive, else None."""
        stack = self.local.__dict__.get("trainers")
        if stack:
            return stack[-1]
        with self.lock:
            for ref in reversed(self.trainers):
                trainer = ref()
                if trainer is not None:
                    return trainer
        return None

    def current_scaler(self):
        """The loss scaler (a :class:`~mxamp.training.trainer_scaler.TrainerScaler`) that
        loss-output ops follow, or None: that of the trainer whose ``scale_loss`` is active in
        this thread, else of the trainer most recently passed to ``init_trainer`` and alive.

        >>> ProcessState().current_scaler() is None
        True
        """
        trainer = self.current_trainer()
        return None if trainer is None else TrainerView(trainer).amp_scaler_or_none()

    # ----- warnings -----
    def warn_once(self, text, key=None, kind="notice", category=RuntimeWarning, stacklevel=3):
        """Issue ``text`` as a warning the first time this process asks for ``key`` (default:
        the text itself) of ``kind`` (``'op'``: a per-operator fallback; ``'notice'``: a
        message about the whole request); True if issued. The one warn-once of mxamp.

        >>> s = ProcessState(); s.warn_once(''), s.warned['notice']
        (False, set())
        """
        if not text:
            return False
        seen = self.warned[kind]
        with self.lock:
            if (key or text) in seen:
                return False
            seen.add(key or text)
        warnings.warn(text, category, stacklevel=stacklevel + 1)
        return True

    def summary(self):
        """A few numbers about the state, for ``amp.patch_state()`` and tests.

        >>> sorted(ProcessState().summary())[:3]
        ['generation', 'notices', 'patched']
        """
        return {"patched": self.patched, "generation": self.generation,
                "trainers": sum(1 for r in self.trainers if r() is not None),
                "warned_ops": len(self.warned["op"]), "notices": len(self.warned["notice"]),
                "tracked_symbols": len(self.symbol_dtypes)}


#: mxamp's state in this process.
STATE = ProcessState()
