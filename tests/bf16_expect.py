"""What a bfloat16 request must give on this CPU: the expectations that depend on its class.

The class is worked out HERE, from the CPU's flags (``/proc/cpuinfo``) and the environment, by
oneDNN 2.4's documented dispatch rules (``cpu_isa_traits.hpp``: which flags each ISA level
needs, which ``DNNL_MAX_CPU_ISA`` names cap it), not by asking mxamp. ``tests/test_cpu.py``
checks in fresh interpreters that mxamp's decided class agrees with this table and with what
oneDNN's verbose output says it ran. Nothing here imports MXNet or runs a kernel: at import it
reads one file, and on an AMX CPU asks Linux for the tiles (one system call, as mxamp does).

=========== =========================================================== =====================
class       when                                                        a bf16 GEMM
=========== =========================================================== =====================
``none``    no avx512f/bw/vl/dq, a cap below ``AVX512_CORE``, or        fails (no kernel)
            ``MXNET_MKLDNN_ENABLED=0``
``emulated`` AVX-512 core without avx512_bf16/avx512_vnni, or a cap     runs, slower than fp32
            of ``AVX512_CORE`` / ``AVX512_CORE_VNNI``
``native``  avx512_bf16 and no AMX in effect                            runs in hardware
``amx``     amx_bf16/amx_tile/amx_int8, no cap below                    runs on AMX tiles
            ``AVX512_CORE_AMX``, mxamp's AMX switch on (see below) and
            Linux grants the tiles (``arch_prctl``, Linux 5.16 and later)
=========== =========================================================== =====================

mxamp's AMX switch (``mxamp.backend.cpu``): on unless ``MXAMP_AMX=0`` or ``MXAMP_DISABLE_AMX=1``,
or the user set ``DNNL_MAX_CPU_ISA``/``MKLDNN_MAX_CPU_ISA`` (a user cap of
``AVX512_CORE_AMX`` counts as on). Tests of bfloat16 behaviour read the names below and assert
what is right for the class they run on. Such tests carry the ``cpu_class`` marker:
``.ci/run`` runs them again under every ISA cap the machine allows.
"""
import ctypes
import os
import platform
import sys

import numpy as np

from mxamp.dtypes import BFLOAT16

_CORE = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
_BF16 = _CORE + ("avx512_vnni", "avx512_bf16")
_AMX = ("amx_tile", "amx_int8", "amx_bf16")
#: oneDNN 2.4's cap names -> the highest class they allow ("ALL" leaves AMX out in oneDNN 2.4).
_CAP_ALLOWS = {"ALL": "native", "SSE41": "none", "AVX": "none", "AVX2": "none",
               "AVX2_VNNI": "none", "AVX512_MIC": "none", "AVX512_MIC_4OPS": "none",
               "AVX512_CORE": "emulated", "AVX512_CORE_VNNI": "emulated",
               "AVX512_CORE_BF16": "native", "AVX512_CORE_AMX": "amx"}
_ORDER = ("none", "emulated", "native", "amx")
_OFF = ("", "0", "false", "no", "off")


def _flags(path="/proc/cpuinfo"):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _amx_switch_on(environ):
    """mxamp's AMX default (on) and its opt-outs, as the README documents them."""
    if environ.get("DNNL_MAX_CPU_ISA") or environ.get("MKLDNN_MAX_CPU_ISA"):
        return environ.get("DNNL_MAX_CPU_ISA") == "AVX512_CORE_AMX"
    if environ.get("MXAMP_DISABLE_AMX", "").strip().lower() not in _OFF:
        return False
    return environ.get("MXAMP_AMX", "1").strip().lower() not in _OFF


def linux_grants_tiles():
    """Linux's answer to the AMX tile request, asked here, not through mxamp (harmless: mxamp
    asks the same): x86-64 ``arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18)``
    (``asm/prctl.h``); Linux before 5.16 refuses, and oneDNN then cannot use the tiles."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0


def expected_class(flags, environ, tiles_granted=lambda: True):
    """The bfloat16 class the table above gives for ``flags`` and ``environ``; an AMX CPU also
    needs Linux to grant the tiles (``tiles_granted()``, asked only there: a documented CPU's
    flags assume a Linux that does, :func:`class_here` asks this machine's).

    >>> expected_class({'avx2'}, {})
    'none'
    >>> expected_class(set(_BF16), {'DNNL_MAX_CPU_ISA': 'AVX512_CORE'})
    'emulated'
    >>> expected_class(set(_BF16 + _AMX), {}, tiles_granted=lambda: False)
    'native'
    """
    if environ.get("MXNET_MKLDNN_ENABLED", "1").strip().lower() in ("0", "false"):
        return "none"
    if not all(f in flags for f in _CORE):
        return "none"
    found = "emulated"
    if all(f in flags for f in _BF16):
        found = "native"
        if all(f in flags for f in _AMX) and _amx_switch_on(environ) and tiles_granted():
            found = "amx"
    cap = environ.get("DNNL_MAX_CPU_ISA")
    allowed = _CAP_ALLOWS.get(cap, "native") if cap else "amx"
    return min(found, allowed, key=_ORDER.index)


def class_here(environ):
    """This machine's class under ``environ``: its flags, and Linux's answer on an AMX CPU."""
    return expected_class(_flags(), environ, linux_grants_tiles)


#: This process's bfloat16 class.
CPU_CLASS = class_here(os.environ)
#: The CPU has AMX tiles, whether or not they are in effect.
HAS_AMX = all(f in _flags() for f in _AMX)
#: oneDNN has bfloat16 kernels here (emulated or native), so bfloat16 requests compute in it.
BF16_KERNELS = CPU_CLASS != "none"
#: What a bfloat16 low-precision op (FullyConnected, Convolution) returns under amp.init here.
LOW = BFLOAT16 if BF16_KERNELS else np.dtype(np.float32)
#: Its canonical name.
LOW_NAME = "bfloat16" if BF16_KERNELS else "float32"
#: What 'auto' computes here when the probe is off (``MXAMP_PROBE=0``): the documented class
#: rule, bfloat16 on the classes that compute it in hardware (an AMX CPU whose AMX is off
#: measured 0.68-0.72x float32 without it, hw-runs/2026-11-25-xeon-amx: float32 there).
AUTO_BY_CLASS = "bfloat16" if CPU_CLASS == "amx" or (CPU_CLASS == "native" and not HAS_AMX) \
    else "float32"
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
