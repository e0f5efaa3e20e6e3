"""CPU features for bfloat16, and switching oneDNN to Intel AMX.

oneDNN 2.4 (inside MXNet 1.9.1) never uses AMX unless two things happen before it creates its
first primitive: Linux grants the process the AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``) and ``DNNL_MAX_CPU_ISA=AVX512_CORE_AMX`` is in the environment. The
variable without the grant kills the process with SIGILL at the first AMX instruction, so mxamp
sets it only after the grant succeeded.

``import mxamp`` calls :func:`enable_amx_if_possible`. It sets the variable, runs one tiny
oneDNN primitive so that oneDNN reads it (oneDNN reads it once, at its first primitive), and
then removes it from ``os.environ`` again: the grant is not inherited across ``exec``, so a
child process that saw the variable could die of SIGILL.

Import order: AMX is enabled when ``import mxamp`` comes before the first oneDNN operator
(FullyConnected, Convolution, Activation, BatchNorm, ...) of the process. ``import mxnet`` first
is fine; running such an operator first is not (oneDNN has then fixed its ISA for good, and
nobody can tell from outside). Nothing is changed when:

- ``MXAMP_DISABLE_AMX=1`` is set (the opt-out);
- the user set ``DNNL_MAX_CPU_ISA`` or ``MKLDNN_MAX_CPU_ISA`` (their choice wins; mxamp still asks
  for the tile grant when that choice names AMX, so that it cannot crash);
- the CPU lacks ``amx_bf16`` or the kernel refuses the grant (Linux < 5.16, other OS).

>>> from mxamp import cpu
>>> features = cpu.cpu_features()
>>> sorted(features.as_dict())[:3]
['amx_bf16', 'amx_enabled', 'amx_granted']
"""
import ctypes
import logging
import os
import platform
import sys
from dataclasses import asdict, dataclass, replace
from typing import Optional

_LOG = logging.getLogger(__name__)

#: Set to 1/true/yes/on to keep mxamp from touching oneDNN's ISA.
DISABLE_ENV = "MXAMP_DISABLE_AMX"
#: The variables oneDNN reads for its ISA cap (the second is the pre-2.0 spelling).
ISA_ENV_NAMES = ("DNNL_MAX_CPU_ISA", "MKLDNN_MAX_CPU_ISA")
#: The value that lets oneDNN 2.4 dispatch to AMX kernels.
AMX_ISA = "AVX512_CORE_AMX"

_SYS_ARCH_PRCTL = 158          # x86_64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class CpuFeatures:
    """What mxamp found on this CPU and what it enabled.

    >>> CpuFeatures(avx512_bf16=True, amx_bf16=True, amx_tile=True, amx_granted=True,
    ...             amx_enabled=True, onednn_max_isa='AVX512_CORE_AMX', reason='').amx_enabled
    True
    """

    avx512_bf16: bool            #: native bf16 dot products (Cooper Lake, Sapphire Rapids, ...)
    amx_bf16: bool               #: AMX bf16 tile multiply
    amx_tile: bool               #: AMX tile registers
    amx_granted: bool            #: Linux granted this process the AMX tile state
    amx_enabled: bool            #: mxamp handed oneDNN the AMX ISA cap
    onednn_max_isa: Optional[str]  #: ISA cap oneDNN was given (by mxamp or the user), None if none
    reason: str                  #: why AMX is not enabled ('' when it is)
    mxnet_imported_first: bool = False  #: mxnet was imported before mxamp (see the import order)

    @property
    def native_bf16(self):
        """True when the CPU computes bf16 dot products in hardware (avx512_bf16 or AMX).

        Without it oneDNN emulates bf16 with AVX-512 integer code: a bf16 GEMM or convolution
        then runs about 3x (backward convolution up to 5x) SLOWER than fp32 (measured on a
        Cascade Lake Xeon), so bf16 saves memory but not time there.

        >>> CpuFeatures(False, False, False, False, False, None, 'no AMX').native_bf16
        False
        """
        return self.avx512_bf16 or self.amx_bf16

    def as_dict(self):
        """The fields (and ``native_bf16``) as a plain dict, for logs and benchmark reports.

        >>> cpu_features().as_dict()['amx_enabled'] in (True, False)
        True
        """
        return dict(asdict(self), native_bf16=self.native_bf16)


_RESULT = None  # the CpuFeatures of the one enable_amx_if_possible() call of this process


def read_cpu_flags(cpuinfo_path="/proc/cpuinfo"):
    """The feature flags of the first CPU listed in ``cpuinfo_path`` (empty if unreadable).

    >>> 'amx_bf16' in read_cpu_flags() or True
    True
    """
    try:
        with open(cpuinfo_path) as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError as err:
        _LOG.debug("cannot read %s: %s", cpuinfo_path, err)
    return frozenset()


def request_amx_permission():
    """Ask Linux for the AMX tile state; returns ``(granted, detail)``.

    Harmless to repeat, and only affects the calling process (inherited by ``fork``, reset by
    ``exec``).

    >>> granted, detail = request_amx_permission()
    >>> isinstance(granted, bool) and isinstance(detail, str)
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


def _flag_is_set(value):
    """Reads an on/off environment value; unknown words count as on, with a warning."""
    word = value.strip().lower()
    if word in _FALSE_WORDS:
        return False
    if word not in _TRUE_WORDS:
        _LOG.warning("%s=%r is not one of %s; treating it as set (AMX stays off)",
                     DISABLE_ENV, value, "/".join(_TRUE_WORDS))
    return True


def _latch_onednn_isa(isa):
    """Make oneDNN read ``DNNL_MAX_CPU_ISA=isa`` now, then take the variable out of the environment.

    oneDNN fixes its ISA cap at its first primitive; one tiny fp32 FullyConnected is that
    primitive unless one already ran (then this changes nothing, silently).
    """
    import mxnet as mx  # deferred: mxamp.cpu itself must not need MXNet to detect features

    os.environ[ISA_ENV_NAMES[0]] = isa
    try:
        data = mx.nd.ones((1, 16), ctx=mx.cpu())
        weight = mx.nd.ones((16, 16), ctx=mx.cpu())
        mx.nd.FullyConnected(data, weight, no_bias=True, num_hidden=16).wait_to_read()
    finally:
        del os.environ[ISA_ENV_NAMES[0]]


def _user_isa(environ):
    for name in ISA_ENV_NAMES:
        if environ.get(name):
            return name, environ[name]
    return None, None


def enable_amx_if_possible():
    """Let oneDNN use AMX when the CPU, the kernel and the user allow it; returns :class:`CpuFeatures`.

    ``import mxamp`` already calls it; later calls return the first result. Never raises: when
    AMX cannot be used, ``reason`` says why and oneDNN keeps its default ISA.

    >>> features = enable_amx_if_possible()
    >>> features.amx_enabled or bool(features.reason)
    True
    """
    global _RESULT
    if _RESULT is None:
        _RESULT, unexpected = _decide_and_enable()
        # WARNING only when an AMX CPU ends up without AMX against the user's wishes.
        _LOG.log(logging.WARNING if unexpected else logging.INFO, "mxamp CPU features: %s",
                 _RESULT.as_dict())
    return _RESULT


def _decide_and_enable():
    """Returns ``(CpuFeatures, unexpected)``; ``unexpected`` marks an AMX CPU left without AMX
    although the user did not opt out or choose an ISA."""
    flags = read_cpu_flags()
    found = CpuFeatures(
        avx512_bf16="avx512_bf16" in flags, amx_bf16="amx_bf16" in flags,
        amx_tile="amx_tile" in flags, amx_granted=False, amx_enabled=False,
        onednn_max_isa=None, reason="", mxnet_imported_first="mxnet" in sys.modules)

    if _flag_is_set(os.environ.get(DISABLE_ENV, "")):
        reason = "disabled by %s=%s" % (DISABLE_ENV, os.environ[DISABLE_ENV])
        return replace(found, reason=reason), False

    user_var, user_value = _user_isa(os.environ)
    if user_var is not None:
        granted = False
        if found.amx_tile and ("AMX" in user_value.upper() or user_value.upper() == "ALL"):
            granted, _ = request_amx_permission()  # keeps the user's AMX choice from SIGILL
        return replace(found, amx_granted=granted, onednn_max_isa=user_value,
                       reason="left to the user's %s=%s" % (user_var, user_value)), False

    if not found.amx_bf16:
        return replace(found, reason="this CPU has no amx_bf16 (avx512_bf16: %s)"
                       % ("yes" if found.avx512_bf16 else "no")), False

    granted, detail = request_amx_permission()
    if not granted:
        return replace(found, reason=detail), True
    try:
        _latch_onednn_isa(AMX_ISA)
    except Exception as err:  # noqa: BLE001 - a broken probe must not break `import mxamp`
        return replace(found, amx_granted=True,
                       reason="could not hand the ISA cap to oneDNN: %s" % err), True
    if found.mxnet_imported_first:
        _LOG.info("mxnet was imported before mxamp: AMX is used only if no oneDNN operator "
                  "ran before `import mxamp`")
    return replace(found, amx_granted=True, amx_enabled=True, onednn_max_isa=AMX_ISA), False


def cpu_features():
    """The CPU features mxamp found and what it enabled (see :class:`CpuFeatures`).

    >>> f = cpu_features()
    >>> f.amx_enabled == (f.reason == '')
    True
    """
    return enable_amx_if_possible()
