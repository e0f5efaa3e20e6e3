"""What a bfloat16 request must give on this CPU: the expectations that depend on its class.

mxamp decides one bfloat16 class per process (``mxamp.cpu``): 'none' (no oneDNN bfloat16
kernels: AVX2 CPUs, or oneDNN capped below AVX512_CORE), 'emulated', 'native' or 'amx'. Tests
of bfloat16 behaviour read these names and assert what is right for the class they run on:
bfloat16 outputs and bfloat16 numerics where the kernels exist; float32 outputs, float32's
values, the one warning and no crash where they do not. Such tests carry the ``cpu_class``
marker: ``.ci/run`` runs them a second time with ``DNNL_MAX_CPU_ISA=AVX2``.
"""
import numpy as np

from mxamp.cpu import cpu_features
from mxamp.dtypes import BFLOAT16

#: This process's bfloat16 class.
CPU_CLASS = cpu_features().bf16_class
#: oneDNN has bfloat16 kernels here (emulated or native), so bfloat16 requests compute in it.
BF16_KERNELS = CPU_CLASS != "none"
#: What a bfloat16 low-precision op (FullyConnected, Convolution) returns under amp.init here.
LOW = BFLOAT16 if BF16_KERNELS else np.dtype(np.float32)
#: Its canonical name.
LOW_NAME = "bfloat16" if BF16_KERNELS else "float32"
#: The opening words of the one warning a bfloat16 request gives on a CPU without kernels.
NO_KERNELS_WARNING = "mxamp: bfloat16 requested, but this CPU has no bfloat16 kernels"


def where():
    """A phrase for assertion messages: the class these expectations are for."""
    return "on a CPU of bfloat16 class %r" % CPU_CLASS
