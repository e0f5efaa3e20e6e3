"""What one device computes for a low-precision request: the class rules and the probe's verdict.

MXNet runs an operator in low precision only where it has a kernel for it, and low precision
only pays where the hardware computes it. :func:`device_plan` turns a request (``'float16'``,
``'bfloat16'`` or ``'auto'``), its resolved op lists and a device (``'gpu'``, or this CPU's
bfloat16 class from :mod:`mxamp.backend.cpu`) into a :class:`DevicePlan`: which ops compute in float32
there whatever their list says, which shapes must (the AMX guard), and whether anything runs in
low precision at all. :mod:`mxamp.precision.plan` makes one per device a model runs on; entry points read
them from there.

============ ========== ======================== ==================== =======================
request      GPU        CPU ``amx``/``native``   CPU ``emulated``     CPU ``none``
============ ========== ======================== ==================== =======================
'float16'    float16    float32 (no float16 CPU GEMM/convolution kernels; GPU scripts run)
'bfloat16'   bfloat16   bfloat16                 bfloat16, slower     float32: no kernels
'auto'       float16    bfloat16 where measured  float32              float32
                        faster (:mod:`mxamp.backend.probe`)
============ ========== ======================== ==================== =======================

Graphs with depthwise convolutions get one more decision, their treatment
(:attr:`DevicePlan.depthwise_graphs`), which the hybridized-block hook applies when such a graph
is built (:mod:`mxamp.runtime.depthwise_graphs`): on ``amx``, BatchNorm is steered off oneDNN
2.4's reference backward kernel (``STEER_BATCHNORM``); under ``'auto'``, where the probe's
depthwise block measured bfloat16 slower than float32, the whole graph computes in float32
(``FLOAT32_GRAPH``). Graphs with a global pooling that feeds a convolution (squeeze-excitation
gates) get theirs (:attr:`DevicePlan.pooling_graphs`, :mod:`mxamp.runtime.pooling_graphs`): on
``native`` and ``emulated``, a Reshape before that pooling or a float32 ``mean`` in its place
keeps its backward, and the BatchNorm's before it, off oneDNN's reference kernels. There too,
a ReLU6 after a BatchNorm (MobileNet V2) is computed without MXNet's branching ``clip`` kernel
(:attr:`DevicePlan.clip_graphs`, :mod:`mxamp.runtime.clip_graphs`).

Where a plan computes in float32, AMP stays on: ``amp.init_trainer``'s scaler still skips
steps with non-finite gradients, and a model behaves, bit for bit, as in float32.

>>> from mxamp.precision import device_plan as devices
>>> from mxamp.lists import get_op_lists
>>> device_plan('bfloat16', get_op_lists('bfloat16'), 'none').compute
'float32'
>>> device_plan('bfloat16', get_op_lists('bfloat16'), 'amx').compute
'bfloat16'
"""
from dataclasses import dataclass, field

from mxamp import dtypes
from mxamp.backend.cpu import BF16_CLASSES, NATIVE_CLASSES, cpu_features
from mxamp.backend.devices import GPU, cpu_class
from mxamp.backend.probe import MIN_SPEEDUP, known_result, machine_probe, probe_enabled
from mxamp.errors import AmpArgumentError
from mxamp.lists.bfloat16 import FP32_ON_EVERY_CPU
from mxamp.lists.float16 import NO_CPU_KERNEL_WHY
from mxamp.runtime.clip_graphs import BRANCH_FREE_RELU6
from mxamp.runtime.depthwise_graphs import (FLOAT32_BATCHNORM_AT_GROUPS, FLOAT32_GRAPH,
                                            STEER_BATCHNORM)
from mxamp.runtime.pooling_graphs import STEER_POOLING


@dataclass(frozen=True)
class DevicePlan:
    """What one low-precision request computes on one device.

    >>> from mxamp.lists import get_op_lists
    >>> p = device_plan('float16', get_op_lists('float16'), 'emulated')
    >>> p.low_precision, 'FullyConnected' in p.fp32_ops
    (False, True)
    """

    requested: str               #: 'float16', 'bfloat16' or 'auto'
    target: str                  #: the op lists in force: 'float16' or 'bfloat16'
    device: str                  #: 'gpu' or a CPU bfloat16 class
    compute: str                 #: what the low-precision ops compute in here: target or 'float32'
    fp32_ops: frozenset          #: ops computed in float32 here whatever their category
    reason: str                  #: why low precision is off or slower here ('' when neither)
    #: op -> conditions (mxamp.lists.conditions) under which it computes in float32 here: shapes
    #: whose low-precision kernel is broken on this CPU class (e.g. AMX's 1x1 convolutions)
    fp32_when: dict = field(default_factory=dict, compare=False)
    #: what a graph with depthwise convolutions gets here: '', STEER_BATCHNORM or FLOAT32_GRAPH
    depthwise_graphs: str = ""
    #: what a graph with a global pooling into a convolution gets here: '' or STEER_POOLING
    pooling_graphs: str = ""
    #: what a graph with a ReLU6 after a BatchNorm gets here: '' or BRANCH_FREE_RELU6
    clip_graphs: str = ""

    @property
    def low_precision(self):
        """True when some op computes in the target dtype on this device."""
        return self.compute != "float32"

    def summary(self):
        """What runs, in a few words: for tables and reports.

        >>> from mxamp.lists import get_op_lists
        >>> device_plan('bfloat16', get_op_lists('bfloat16'), 'none').summary()
        'bfloat16 requested; float32 compute: this CPU has no bfloat16 kernels'
        >>> device_plan('bfloat16', get_op_lists('bfloat16'), 'amx').summary()
        'bfloat16 compute (AMX)'
        """
        if not self.low_precision:
            return "%s requested; float32 compute: %s" % (self.requested, self.reason)
        how = {"amx": " (AMX)", "native": " (AVX512-BF16)", "gpu": " (GPU)"}.get(self.device, "")
        if self.device == "emulated":
            how = ", emulated by oneDNN: slower than float32"
        return "%s compute%s" % (self.compute, how)

    def describe(self):
        """One line for logs: the request, the device and what runs.

        >>> from mxamp.lists import get_op_lists
        >>> print(device_plan('bfloat16', get_op_lists('bfloat16'), 'native').describe())
        ... # doctest: +NORMALIZE_WHITESPACE
        target_dtype='bfloat16' on a CPU of class 'native': bfloat16 compute (AVX512-BF16);
        graphs with grouped or depthwise convolutions: float32 BatchNorm at grouped convolutions;
        global average pooling into convolutions steered off reference kernels;
        ReLU6 after BatchNorm computed without branches
        """
        where = "a GPU" if self.device == GPU else "a CPU of class %r" % self.device
        what = self.summary()
        if not self.low_precision:
            what = "float32 compute (%s)" % self.reason
        if self.depthwise_graphs:
            what += "; graphs with grouped or depthwise convolutions: %s" % self.depthwise_graphs
        for treatment in (self.pooling_graphs, self.clip_graphs):
            if treatment:
                what += "; " + treatment
        return "target_dtype=%r on %s: %s" % (self.requested, where, what)


def target_for(requested, device):
    """The op lists a request (any spelling ``amp.init`` takes) uses on a device: ``'auto'`` is
    float16 on a GPU, else bfloat16.

    >>> target_for('auto', 'gpu'), target_for('auto', 'emulated'), target_for('float16', 'none')
    ('float16', 'bfloat16', 'float16')
    """
    requested = dtypes.normalize_request(requested)
    if requested != dtypes.AUTO:
        return requested
    return "float16" if device == GPU else "bfloat16"


#: Why 'auto' computes in float32 on an AMX CPU whose AMX is off (class 'native' there).
WHY_AMX_OFF = ("this CPU has AMX but it is not in effect (MXAMP_AMX=0, your own "
               "DNNL_MAX_CPU_ISA, or mxamp imported after MXNet's first oneDNN operator); "
               "bfloat16 without AMX measured 0.68-0.90x float32's speed on an AMX Xeon")


def amx_idle_here(device):
    """True when ``device`` is this CPU, it has AMX tiles, and AMX is not in effect: bfloat16
    then runs on AVX512-BF16, which on Sapphire Rapids is slower than float32.

    >>> amx_idle_here('gpu')
    False
    """
    if device != "native" or device != cpu_class():
        return False
    features = cpu_features()
    return features.amx_bf16 and not features.amx_in_effect


_WHY_FLOAT32 = {
    "float16": "float16 is computed on GPUs only: " + NO_CPU_KERNEL_WHY,
    "none": "this CPU has no bfloat16 kernels",
    "emulated": "this CPU only emulates bfloat16, slower than float32",
}


def device_plan(requested, lists, device, float32_because=""):
    """The :class:`DevicePlan` of ``requested`` with ``lists`` (its target's op lists) on
    ``device``. ``float32_because`` (a tuned policy's choice, say) keeps every low-precision
    op in float32 there, for that reason.

    >>> from mxamp.lists import get_op_lists
    >>> p = device_plan('bfloat16', get_op_lists('bfloat16'), 'none')
    >>> p.compute, {'Convolution', 'transpose'} <= p.fp32_ops   # no kernel here; none anywhere
    ('float32', True)
    """
    if device != GPU and device not in BF16_CLASSES:
        raise AmpArgumentError("device must be %r or a CPU class %s, got %r"
                               % (GPU, BF16_CLASSES, device))
    low, measured = frozenset(lists.low_precision), None
    if device == GPU:
        fp32_ops, reason = frozenset(), ""
    elif lists.target == "float16":
        fp32_ops, reason = low, _WHY_FLOAT32["float16"]
    else:
        fp32_ops = frozenset(lists.missing_kernels(device)) | lists.fp32_on_every_cpu
        reason = _WHY_FLOAT32.get(device, "")
        if requested == dtypes.AUTO and device not in NATIVE_CLASSES:
            fp32_ops |= low
        elif requested == dtypes.AUTO and device == cpu_class() and probe_enabled():
            measured = machine_probe()       # the class computes bfloat16: is it faster here?
            if not measured.bf16_pays:
                fp32_ops |= low
                reason = measured.summary()
        elif requested == dtypes.AUTO and amx_idle_here(device):
            fp32_ops |= low
            reason = WHY_AMX_OFF
    if float32_because:
        fp32_ops, reason = fp32_ops | low, float32_because
    compute = lists.target if low - fp32_ops else "float32"
    if compute != "float32" and device != "emulated":
        reason = ""
    fp32_when = {}
    if device != GPU and compute != "float32":
        fp32_when = {op: conds for op, conds in lists.fp32_when(device).items()
                     if op not in fp32_ops}
    depthwise = _depthwise_treatment(requested, device, compute, measured)
    return DevicePlan(requested=requested, target=lists.target, device=device, compute=compute,
                      fp32_ops=fp32_ops, reason=reason, fp32_when=fp32_when,
                      depthwise_graphs=depthwise, pooling_graphs=_pooling_treatment(device, compute),
                      clip_graphs=_clip_treatment(device, compute))


def _depthwise_treatment(requested, device, compute, measured):
    """The treatment of graphs with grouped convolutions: float32 where 'auto' measured the
    depthwise block slower in bfloat16, BatchNorm steering on AMX, float32 BatchNorm at
    grouped convolutions off 16-channel blocks without AMX, else ''.

    >>> _depthwise_treatment('bfloat16', 'amx', 'bfloat16', None)
    'steer BatchNorm'
    """
    if device == GPU or compute == "float32":
        return ""
    depthwise = measured.depthwise_speedup if measured is not None else None
    if requested == dtypes.AUTO and depthwise is not None and depthwise < 1.0:
        return FLOAT32_GRAPH
    if device == "amx":
        return STEER_BATCHNORM
    return FLOAT32_BATCHNORM_AT_GROUPS if device in ("native", "emulated") else ""


def _pooling_treatment(device, compute):
    """The treatment of graphs with a global pooling into a convolution: steered where
    bfloat16 computes without AMX (measured there), else '' (AMX: not measured yet; GPU: no
    oneDNN).

    >>> _pooling_treatment('native', 'bfloat16'), _pooling_treatment('amx', 'bfloat16')
    ('global average pooling into convolutions steered off reference kernels', '')
    """
    return _where_measured(device, compute, STEER_POOLING)


def _clip_treatment(device, compute):
    """The treatment of graphs with a ReLU6 after a BatchNorm: computed without branches where
    bfloat16 computes without AMX (measured there), else '' (AMX: not measured yet; GPU: the
    cost is a CPU branch predictor's, and the rewrite's layout reasoning is oneDNN's).

    >>> _clip_treatment('emulated', 'bfloat16'), _clip_treatment('native', 'float32')
    ('ReLU6 after BatchNorm computed without branches', '')
    """
    return _where_measured(device, compute, BRANCH_FREE_RELU6)


def _where_measured(device, compute, treatment):
    """``treatment`` where bfloat16 computes on a class the graph treatments were measured on
    (``native``, ``emulated``), else ''."""
    return treatment if compute != "float32" and device in ("native", "emulated") else ""


# --------------------------------------------------------------------------------- notices


def cpu_notice(dplan):
    """The warning a bfloat16 plan on this CPU deserves, or '' (GPU, 'auto', native without
    AMX hardware).

    Every speed claim is the one true for the class it names.

    >>> from mxamp.lists import get_op_lists
    >>> lists = get_op_lists('bfloat16')
    >>> 'no bfloat16 kernels' in cpu_notice(device_plan('bfloat16', lists, 'none'))
    True
    >>> cpu_notice(device_plan('auto', get_op_lists('bfloat16'), 'none'))
    ''
    """
    p = dplan
    if p.device == GPU or p.target != "bfloat16" or p.requested == dtypes.AUTO:
        return ""
    why = cpu_features().bf16_reason if p.device == cpu_class() else ""
    if p.device == "none":
        return ("mxamp: bfloat16 requested, but this CPU has no bfloat16 kernels (CPU class "
                "'none'%s). mxamp computes the ops that lack one (%s) in float32 with their "
                "inputs cast, so nothing is faster than float32 here: amp.init and "
                "convert_hybrid_block give float32's results, cast_model keeps bfloat16 "
                "parameters with float32 compute (slower than float32; more memory where weights "
                "outweigh activations, as autograd keeps their float32 copies). AMP stays on "
                "(the loss scaler still skips non-finite steps). target_dtype='auto' picks float32."
                % (": " + why if why else "", op_summary(p.fp32_ops - set(FP32_ON_EVERY_CPU))))
    if p.device == "native" and amx_idle_here(p.device):
        features = cpu_features()
        if features.amx_enabled and not features.amx_in_effect:
            return ""  # mxamp turned AMX on too late: cpu_features() has warned once already
        return ("mxamp: bfloat16 runs WITHOUT AMX in this process (%s): oneDNN uses "
                "AVX512-BF16, which measured 0.68-0.90x float32's speed on an AMX Xeon. Unset "
                "MXAMP_AMX (AMX is on by default: 1.8x float32 on the README's main job there), "
                "or use target_dtype='auto', which computes in float32 here."
                % (cpu_features().reason or cpu_features().bf16_reason))
    measured = known_result() if p.device in NATIVE_CLASSES and p.device == cpu_class() \
        else None
    if measured is not None and not measured.error and not measured.bf16_pays:
        verdict = "SLOWER than float32" if measured.speedup < 1.0 else (
            "no faster than float32 (below the %.1fx 'auto' asks for)" % MIN_SPEEDUP)
        return ("mxamp: bfloat16 was measured %s on this machine: %s. "
                "target_dtype='auto' computes in float32 here; amp.tune(net, batch) finds "
                "whether some layers still gain." % (verdict, measured.summary()))
    if p.device == "amx":
        return ("mxamp: bfloat16 on AMX tiles (in effect: %s). oneDNN 2.4's AMX support is "
                "initial, and mxamp works around it: 1x1 convolutions of the shapes that corrupt "
                "the heap stay float32 (python -m mxamp.lists --explain Convolution), and in "
                "models with depthwise convolutions BatchNorm backward is steered off its "
                "reference kernel, hybridized or not; such models still measured about "
                "0.5x float32 (MobileNet 1.0 training), so target_dtype='auto' keeps them in "
                "float32 when the probe's depthwise block is slower in bfloat16, and "
                "amp.tune(net, batch) times your own model and keeps float32 where bfloat16 "
                "loses. MXAMP_AMX=0 turns AMX off."
                % (cpu_features().amx_check or "unchecked"))
    if p.device == "emulated":
        return ("mxamp: this CPU emulates bfloat16 (CPU class 'emulated'%s): bfloat16 runs "
                "correctly but SLOWER than float32 here (2-5x for GEMMs and convolutions, "
                "measured on a Cascade Lake Xeon). target_dtype='auto' computes in float32 on "
                "this CPU." % (": " + why if why else ""))
    return ""


def op_summary(ops):
    """Op names for a message: the public names, leaving out ``_npx_``/``_sg_`` aliases.

    >>> op_summary({'Convolution', '_npx_convolution', 'BatchNorm'})
    'BatchNorm, Convolution'
    """
    main = sorted(o for o in ops if not o.startswith("_"))
    return ", ".join(main) if main else ", ".join(sorted(ops))
