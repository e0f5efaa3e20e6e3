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


def check_float32_casts(y):
    """Cast an operator's output to float32 every way users do, inside ``autograd.record()``,
    and check the spellings agree and are finite; returns the float32 values.

    On an AVX-512 CPU a bfloat16 oneDNN output is held in a oneDNN layout, where MXNet's own
    ``astype`` failed ("The size of NDArray doesn't match the requested MKLDNN memory desc");
    every test that inspects a bfloat16 output goes through here, so that failure shows on
    every class that has bfloat16 kernels.
    """
    import mxnet as mx
    legacy = y.as_nd_ndarray() if isinstance(y, mx.np.ndarray) else y
    with mx.autograd.record():
        spelled = {"astype": legacy.astype("float32"),
                   "Cast": mx.nd.Cast(legacy, dtype="float32"),
                   "amp_cast": mx.nd.amp_cast(legacy, dtype="float32")}
        if isinstance(y, mx.np.ndarray):
            spelled["np astype"] = y.astype("float32").as_nd_ndarray()
    values = {name: out.asnumpy() for name, out in spelled.items()}
    first = values["amp_cast"]
    assert np.isfinite(first).all(), "non-finite values in a float32 cast of the output"
    for name, got in values.items():
        assert got.dtype == np.float32 and np.array_equal(got, first), (
            "%s of a %s output differs from amp_cast %s" % (name, LOW_NAME, where()))
    return first
