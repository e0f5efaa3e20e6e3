"""AMX mechanics for oneDNN 2.4 (inside MXNet 1.9.1): the tile grant, the ISA latch, and a check
that AMX is really in effect.

oneDNN 2.4 uses AMX only when, before it creates its first primitive, Linux has granted the
process the AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) and
``DNNL_MAX_CPU_ISA=AVX512_CORE_AMX`` is in the environment. The variable without the grant
kills the process with SIGILL at the first AMX instruction. oneDNN reads the variable once, at
its first primitive: asked for after any oneDNN operator has run, AMX stays off for the life of
the process, silently. Nothing in MXNet's Python API says which ISA oneDNN fixed (libmxnet
exports no ``dnnl_get_effective_cpu_isa``), so :func:`bf16_gemm_speedup` measures it.

mxamp turns AMX on where the CPU has it, unless ``MXAMP_AMX=0`` (see :mod:`mxamp.backend.cpu`).
Nothing here imports MXNet at module level.

>>> from mxamp.backend import amx
>>> granted, detail = amx.request_permission()
>>> isinstance(granted, bool) and isinstance(detail, str)
True
"""
import ctypes
import os
import platform
import sys

from mxamp.backend.timing import time_calls

#: The value that lets oneDNN 2.4 dispatch to AMX kernels.
AMX_ISA = "AVX512_CORE_AMX"
#: The variable oneDNN 2.4 reads for its ISA cap.
ISA_ENV = "DNNL_MAX_CPU_ISA"
#: A bfloat16 GEMM at least this many times faster than float32 means AMX tiles computed it.
#: Without AMX, bfloat16 GEMMs on AMX Xeons run on AVX512-BF16 at 0.61x float32
#: (FullyConnected 256x1024->1024, the probe on a 2-vCPU Xeon, NOTES.md 2c). With AMX, a 512-cubed
#: GEMM measured 1.96-3.47x (one thread, 12 test processes at once on a 16-core Xeon), but also
#: below 1.4x with 4 threads beside a loaded machine, where an MLP of 2048-wide GEMMs ran 1.8x:
#: the reorders of a small GEMM blur it (2026-11-26). So :func:`bf16_gemm_speedup` times a
#: 1024-cubed GEMM, and the threshold sits near the middle (in ratio) of 0.61x and 2x. A wrong
#: "not in effect" would also drop the AMX guard, so a result below it is measured once more.
#: A CPU without AMX flags is never checked (Zen 5's AVX512-BF16 reaches 1.9-2.7x).
AMX_MIN_SPEEDUP = 1.1

_SYS_ARCH_PRCTL = 158          # x86_64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def request_permission():
    """Ask Linux for the AMX tile state; returns ``(granted, detail)``.

    Harmless to repeat, and only affects the calling process (inherited by ``fork``, reset by
    ``exec``).

    >>> isinstance(request_permission()[0], bool)
    True
    """
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False, "AMX tile permission is a Linux x86_64 request (this is %s %s)" % (
            sys.platform, platform.machine())
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        status = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    except (OSError, AttributeError) as err:
        return False, "cannot call arch_prctl through libc: %s" % err
    if status == 0:
        return True, "granted"
    errno = ctypes.get_errno()
    return False, "arch_prctl(ARCH_REQ_XCOMP_PERM) failed: %s (errno %d); Linux >= 5.16 " \
                  "on an AMX CPU grants it" % (os.strerror(errno), errno)


def latch_onednn_isa(isa):
    """Make oneDNN read ``DNNL_MAX_CPU_ISA=isa`` now, then take the variable out of the
    environment (a child process that inherited it without the grant would die of SIGILL).

    oneDNN fixes its ISA cap at its first primitive; one tiny float32 FullyConnected is that
    primitive unless one already ran (then this changes nothing, silently: see
    :func:`bf16_gemm_speedup`).
    """
    import mxnet as mx  # deferred: detecting the CPU must not need MXNet

    os.environ[ISA_ENV] = isa
    try:
        data = mx.nd.ones((1, 16), ctx=mx.cpu())
        weight = mx.nd.ones((16, 16), ctx=mx.cpu())
        mx.nd.FullyConnected(data, weight, no_bias=True, num_hidden=16).wait_to_read()
    finally:
        del os.environ[ISA_ENV]


def bf16_gemm_speedup(size=1024, repeats=3):
    """float32 time / bfloat16 time of one ``size``-cubed FullyConnected, best of ``repeats``.

    About 50-150 ms on a CPU that runs bfloat16; call it only where bfloat16 has kernels. Above
    :data:`AMX_MIN_SPEEDUP` the bfloat16 GEMM ran on AMX tiles.
    """
    import mxnet as mx  # deferred: detecting the CPU must not need MXNet

    # MXNet's own functions, not amp.init's wrappers: the dtypes given are the dtypes run
    fully_connected = getattr(mx.nd.FullyConnected, "__wrapped__", mx.nd.FullyConnected)
    amp_cast = getattr(mx.nd.amp_cast, "__wrapped__", mx.nd.amp_cast)
    values = mx.nd.array(_uniform((2 * size, size)), ctx=mx.cpu())
    data, weight = values[:size], values[size:]

    def best(x, w):
        return time_calls(lambda: fully_connected(x, w, no_bias=True, num_hidden=size)
                          .wait_to_read(), repeats=repeats).best

    bf16 = amp_cast(data, dtype=_bf16_dtype()), amp_cast(weight, dtype=_bf16_dtype())
    return best(data, weight) / max(best(*bf16), 1e-9)


def in_effect(latched_first):
    """``(AMX in effect, how we know)`` for a process whose ISA cap allows AMX.

    Certain where mxamp latched the cap before anyone imported MXNet (``latched_first``: no
    oneDNN primitive can have run before it); elsewhere a bfloat16 GEMM is timed against
    float32 (:func:`bf16_gemm_speedup`).
    """
    if latched_first:
        return True, "mxamp set the AMX cap before MXNet's first oneDNN primitive"
    speedup = bf16_gemm_speedup()
    if speedup < AMX_MIN_SPEEDUP:    # a loaded machine blurs one measurement: take the best
        speedup = max(speedup, bf16_gemm_speedup())
    verdict = speedup >= AMX_MIN_SPEEDUP
    return verdict, "a 1024x1024x1024 bfloat16 GEMM ran %.2fx float32's speed (AMX: >= %.1fx)" % (
        speedup, AMX_MIN_SPEEDUP)


def too_late_message(check):
    """The warning for a process where AMX was asked for and ``check`` found it not in effect.

    >>> 'Import mxamp before the first oneDNN operator' in too_late_message('a check')
    True
    """
    return ("mxamp: AMX was asked for but is not in effect in this process (%s): oneDNN had "
            "already fixed its instruction set at an earlier oneDNN operator. Import mxamp "
            "before the first oneDNN operator runs (or set DNNL_MAX_CPU_ISA=AVX512_CORE_AMX "
            "yourself before starting Python). bfloat16 runs without AMX here (class 'native'), "
            "which on Sapphire Rapids is slower than float32." % check)


def _uniform(shape):
    import numpy as np
    return np.random.RandomState(0).uniform(-1, 1, shape).astype("float32")


def _bf16_dtype():
    import numpy as np
    return np.dtype([("bfloat16", np.uint16)])
