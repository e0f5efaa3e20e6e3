"""mxamp: automatic mixed precision (float16 / bfloat16) for Apache MXNet 1.x and Gluon.

``from mxamp import amp`` is a drop-in replacement for ``from mxnet.contrib import amp``::

    from mxamp import amp
    amp.init(target_dtype="bfloat16")      # patch MXNet's operators
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    amp.init_trainer(trainer)              # dynamic loss scaling, skip-on-overflow
    with mx.autograd.record():
        loss = loss_fn(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            mx.autograd.backward(scaled)
    trainer.step(batch_size)

Every public function of :mod:`mxamp.amp` is re-exported here, so ``import mxamp;
mxamp.init()`` works too.
"""
from mxamp._version import __version__  # noqa: F401

_MISSING_MXNET = (
    "mxamp needs an MXNet 1.9.1 build, and none is importable ({err}). Install one with the "
    "extra that matches your machine: pip install 'mxamp[cpu]' (CPU, bfloat16 through oneDNN) "
    "or pip install 'mxamp[cu112]' (CUDA 11.2 GPUs, float16)."
)

# Before MXNet's first operator, which starts its resource manager: one CPU temp-space buffer,
# not four (mxamp/backend/heap.py). First of all, since the AMX latch below runs an operator.
from mxamp.backend import heap as _heap  # noqa: E402
_heap.share_cpu_temp_space()
# One glibc malloc arena, before MXNet's threads first allocate (heap.py).
_heap.share_one_c_heap()
# glibc gives freed pages back only when mxamp trims, not at every large free (heap.py).
_heap.keep_freed_pages()
# Before MXNet plans a graph's memory: the plan, of those MXNet can make, that allocates least
# (graph_memory.py).
from mxamp.backend import graph_memory as _graph_memory  # noqa: E402
_graph_memory.search_storage_plans()
# Before MXNet's first oneDNN primitive: where bfloat16 computes in AVX512-BF16, one cached
# primitive per operator type, so that their scratch does not outlive the operator (heap.py).
from mxamp.backend.cpu import read_cpu_flags as _read_cpu_flags  # noqa: E402
_heap.bound_primitive_cache(_read_cpu_flags())

# Before MXNet's first oneDNN primitive (unless MXAMP_AMX=0):
# lets oneDNN use AMX where the CPU and kernel allow it; see mxamp/backend/cpu.py for the import order.
from mxamp.backend import cpu as _cpu  # noqa: E402
_cpu.enable_amx_if_possible()

try:
    import mxnet as _mxnet  # noqa: F401
except ImportError as _err:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(_MISSING_MXNET.format(err=_err)) from _err

from mxamp import amp  # noqa: E402
from mxamp.patching import patcher as _patching  # noqa: E402

# amp's names, but for those it loads at their first use (amp.LAZY): those come
# through __getattr__ below, so that ``import mxamp`` does not load them.
globals().update({_name: getattr(amp, _name) for _name in amp.__all__
                  if _name not in amp.LAZY})

# The facts amp.init needs (MXNet's generated operator functions, the op lists), computed once
# here so that amp.init itself takes a few milliseconds.
_patching.prepare()

# Which arrays get their gradients added (grad_req='add'): casts of those need a copy first
# (mxamp.runtime.addto). Notes only, a set operation per marking.
from mxamp.runtime.addto_hooks import hook_grad_marks as _hook_grad_marks  # noqa: E402
_hook_grad_marks()

# Where AMX is on, the AMX guard needs the shapes a block ran with: remember them (a graph is
# built once, so this costs nothing per call).
if _cpu.enable_amx_if_possible().amx_granted:
    from mxamp.runtime.hooks import record_input_shapes as _record_input_shapes
    _record_input_shapes()

__all__ = ["amp", "__version__", "install", "uninstall", "is_installed"] + list(amp.__all__)


#: Loaded at first use, like the commands: ``python -m mxamp run`` and the few scripts that
#: call ``mxamp.install()`` pay for the stand-in, ``import mxamp`` does not.
_STANDIN = ("install", "uninstall", "is_installed")


def __getattr__(name):
    """``mxamp.tune``, ``mxamp.accuracy_report`` (from :mod:`mxamp.amp`) and
    ``mxamp.install``/``uninstall``/``is_installed`` (from :mod:`mxamp.standin`), at first use."""
    if name in amp.LAZY:
        return getattr(amp, name)
    if name in _STANDIN:
        import importlib
        value = getattr(importlib.import_module("mxamp.standin"), name)
        globals()[name] = value
        return value
    raise AttributeError("module 'mxamp' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
