"""The drop-in facade: the names and parameters of ``mxnet.contrib.amp``, and a few more.

Replace ``from mxnet.contrib import amp`` with ``from mxamp import amp`` and a script keeps
working. What each function does lives in its own module; this one only gathers them.

>>> from mxamp import amp
>>> amp.init(target_dtype='bfloat16')            # doctest: +SKIP
>>> 'FullyConnected' in amp.list_lp16_ops('bfloat16')
True
"""
import importlib
import logging
import sys

from mxamp import dtypes, lists
from mxamp.backend.cpu import cpu_features
from mxamp.precision.plan import precision_plan
from mxamp.lists import symbol_bf16, symbol_fp16
from mxamp.precision.resolve import lists_for
from mxamp.patching.patcher import (disabled, init, is_initialized, op_lists, patch_state,
                                    precision_of, reset, target_dtype)
from mxamp.patching import loss_outputs
from mxamp.training.trainer import (global_norm_and_overflow, init_trainer, loss_scaler,
                                    scale_loss, unscale)
from mxamp.precision.policy import Policy

LOG = logging.getLogger(__name__)

__all__ = [
    "init", "init_trainer", "scale_loss", "unscale", "convert_symbol", "convert_model",
    "convert_hybrid_block", "convert_bucketing_module", "list_lp16_ops", "list_fp32_ops",
    "list_lp16_fp32_ops", "list_conditional_fp32_ops", "list_widest_type_cast",
    "list_loss_output_functions", "list_lp16_use_fp32_params", "list_fp16_ops",
    "list_fp16_fp32_ops", "disabled", "is_initialized", "patch_state", "target_dtype",
    "reset", "op_lists", "cast_model", "accuracy_report",
    "cpu_features", "global_norm_and_overflow", "loss_scaler", "precision_plan", "precision_of",
    "tune", "Policy",
]

#: Loaded at their first use: the commands' entry points (rank 6), which a training script
#: rarely calls (loading them cost ~5 ms of ``import mxamp``), and the conversion unit, which
#: a training script calls once if at all (its five modules are most of what the subpackages
#: added to ``import mxamp``, issue #23).
LAZY = {"tune": "mxamp.tuning", "accuracy_report": "mxamp.compare",
        "convert_symbol": "mxamp.conversion.convert", "convert_model": "mxamp.conversion.convert",
        "convert_hybrid_block": "mxamp.conversion.convert",
        "convert_bucketing_module": "mxamp.conversion.convert"}


def __getattr__(name):
    """The :data:`LAZY` names (``amp.tune``, ``amp.convert_hybrid_block``, ...), imported when
    first asked for; and the
    reference's ``amp._amp_initialized`` (GluonNLP reads it) and ``amp.amp`` (its module path,
    ``from mxnet.contrib.amp import amp``), for code that ``mxamp.install()`` points here.

    >>> import mxamp.amp as amp
    >>> amp.amp is amp, amp._amp_initialized == amp.is_initialized()
    (True, True)
    """
    if name == "_amp_initialized":
        return is_initialized()
    if name == "amp":
        return sys.modules[__name__]
    if name not in LAZY:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    value = getattr(importlib.import_module(LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _lists(target_dtype):
    return lists_for(dtypes.normalize(target_dtype))


def list_lp16_ops(target_dtype="float16"):
    """Ops whose inputs are cast to the low-precision target.

    >>> 'Convolution' in list_lp16_ops('float16')
    True
    """
    return sorted(_lists(target_dtype).low_precision)


def list_fp32_ops(target_dtype="float16"):
    """Ops whose inputs are cast to float32.

    >>> 'softmax' in list_fp32_ops('bfloat16')
    True
    """
    return sorted(_lists(target_dtype).fp32)


def list_lp16_fp32_ops(target_dtype="float16"):
    """Dtype-neutral ops: they run in whatever precision their input has.

    >>> 'Flatten' in list_lp16_fp32_ops('bfloat16')
    True
    """
    return sorted(_lists(target_dtype).neutral)


def list_conditional_fp32_ops(target_dtype="float16"):
    """``(op, parameter, [values])`` triples: the op runs in float32 for those values.

    >>> ('Activation', 'act_type', ['softrelu']) in list_conditional_fp32_ops('float16')
    True
    """
    cond = _lists(target_dtype).conditional_fp32
    return [(op, param, list(values)) for op, (param, values) in sorted(cond.items())]


def list_widest_type_cast(target_dtype="float16"):
    """Multi-input ops that run in the widest float type among their inputs.

    >>> 'Concat' in list_widest_type_cast('bfloat16')
    True
    """
    return sorted(_lists(target_dtype).widest)


def list_loss_output_functions(target_dtype="float16"):
    """Loss-output ops whose ``grad_scale`` is multiplied by the loss scale.

    >>> 'SoftmaxOutput' in list_loss_output_functions('float16')
    True
    """
    return sorted(_lists(target_dtype).loss_output)


def list_lp16_use_fp32_params(target_dtype="float16"):
    """For low-precision ops, the inputs (by name) that stay float32, e.g. BatchNorm's statistics.

    >>> isinstance(list_lp16_use_fp32_params('bfloat16'), dict)
    True
    """
    return {op: list(names) for op, names in _lists(target_dtype).fp32_params.items()}


def list_fp16_ops(target_dtype="float16"):
    """Alias of :func:`list_lp16_ops` under its MXNet 1.5 name.

    >>> list_fp16_ops() == list_lp16_ops('float16')
    True
    """
    return list_lp16_ops(target_dtype)


def list_fp16_fp32_ops(target_dtype="float16"):
    """Alias of :func:`list_lp16_fp32_ops` under its MXNet 1.5 name.

    >>> list_fp16_fp32_ops() == list_lp16_fp32_ops('float16')
    True
    """
    return list_lp16_fp32_ops(target_dtype)


def cast_model(block, target_dtype="bfloat16", exclude=None, output_dtype="float32",
               example_inputs=None):
    """O2: :func:`mxamp.conversion.o2.cast_model`, and where the model then computes bfloat16,
    or has bfloat16 parameters in a block that is not hybrid, with no ``amp.init`` in force,
    ``amp.init('bfloat16')`` too (logged): the operators a block calls directly get float32
    inputs where bfloat16 has no kernel, or corrupts the heap (``transpose``). ``amp.reset()``
    undoes it. An ``amp.init`` for another target stays in force (a process runs one
    configuration), and a warning says so.

    >>> import mxnet as mx
    >>> net = mx.gluon.nn.Dense(3, in_units=4)
    >>> net.initialize()
    >>> cast_model(net, 'bfloat16') is net
    True
    >>> reset()
    """
    from mxamp.conversion import o2   # the conversion unit loads at first use (LAZY)
    return o2.cast_model(block, target_dtype, exclude, output_dtype, example_inputs,
                         route_operators=_route_for_o2)


def _route_for_o2(target):
    LOG.info("mxamp: cast_model(%s) called amp.init(%r): operators that a block's forward or "
             "hybrid_forward calls directly then compute in float32 where %s has no kernel "
             "(amp.reset() undoes it; call amp.init yourself first to choose other lists)",
             target, target, target)
    init(target_dtype=target)
