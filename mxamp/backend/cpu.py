"""CPU features for bfloat16: the class of bfloat16 support oneDNN uses, and switching it to AMX.

**The bfloat16 class.** What a bfloat16 Convolution or FullyConnected does on a CPU depends on
the instructions oneDNN 2.4 (inside MXNet 1.9.1) may use, which :func:`classify_bf16` models
from the CPU's flags, the user's ``DNNL_MAX_CPU_ISA`` cap and the MXNet build:

=========== ====================================================== ==============================
class       when                                                   a bf16 GEMM/convolution
=========== ====================================================== ==============================
``none``    no AVX-512 core (AVX2 CPUs), an ISA cap below          fails: "could not create a
            ``AVX512_CORE``, or MXNet's oneDNN off/absent          primitive descriptor iterator"
``emulated`` AVX-512 core without AVX512-BF16 (or a cap below      runs, 2-5x slower than fp32
            ``AVX512_CORE_BF16``)
``native``  AVX512-BF16 (Cooper Lake, Sapphire Rapids w/o AMX)     runs in hardware
``amx``     AMX tiles, the ``AVX512_CORE_AMX`` cap and the Linux    runs on AMX tiles
            tile permission
=========== ====================================================== ==============================

The class is decided once per process (:func:`cpu_features`, a few milliseconds: one read of
``/proc/cpuinfo``, no oneDNN call) and drives what mxamp does with a bfloat16 request
(:mod:`mxamp.precision.device_plan`). oneDNN reads ``DNNL_MAX_CPU_ISA`` once, at its first primitive, with
exact, case-sensitive names (``AVX2``, ``AVX512_CORE``, ...; anything else means no cap); the
older ``MKLDNN_MAX_CPU_ISA`` spelling is ignored by oneDNN 2.x and so by this model.

**AMX is on where the CPU has it; ``MXAMP_AMX=0`` turns it off.** oneDNN 2.4 (inside MXNet
1.9.1) calls its AMX kernels initial support and leaves them off by default, so ``import mxamp``
turns them on: it asks Linux for the AMX tile state, hands oneDNN
``DNNL_MAX_CPU_ISA=AVX512_CORE_AMX`` through one tiny primitive and removes the variable again
(:mod:`mxamp.backend.amx`). On an AMX Xeon (NOTES.md section 2c) that made the README's main job
1.83x float32 where AVX512-BF16 alone ran it at 0.78x. Two known faults come with it, and mxamp
handles both on the ``amx`` class: the family of bfloat16 1x1 convolutions that corrupt the heap
stays float32 (the AMX guard, ``python -m mxamp.lists --explain Convolution``; 26 of 125 scanned
shapes crashed, all inside it), and BatchNorm between depthwise and regular convolutions, whose
backward falls to a reference kernel, is steered to a jit kernel
(:mod:`mxamp.runtime.depthwise_graphs`).

Import order: AMX is in effect when ``import mxamp`` comes before the first oneDNN operator
(FullyConnected, Convolution, Activation, BatchNorm, ...) of the process; ``import mxnet``
first is fine. Too late, oneDNN has fixed its ISA for good: :func:`cpu_features` then checks
whether AMX is *in effect* (a bfloat16 GEMM timed against float32, :mod:`mxamp.backend.amx`), reports
the class it really is, and warns once with the fix. Nothing is changed when:

- ``MXAMP_AMX=0`` (or ``MXAMP_DISABLE_AMX=1``, the 0.1.0 spelling) is set;
- the user set ``DNNL_MAX_CPU_ISA`` or ``MKLDNN_MAX_CPU_ISA`` (their choice wins; mxamp still asks
  for the tile grant when that choice names AMX, so that it cannot crash);
- the CPU lacks ``amx_bf16`` or the kernel refuses the grant (Linux < 5.16, other OS).

>>> from mxamp.backend import cpu
>>> features = cpu.cpu_features()
>>> sorted(features.as_dict())[:3]
['amx_bf16', 'amx_check', 'amx_enabled']
"""
import logging
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Optional

from mxamp.backend import env
from mxamp.backend.amx import AMX_ISA, latch_onednn_isa, request_permission, too_late_message
from mxamp.backend.amx import in_effect as amx_in_effect

_LOG = logging.getLogger(__name__)

#: On unless set to 0/false/no/off (before ``import mxamp``): oneDNN uses AMX where the CPU has it.
ENABLE_ENV = "MXAMP_AMX"
#: Set to 1/true/yes/on to keep mxamp from touching oneDNN's ISA (wins over ENABLE_ENV).
DISABLE_ENV = "MXAMP_DISABLE_AMX"
#: The variables users set for oneDNN's ISA cap. oneDNN 2.4 reads only the first; mxamp treats
#: the pre-2.0 spelling as a sign the user manages the ISA (and leaves AMX alone).
ISA_ENV_NAMES = ("DNNL_MAX_CPU_ISA", "MKLDNN_MAX_CPU_ISA")
#: MXNet 1.9's switch for its oneDNN operators (``0``/``false`` turns them off).
ONEDNN_SWITCH_ENV = "MXNET_MKLDNN_ENABLED"

#: The bfloat16 classes, from no kernels to AMX tiles (see the module docstring).
BF16_CLASSES = ("none", "emulated", "native", "amx")
#: Classes on which oneDNN computes bfloat16 in hardware (faster than float32).
NATIVE_CLASSES = ("native", "amx")

# oneDNN 2.4's DNNL_MAX_CPU_ISA values -> (allows avx512_core, allows avx512_core_bf16, allows
# AMX). "ALL" leaves AMX out: oneDNN 2.4 calls its AMX support initial and off by default.
_ISA_CAPS = {
    "ALL": (True, True, False),
    "SSE41": (False, False, False), "AVX": (False, False, False), "AVX2": (False, False, False),
    "AVX2_VNNI": (False, False, False), "AVX512_MIC": (False, False, False),
    "AVX512_MIC_4OPS": (False, False, False),
    "AVX512_CORE": (True, False, False), "AVX512_CORE_VNNI": (True, False, False),
    "AVX512_CORE_BF16": (True, True, False), "AVX512_CORE_AMX": (True, True, True),
}
# What oneDNN's mayiuse() checks (cpu_isa_traits.hpp) for each level.
_AVX512_CORE_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
_BF16_FLAGS = _AVX512_CORE_FLAGS + ("avx512_vnni", "avx512_bf16")
_AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")


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
    amx_enabled: bool            #: mxamp handed oneDNN the AMX ISA cap (asked for AMX)
    onednn_max_isa: Optional[str]  #: ISA cap oneDNN was given (by mxamp or the user), None if none
    reason: str                  #: why AMX is not enabled ('' when it is)
    mxnet_imported_first: bool = False  #: mxnet was imported before mxamp (see the import order)
    #: the bfloat16 class oneDNN uses in this process (:data:`BF16_CLASSES`); '' until decided
    bf16_class: str = ""
    bf16_reason: str = ""        #: why this class: flags, ISA cap or build, in words
    cpu_model: str = ""          #: the ``model name`` line of /proc/cpuinfo
    decided_ms: float = 0.0      #: how long deciding the class took, in milliseconds
    #: AMX tiles really compute this process's bfloat16 (asked for in time, and checked)
    amx_in_effect: bool = False
    amx_check: str = ""          #: how ``amx_in_effect`` was established, in words

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

        >>> f = CpuFeatures(True, False, False, False, False, None, 'no AMX')
        >>> f.as_dict()['native_bf16'], f.as_dict()['reason']
        (True, 'no AMX')
        """
        return dict(asdict(self), native_bf16=self.native_bf16)


_RESULT = None  # the CpuFeatures of the one enable_amx_if_possible() call of this process
_CLASSIFIED = None  # _RESULT completed with the bfloat16 class, by the first cpu_features()


def read_cpuinfo(cpuinfo_path="/proc/cpuinfo"):
    """``(model name, flags)`` of the first CPU listed in ``cpuinfo_path`` ('' and empty if
    unreadable).

    >>> model, flags = read_cpuinfo()
    >>> isinstance(model, str) and isinstance(flags, frozenset)
    True
    """
    model = ""
    try:
        with open(cpuinfo_path) as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags":
                    return model, frozenset(value.split())
    except OSError as err:
        _LOG.debug("cannot read %s: %s", cpuinfo_path, err)
    return model, frozenset()


def read_cpu_flags(cpuinfo_path="/proc/cpuinfo"):
    """The feature flags of the first CPU listed in ``cpuinfo_path`` (empty if unreadable).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile('w', suffix='cpuinfo') as f:
    ...     _ = f.write('flags : fpu avx2 amx_bf16'); f.flush()
    ...     sorted(read_cpu_flags(f.name))
    ['amx_bf16', 'avx2', 'fpu']
    """
    return read_cpuinfo(cpuinfo_path)[1]


def classify_bf16(flags, isa_cap=None, amx_granted=False, onednn=True, machine="x86_64"):
    """``(class, reason)``: what oneDNN 2.4 does with bfloat16 on a CPU with these ``flags``.

    ``isa_cap`` is the value of ``DNNL_MAX_CPU_ISA`` oneDNN reads (None: no cap; oneDNN ignores
    names it does not know), ``amx_granted`` whether Linux granted the AMX tile state,
    ``onednn`` whether MXNet's oneDNN operators are on. Pure: no MXNet, no oneDNN call.

    >>> classify_bf16({'avx2', 'fma'})[0]
    'none'
    >>> avx512 = {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_vnni'}
    >>> classify_bf16(avx512)[0], classify_bf16(avx512 | {'avx512_bf16'})[0]
    ('emulated', 'native')
    >>> classify_bf16(avx512, isa_cap='AVX2')[0]
    'none'
    """
    flags = frozenset(flags)
    if machine not in ("x86_64", "AMD64"):
        return "none", "not an x86-64 CPU (%s): MXNet's oneDNN has no bfloat16 kernels" % machine
    if not onednn:
        return "none", ("MXNet's oneDNN operators are off (%s=0, or a build without MKLDNN): "
                        "MXNet has no bfloat16 kernels of its own for GEMMs and convolutions"
                        % ONEDNN_SWITCH_ENV)
    allows_core, allows_bf16, allows_amx = _ISA_CAPS.get(isa_cap, _ISA_CAPS["ALL"])
    cap = "DNNL_MAX_CPU_ISA=%s" % isa_cap if isa_cap in _ISA_CAPS else None
    missing = [f for f in _AVX512_CORE_FLAGS if f not in flags]
    if missing:
        return "none", ("this CPU has no AVX-512 core (%s missing; it has %s); oneDNN 2.4 "
                        "implements bfloat16 only from avx512_core up"
                        % (", ".join(missing), _best_vector_isa(flags)))
    if not allows_core:
        return "none", ("%s caps oneDNN below AVX512_CORE, where oneDNN 2.4 has no bfloat16 "
                        "kernels" % cap)
    has_bf16 = all(f in flags for f in _BF16_FLAGS)
    if not has_bf16:
        return "emulated", ("AVX-512 without AVX512-BF16: oneDNN emulates bfloat16 with "
                            "AVX-512 integer code")
    if not allows_bf16:
        return "emulated", ("%s keeps oneDNN from the CPU's AVX512-BF16 instructions: it "
                            "emulates bfloat16" % cap)
    if all(f in flags for f in _AMX_FLAGS) and allows_amx:
        if amx_granted:
            return "amx", "AMX bf16 tiles enabled (%s and the Linux tile permission)" % cap
        return "amx", ("%s lets oneDNN use AMX, but Linux refused the tile permission: AMX "
                       "instructions will fault" % cap)
    why = "AVX512-BF16 instructions"
    if all(f in flags for f in _AMX_FLAGS):
        why += " (AMX present but off: oneDNN 2.4 uses it only with DNNL_MAX_CPU_ISA=" \
               "AVX512_CORE_AMX and the tile permission)"
    return "native", why


def _best_vector_isa(flags):
    for name, flag in (("AVX-512F", "avx512f"), ("AVX2", "avx2"), ("AVX", "avx"),
                       ("SSE4.1", "sse4_1")):
        if flag in flags:
            return name
    return "no AVX"


#: Ask Linux for the AMX tile state (:func:`mxamp.backend.amx.request_permission`).
request_amx_permission = request_permission
#: Make oneDNN read an ISA cap now (:func:`mxamp.backend.amx.latch_onednn_isa`).
_latch_onednn_isa = latch_onednn_isa


def _user_isa(environ=None):
    for name in ISA_ENV_NAMES:
        if env.value(name, environ):
            return name, env.value(name, environ)
    return None, None


def onednn_isa_cap(flags, environ=None, amx_enabled=None):
    """The ISA cap oneDNN will read in a process with these CPU ``flags`` once ``import mxamp``
    has run: the user's ``DNNL_MAX_CPU_ISA``, else :data:`AMX_ISA` where
    :func:`enable_amx_if_possible` will ask for AMX (or, given ``amx_enabled``, where it
    did), else None. Reads the environment only.

    The older ``MKLDNN_MAX_CPU_ISA`` caps nothing (oneDNN 2.4 ignores it), but it still tells
    mxamp that the user manages the ISA, so mxamp asks for no AMX either.

    >>> onednn_isa_cap({'amx_bf16'}, environ={})
    'AVX512_CORE_AMX'
    >>> onednn_isa_cap({'amx_bf16'}, environ={'MXAMP_AMX': '0'}) is None
    True
    >>> onednn_isa_cap({'amx_bf16'}, environ={'DNNL_MAX_CPU_ISA': 'AVX2'})
    'AVX2'
    >>> onednn_isa_cap({'amx_bf16'}, environ={'MKLDNN_MAX_CPU_ISA': 'AVX2'}) is None
    True
    >>> onednn_isa_cap({'amx_bf16'}, environ={}, amx_enabled=False) is None   # grant refused
    True
    """
    user_var, _ = _user_isa(environ)
    if user_var is not None:
        return env.value(ISA_ENV_NAMES[0], environ)
    if amx_enabled is None:
        amx_enabled = "amx_bf16" in flags and env.flag(ENABLE_ENV, environ) and \
            not env.flag(DISABLE_ENV, environ)
    return AMX_ISA if amx_enabled else None


def enable_amx_if_possible():
    """Let oneDNN use AMX where the CPU and the kernel allow it, unless ``MXAMP_AMX=0``;
    returns :class:`CpuFeatures`.

    ``import mxamp`` already calls it; later calls return the first result. Never raises: when
    AMX is not used, ``reason`` says why and oneDNN keeps its default ISA.

    >>> features = enable_amx_if_possible()
    >>> features.amx_enabled or bool(features.reason)
    True
    """
    global _RESULT
    if _RESULT is None:
        _RESULT, unexpected = _decide_and_enable()
        # WARNING only when an AMX CPU ends up without AMX that nobody turned off.
        _LOG.log(logging.WARNING if unexpected else logging.INFO, "mxamp CPU features: %s",
                 _RESULT.as_dict())
    return _RESULT


def _decide_and_enable():
    """Returns ``(CpuFeatures, unexpected)``; ``unexpected`` marks AMX that failed to turn on."""
    flags = read_cpu_flags()
    found = CpuFeatures(
        avx512_bf16="avx512_bf16" in flags, amx_bf16="amx_bf16" in flags,
        amx_tile="amx_tile" in flags, amx_granted=False, amx_enabled=False,
        onednn_max_isa=None, reason="", mxnet_imported_first="mxnet" in sys.modules)

    if env.flag(DISABLE_ENV):
        reason = "disabled by %s=%s" % (DISABLE_ENV, env.value(DISABLE_ENV))
        return replace(found, reason=reason), False

    user_var, user_value = _user_isa()
    if user_var is not None:
        granted = False
        if found.amx_tile and ("AMX" in user_value.upper() or user_value.upper() == "ALL"):
            granted, _ = request_permission()  # keeps the user's AMX choice from SIGILL
        return replace(found, amx_granted=granted, onednn_max_isa=user_value,
                       reason="left to the user's %s=%s" % (user_var, user_value)), False

    if not found.amx_bf16:
        return replace(found, reason="this CPU has no amx_bf16 (avx512_bf16: %s)"
                       % ("yes" if found.avx512_bf16 else "no")), False

    if not env.flag(ENABLE_ENV):
        return replace(found, reason="turned off by %s=%s (unset it to use AMX)"
                       % (ENABLE_ENV, env.value(ENABLE_ENV))), False

    granted, detail = request_permission()
    if not granted:
        return replace(found, reason=detail), True
    try:
        latch_onednn_isa(AMX_ISA)
    except Exception as err:  # noqa: BLE001 - a broken probe must not break `import mxamp`
        return replace(found, amx_granted=True,
                       reason="could not hand the ISA cap to oneDNN: %s" % err), True
    return replace(found, amx_granted=True, amx_enabled=True, onednn_max_isa=AMX_ISA), False


def onednn_enabled():
    """True when MXNet's oneDNN operators run: a build with MKLDNN, not switched off by env.

    >>> isinstance(onednn_enabled(), bool)
    True
    """
    if not env.flag(ONEDNN_SWITCH_ENV):
        return False
    import mxnet as mx  # deferred: detection of the CPU itself must not need MXNet
    return bool(mx.runtime.Features().is_enabled("MKLDNN"))


def cpu_features():
    """The CPU features mxamp found, what it enabled, and the bfloat16 class (see
    :class:`CpuFeatures`).

    Decided once per process, at the first call; later calls return the same object.

    >>> f = cpu_features()
    >>> f.amx_enabled == (f.reason == '')
    True
    >>> f.bf16_class in BF16_CLASSES
    True
    """
    global _CLASSIFIED
    if _CLASSIFIED is None:
        start = time.perf_counter()
        found = enable_amx_if_possible()
        model, flags = read_cpuinfo()
        # mxamp's own AMX cap was latched and removed: whether it was, is found.amx_enabled
        isa_cap = onednn_isa_cap(flags, amx_enabled=found.amx_enabled)
        bf16_class, why = classify_bf16(flags, isa_cap, found.amx_granted, onednn_enabled(),
                                        platform.machine())
        in_effect, check = False, ""
        if bf16_class == "amx":
            in_effect, check = amx_in_effect(
                found.amx_enabled and not found.mxnet_imported_first)
            if not in_effect:
                bf16_class, why = classify_bf16(flags, None, False, True, platform.machine())
                why = "AMX asked for but not in effect (%s); %s" % (check, why)
                warnings.warn(too_late_message(check), RuntimeWarning, stacklevel=2)
        _CLASSIFIED = replace(found, bf16_class=bf16_class, bf16_reason=why, cpu_model=model,
                              decided_ms=round((time.perf_counter() - start) * 1e3, 2),
                              amx_in_effect=in_effect, amx_check=check)
        _LOG.info("mxamp: CPU bfloat16 class %r (%s), decided in %.1f ms", bf16_class, why,
                  _CLASSIFIED.decided_ms)
    return _CLASSIFIED
