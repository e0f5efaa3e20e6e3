"""The one registry of every attribute mxamp replaces in MXNet, and the undo of them all.

mxamp changes MXNet process-wide in a few ways: the generated operator functions of every
namespace (``amp.init``), ``NDArray.astype`` for bfloat16 (:mod:`mxamp.runtime.hooks`),
autograd's recording scopes (the per-``record()`` cast cache), the call method of hybridized
blocks (graphs rebuilt per AMP generation), and the reference module's ``_amp_initialized``
flag. Each goes through :func:`replace` (or, for ``amp.init``'s bulk operator bindings,
:func:`record`), which records the owner, the attribute, the original and the replacement in
``STATE.replaced``; :func:`undo_all` (``amp.reset()``) puts every
original back, newest first, and leaves nothing of mxamp in MXNet.

>>> import types
>>> owner = types.SimpleNamespace(f=len)
>>> replace(owner, 'f', abs, kind='example'); owner.f is abs, is_replaced(owner, 'f')
(True, True)
>>> undo_all(); owner.f is len
True
"""
import collections
import contextlib

from mxamp.runtime.state import STATE

#: What each kind of patch is, in the order ``amp.init`` applies them.
KINDS = ("operator", "recording scope", "astype", "block hook", "parameter hook",
         "reference flag", "example")

_MISSING = object()


#: One replaced attribute: ``setattr(owner, attribute, replacement)`` undone by putting
#: ``original`` back (or deleting the attribute where the owner had none of its own).
#: ``STATE.replaced`` keeps them in batches, ``(kind, [(owner, attribute, original,
#: replacement), ...])``, one per :func:`record` (``amp.init`` records ~1,900 bindings in
#: one, at the cost of the ``setattr`` alone); :func:`replaced` returns them as ``Patch``.
Patch = collections.namedtuple("Patch", "owner attribute original replacement kind")


def replace(owner, attribute, replacement, kind):
    """Set ``owner.attribute`` to ``replacement`` and record it for :func:`undo_all`.

    The original is the owner's own value (``vars(owner)``), so a class attribute that is
    inherited is deleted again, not copied down, at undo.
    """
    with STATE.lock:
        original = vars(owner).get(attribute, _MISSING)
        setattr(owner, attribute, replacement)
        record([(owner, attribute, original, replacement)], kind)


def record(changes, kind):
    """Record ``(owner, attribute, original, replacement)`` changes the caller has just made,
    so that :func:`undo_all` undoes them. ``amp.init`` sets its ~1,900 operator bindings in the
    loop that makes their wrappers (a second pass over them cost 0.1-0.3 ms of init) and
    records them here, in one batch."""
    if kind not in KINDS:
        raise ValueError("unknown patch kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    with STATE.lock:
        STATE.replaced.append((kind, changes))
        if kind != "operator":
            # the hooks ask is_replaced before installing themselves; operator bindings are
            # installed once per init and never looked up (indexing them cost 0.3 ms of init)
            STATE.replaced_keys.update((id(c[0]), c[1]) for c in changes)


def is_replaced(owner, attribute):
    """True while mxamp's replacement of ``owner.attribute`` is in force (any kind but
    ``'operator'``, whose bindings :func:`replaced` lists)."""
    return (id(owner), attribute) in STATE.replaced_keys


def replaced(kind):
    """The patches of one ``kind`` in force, oldest first.

    >>> all(p.kind == 'operator' for p in replaced('operator'))
    True
    """
    return [Patch(*change, kind) for batch_kind, batch in STATE.replaced if batch_kind == kind
            for change in batch]


def undo_all():
    """Put back every original, newest first, where mxamp's replacement is still in place (a
    binding the user changed since is left alone), and empty the registry."""
    with STATE.lock:
        for patch in (Patch(*change, kind) for kind, batch in reversed(STATE.replaced)
                      for change in reversed(batch)):
            if vars(patch.owner).get(patch.attribute, _MISSING) is not patch.replacement:
                continue
            if patch.original is _MISSING:
                delattr(patch.owner, patch.attribute)
            else:
                setattr(patch.owner, patch.attribute, patch.original)
        STATE.replaced, STATE.replaced_keys = [], set()


@contextlib.contextmanager
def operators_unpatched():
    """A region where MXNet's operator functions are its own again: ``amp.init``'s wrappers
    are taken out on entry and put back on exit (where nobody re-bound them meanwhile). For
    tracing a graph without AMP's casts while AMP is in force (``convert_hybrid_block``).
    Process-wide, as the patch is: another thread's operator calls inside run unwrapped.

    >>> import types
    >>> owner = types.SimpleNamespace(f=len)
    >>> owner.f = abs; record([(owner, 'f', len, abs)], 'operator')
    >>> with operators_unpatched():
    ...     owner.f is len
    True
    >>> owner.f is abs
    True
    >>> undo_all()
    """
    with STATE.lock:
        restored = []
        for owner, attribute, original, replacement in (
                c for kind, batch in STATE.replaced if kind == "operator" for c in batch):
            if original is not _MISSING and vars(owner).get(attribute) is replacement:
                setattr(owner, attribute, original)
                restored.append((owner, attribute, original, replacement))
        try:
            yield
        finally:
            for owner, attribute, original, replacement in reversed(restored):
                if vars(owner).get(attribute) is original:
                    setattr(owner, attribute, replacement)
