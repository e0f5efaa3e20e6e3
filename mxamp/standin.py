"""mxamp in place of ``mxnet.contrib.amp`` for code nobody edits: ``install`` and ``uninstall``.

Libraries import the reference themselves (GluonCV's R-CNN ``ForwardBackwardTask`` and its
estimators, GluonNLP's attention cell). After :func:`install`, in this process,
``import mxnet.contrib.amp``, ``from mxnet.contrib import amp`` and
``from mxnet.contrib.amp import amp`` all give :mod:`mxamp.amp`, and so do the reference's
list modules (``mxnet.contrib.amp.lists.symbol_fp16``, ...). :func:`uninstall` puts the
reference's modules back, exactly as they were.

Installing is not part of ``amp.init``'s patch: ``amp.reset()`` leaves it in place, and only
:func:`uninstall` undoes it (a script run by ``python -m mxamp run`` may reset AMP and
initialise it again).

>>> import mxamp
>>> mxamp.install(); import mxnet.contrib.amp as ref; ref is mxamp.amp
True
>>> mxamp.uninstall(); ref = __import__('mxnet.contrib.amp', fromlist=['x']); ref is mxamp.amp
False
"""
import logging
import sys

from mxamp import amp, dtypes, lists
from mxamp.errors import AmpArgumentError
from mxamp.lists import symbol_bf16, symbol_fp16
from mxamp.runtime.state import STATE

_LOG = logging.getLogger("mxamp")

#: The reference's module names, and what stands in for each once installed.
STAND_INS = {
    "mxnet.contrib.amp": amp,
    "mxnet.contrib.amp.amp": amp,
    "mxnet.contrib.amp.lists": lists,
    "mxnet.contrib.amp.lists.symbol_fp16": symbol_fp16,
    "mxnet.contrib.amp.lists.symbol_bf16": symbol_bf16,
    "mxnet.contrib.amp.lists.symbol": symbol_fp16,    # its MXNet 1.5/1.6 name
}

_MISSING = object()
#: ``{(owner, attribute) or module name: original}`` while installed; empty otherwise.
_ORIGINALS = {}


def install(target_dtype=None):
    """Make ``mxnet.contrib.amp`` mean mxamp's ``amp`` in this process (idempotent).

    ``target_dtype`` ('auto', 'bfloat16', 'float16' in any spelling) is what a bare
    ``amp.init()`` then means; None keeps mxamp's default (float16 with a GPU, 'auto'
    without). Calling it again changes only that.

    >>> import mxamp
    >>> mxamp.install('auto'); mxamp.is_installed()
    True
    >>> mxamp.uninstall(); mxamp.is_installed()
    False
    """
    target = None if target_dtype is None else dtypes.normalize_request(target_dtype)
    import mxnet.contrib  # noqa: F401 - the package whose attribute ``amp`` is replaced
    import mxnet.contrib.amp.lists.symbol_fp16  # noqa: F401 - kept, to put back
    contrib = sys.modules["mxnet.contrib"]
    with STATE.lock:
        STATE.install_target = target
        if _ORIGINALS:
            return
        for name, module in STAND_INS.items():
            _ORIGINALS[name] = sys.modules.get(name, _MISSING)
            sys.modules[name] = module
        # ``from mxnet.contrib import amp`` reads the package's attribute, not sys.modules
        _ORIGINALS[(contrib, "amp")] = vars(contrib).get("amp", _MISSING)
        contrib.amp = amp
    _LOG.info("mxamp: installed in place of mxnet.contrib.amp%s", "" if target is None else
              "; a bare amp.init() means target_dtype=%r" % target)


def uninstall():
    """Put the reference's modules back where :func:`install` replaced them (idempotent);
    a bare ``amp.init()`` means mxamp's default again."""
    with STATE.lock:
        STATE.install_target = None
        for key, original in reversed(list(_ORIGINALS.items())):
            if isinstance(key, tuple):
                owner, attribute = key
                if original is _MISSING:
                    delattr(owner, attribute)
                else:
                    setattr(owner, attribute, original)
            elif original is _MISSING:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = original
        _ORIGINALS.clear()


def is_installed():
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_ORIGINALS)


def check_target(target_dtype):
    """``target_dtype`` for :func:`install` from the command line, checked.

    >>> check_target('bf16')
    'bfloat16'
    """
    try:
        return dtypes.normalize_request(target_dtype)
    except AmpArgumentError as err:
        raise AmpArgumentError("--target: %s" % err) from None
