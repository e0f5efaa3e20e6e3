"""Which devices this process has, and how mxamp names them.

A device is ``'gpu'`` (CUDA, float16) or this CPU, named by its bfloat16 class
(:data:`mxamp.backend.cpu.BF16_CLASSES`: ``'amx'``, ``'native'``, ``'emulated'``, ``'none'``).
What a device computes for a request is decided above, in :mod:`mxamp.precision.device_plan`.

>>> device_of(mx.gpu(0))
'gpu'
"""
import functools

import mxnet as mx

from mxamp.backend import mxnet_private as mxp
from mxamp.backend.cpu import BF16_CLASSES, cpu_features  # noqa: F401 (BF16_CLASSES: doctests)
from mxamp.dtypes import is_cpu

#: The device name of CUDA GPUs (CPUs are named by their bfloat16 class).
GPU = "gpu"


@functools.lru_cache(maxsize=None)
def gpu_available():
    """True when this process can run GPU kernels (decides fp16 ops in Symbols on CPU).

    >>> isinstance(gpu_available(), bool)
    True
    """
    try:
        return mx.context.num_gpus() > 0
    except mxp.MXNetError:
        return False


def cpu_class():
    """This CPU's bfloat16 class (``mxamp.backend.cpu.BF16_CLASSES``), decided once per process.

    >>> cpu_class() in BF16_CLASSES
    True
    """
    return cpu_features().bf16_class


def device_of(ctx):
    """``'gpu'`` for a GPU context, this CPU's bfloat16 class for a CPU context.

    >>> import mxnet as mx
    >>> device_of(mx.gpu(0)), device_of(mx.cpu()) in BF16_CLASSES
    ('gpu', True)
    """
    return cpu_class() if is_cpu(ctx) else GPU


def symbol_device():
    """Where graphs built now will run: the GPU when the process has one, else this CPU.

    >>> symbol_device() in BF16_CLASSES + (GPU,)
    True
    """
    return GPU if gpu_available() else cpu_class()
