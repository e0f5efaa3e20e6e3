"""The one registry of every attribute mxamp replaces in MXNet, and the undo of them all.

mxamp changes MXNet process-wide in a few ways: the generated operator functions of every
namespace (``amp.init``), ``NDArray.astype`` for bfloat16 (:mod:`mxamp.runtime.hooks`),
autograd's recording scopes (the per-``record()`` cast cache), the call method of hybridized
blocks (graphs rebuilt per AMP generation), and the reference module's ``_amp_initialized``
flag. Each goes through :func:`replace`, which records the owner, the attribute, the original
and the replacement in ``STATE.replaced``; :func:`undo_all` (``amp.reset()``) puts every
original back, newest first, and leaves nothing of mxamp in MXNet.

>>> import types
>>> owner = types.SimpleNamespace(f=len)
>>> replace(owner, 'f', abs, kind='example'); owner.f is abs, is_replaced(owner, 'f')
(True, True)
>>> undo_all(); owner.f is len
True
"""
from typing import NamedTuple

from mxamp.runtime.state import STATE

#: What each kind of patch is, in the order ``amp.init`` applies them.
KINDS = ("operator", "recording scope", "astype", "block hook", "reference flag", "example")

_MISSING = object()


class Patch(NamedTuple):
    """One replaced attribute: ``setattr(owner, attribute, replacement)`` undone by putting
    ``original`` back (or deleting the attribute where the owner had none of its own)."""

    owner: object
    attribute: str
    original: object
    replacement: object
    kind: str


def replace(owner, attribute, replacement, kind):
    """Set ``owner.attribute`` to ``replacement`` and record it for :func:`undo_all`.

    The original is the owner's own value (``owner.__dict__``), so a class attribute that
    is inherited is deleted again, not copied down, at undo.
    """
    if kind not in KINDS:
        raise ValueError("unknown patch kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    with STATE.lock:
        original = vars(owner).get(attribute, _MISSING)
        setattr(owner, attribute, replacement)
        STATE.replaced.append(Patch(owner, attribute, original, replacement, kind))


def is_replaced(owner, attribute):
    """True while mxamp's replacement of ``owner.attribute`` is in force."""
    return any(p.owner is owner and p.attribute == attribute for p in STATE.replaced)


def replaced(kind):
    """The patches of one ``kind`` in force, oldest first.

    >>> replaced('operator') == [p for p in STATE.replaced if p.kind == 'operator']
    True
    """
    return [p for p in STATE.replaced if p.kind == kind]


def undo_all():
    """Put back every original, newest first, where mxamp's replacement is still in place (a
    binding the user changed since is left alone), and empty the registry."""
    with STATE.lock:
        for patch in reversed(STATE.replaced):
            if vars(patch.owner).get(patch.attribute, _MISSING) is not patch.replacement:
                continue
            if patch.original is _MISSING:
                delattr(patch.owner, patch.attribute)
            else:
                setattr(patch.owner, patch.attribute, patch.original)
        STATE.replaced = []
