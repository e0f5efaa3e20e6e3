"""The machine probe: is bfloat16 faster than float32 on this CPU? Measured, not guessed.

CPU flags do not say it. The same ``native`` class computes bfloat16 at ~2x float32 on an AMD
Zen 5 and at 0.68-0.90x on a Sapphire Rapids without AMX (NOTES.md §2, §2b). So before
``target_dtype='auto'`` picks bfloat16 on a CPU whose class computes it, mxamp times three
training-shaped workloads, forward and backward, in float32 and in bfloat16: a FullyConnected,
a 3x3 Convolution, and a 3x3 Convolution followed by BatchNorm and ReLU (about 0.2-0.5 s once).
``auto`` picks bfloat16 when the geometric mean of their float32/bfloat16 time ratios is at
least :data:`MIN_SPEEDUP`.

A fourth workload, a depthwise block (1x1 Convolution, BatchNorm, ReLU, depthwise 3x3
Convolution, BatchNorm, ReLU, as MobileNet stacks them), stays out of that mean: it decides
graphs with depthwise convolutions only (:attr:`ProbeResult.depthwise_speedup`). Under AMX,
oneDNN 2.4 lays out the two convolution kinds differently and BatchNorm backward between them
falls to a reference kernel; mxamp steers it (a Reshape before BatchNorm), and the probe times
the block as mxamp runs it. On an AMX Xeon whole MobileNet 1.0 training still ran 0.51x float32
steered (0.06x unsteered); on a Zen 4 without AMX it ran 1.42x unsteered.

BatchNorm is timed after a convolution, as models run it: on its own, on a plain (NCHW) input,
oneDNN runs a generic kernel (``ncsp_bnorm:any``) that no convolutional model reaches, and an
AMD EPYC Zen 4 measured it at 0.35x float32 while the convolution and BatchNorm together ran
1.86x (probe version 1 then kept that CPU in float32).

The result is cached per machine (CPU model and vector flags, ``DNNL_MAX_CPU_ISA``, whether AMX
is in effect, threads, MXNet and mxamp versions) in ``$XDG_CACHE_HOME/mxamp/probe.json`` (else
``~/.cache/mxamp/probe.json``), so later processes reuse it. ``MXAMP_REPROBE=1`` measures again,
``MXAMP_PROBE_CACHE=0`` neither reads nor writes the cache, and ``MXAMP_PROBE=0`` turns the probe
off (``auto`` then follows the CPU class alone). ``python -m mxamp.doctor`` shows the table.

>>> from mxamp.backend import probe
>>> probe.speedup_of([('gemm', 4.0, 2.0), ('conv', 9.0, 9.0)])
1.414
"""
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field

from mxamp.backend import env
from mxamp.backend.timing import time_calls
from mxamp.backend.cpu import classify_bf16, cpu_features, onednn_enabled, read_cpu_flags

_LOG = logging.getLogger(__name__)

#: bfloat16 must be at least this much faster (geometric mean of the kernels) for 'auto'.
MIN_SPEEDUP = 1.1
#: Bump when the workloads change: older cache entries are then ignored.
PROBE_VERSION = 3
#: The probe's row for graphs with depthwise convolutions, kept out of the machine's mean.
DEPTHWISE_ROW = "Depthwise block 4x64x40x40"
_FILE = "probe.json"


@dataclass
class ProbeResult:
    """What the probe measured on this machine (``rows``: name, float32 ms, bfloat16 ms).

    >>> ProbeResult(key='k', rows=[('gemm', 2.0, 1.0)], speedup=2.0).bf16_pays
    True
    """

    key: str
    rows: list = field(default_factory=list)
    speedup: float = 0.0         #: geometric mean of float32 time / bfloat16 time
    error: str = ""              #: why bfloat16 could not be measured ('' if it was)
    seconds: float = 0.0         #: how long the measurement took
    cached: bool = False         #: read from the cache file rather than measured now

    @property
    def depthwise_speedup(self):
        """float32 time / bfloat16 time of the depthwise block, or None when not measured.

        >>> ProbeResult(key='k', rows=[(DEPTHWISE_ROW, 1.0, 2.0)]).depthwise_speedup
        0.5
        """
        for name, f32, b16 in self.rows:
            if name == DEPTHWISE_ROW and f32 > 0 and b16 > 0:
                return round(f32 / b16, 3)
        return None

    @property
    def bf16_pays(self):
        """True when bfloat16 measured at least :data:`MIN_SPEEDUP` times float32's speed."""
        return not self.error and self.speedup >= MIN_SPEEDUP

    def summary(self):
        """One line for logs and reasons.

        >>> ProbeResult(key='k', rows=[('gemm', 2.0, 4.0)], speedup=0.5).summary()
        'bfloat16 measured 0.50x float32 on this machine (probe: gemm 0.50x)'
        """
        if self.error:
            return "bfloat16 could not be measured here: %s" % self.error
        parts = ", ".join("%s %.2fx%s" % (name, f32 / b16, " (depthwise graphs only)"
                                          if name == DEPTHWISE_ROW else "")
                          for name, f32, b16 in self.rows)
        return "bfloat16 measured %.2fx float32 on this machine (probe%s: %s)" % (
            self.speedup, ", cached" if self.cached else "", parts)


def speedup_of(rows):
    """Geometric mean of float32 time / bfloat16 time over ``rows`` but the depthwise block,
    rounded to 3 places."""
    ratios = [f32 / b16 for name, f32, b16 in rows
              if f32 > 0 and b16 > 0 and name != DEPTHWISE_ROW]
    if not ratios:
        return 0.0
    return round(math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 3)


def machine_key():
    """What the probe's answer depends on, as one string (the cache key).

    >>> 'mxnet' in machine_key()
    True
    """
    import mxnet as mx
    features = cpu_features()
    flags = sorted(f for f in read_cpu_flags() if f.startswith(("avx512", "amx")))
    parts = {"cpu": features.cpu_model, "flags": " ".join(flags),
             "isa_cap": env.value("DNNL_MAX_CPU_ISA") or "", "amx": features.amx_in_effect,
             "class": features.bf16_class, "threads": env.value("OMP_NUM_THREADS") or "" or
             str(os.cpu_count()), "mxnet": mx.__version__, "mxamp": _mxamp_version(),
             "probe": PROBE_VERSION}
    return json.dumps(parts, sort_keys=True)


def _mxamp_version():
    try:
        from importlib.metadata import version
        return version("mxamp")
    except Exception:  # noqa: BLE001 - not installed as a distribution: the key just omits it
        return ""


def cache_path():
    """The cache file: ``MXAMP_PROBE_CACHE`` where it is a path, else
    ``$XDG_CACHE_HOME/mxamp/probe.json`` or ``~/.cache/mxamp/probe.json``.

    >>> cache_path().endswith('.json')
    True
    """
    given = env.path_value("MXAMP_PROBE_CACHE")
    if given:
        return os.path.abspath(os.path.expanduser(given))
    root = env.value("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "mxamp", _FILE)


def _read_cache(key):
    try:
        with open(cache_path()) as f:
            found = json.load(f).get(key)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    return ProbeResult(key=key, rows=[tuple(r) for r in found.get("rows", [])],
                       speedup=found.get("speedup", 0.0), error=found.get("error", ""),
                       seconds=found.get("seconds", 0.0), cached=True)


def _write_cache(result):
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path) as f:
                table = json.load(f)
        except (OSError, ValueError):
            table = {}
        entry = asdict(result)
        entry.pop("cached")
        table[result.key] = entry
        tmp = path + ".%d.tmp" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, path)
    except OSError as err:  # a read-only home must not break training
        _LOG.info("mxamp: cannot write the probe cache %s: %s", path, err)


def _workloads():
    """name -> function(dtype) running one forward+backward; built on MXNet's own functions."""
    import mxnet as mx
    import numpy as np
    from mxamp.dtypes import to_mx
    nd = {name: getattr(getattr(mx.nd, name), "__wrapped__", getattr(mx.nd, name))
          for name in ("FullyConnected", "Convolution", "BatchNorm", "Activation", "amp_cast",
                       "reshape")}
    rng = mx.nd.random.uniform

    def prepare(shapes, fp32_shapes, dtype):
        arrays = [nd["amp_cast"](rng(-1, 1, shape=s), dtype=to_mx(dtype)) for s in shapes]
        arrays[0].attach_grad()
        return arrays + [mx.nd.ones(s) for s in fp32_shapes]

    def run(op, shapes, fp32_shapes=(), **kwargs):
        """One forward+backward of ``op``: inputs of ``shapes`` in the dtype timed, inputs of
        ``fp32_shapes`` (BatchNorm's gamma, beta and statistics) float32 ones."""
        cache = {}

        def step(dtype):
            if dtype not in cache:
                cache[dtype] = prepare(shapes, fp32_shapes, dtype)
            args = cache[dtype]
            with mx.autograd.record():
                out = op(*args, **kwargs)
            out.backward()
            args[0].grad.wait_to_read()
        return step

    def conv_bn_relu(x, weight, gamma, beta, mean, var):
        y = nd["Convolution"](x, weight, kernel=(3, 3), pad=(1, 1), num_filter=64, no_bias=True)
        y = nd["BatchNorm"](y, gamma, beta, mean, var, fix_gamma=False)
        return nd["Activation"](y, act_type="relu")

    steer = cpu_features().bf16_class == "amx"   # as mxamp runs it there (depthwise_graphs)

    def depthwise_block(x, pointwise, depthwise, gamma, beta, mean, var):
        y = x
        for weight, groups, kernel in ((pointwise, 1, 1), (depthwise, 64, 3)):
            y = nd["Convolution"](y, weight, kernel=(kernel, kernel), pad=(kernel // 2,) * 2,
                                  num_filter=64, num_group=groups, no_bias=True)
            if steer and y.dtype != np.float32:
                y = nd["reshape"](y, shape=(-2,))   # the same Reshape the graph gets
            y = nd["Activation"](nd["BatchNorm"](y, gamma, beta, mean, var, fix_gamma=False),
                                 act_type="relu")
        return y

    return {
        DEPTHWISE_ROW: run(depthwise_block, [(4, 64, 40, 40), (64, 64, 1, 1), (64, 1, 3, 3)],
                           [(64,)] * 4),
        "FullyConnected 256x1024->1024": run(nd["FullyConnected"], [(256, 1024), (1024, 1024)],
                                             no_bias=True, num_hidden=1024),
        "Convolution 3x3 8x64x28x28": run(nd["Convolution"], [(8, 64, 28, 28), (64, 64, 3, 3)],
                                          kernel=(3, 3), pad=(1, 1), num_filter=64,
                                          no_bias=True),
        "Convolution 3x3+BatchNorm+ReLU 8x64x28x28": run(
            conv_bn_relu, [(8, 64, 28, 28), (64, 64, 3, 3)], [(64,)] * 4),
    }


#: Replaceable (tests inject timings): returns rows ``(name, float32 ms, bfloat16 ms)``.
def measure(repeats=3, low="bfloat16"):
    """Time each workload (best of ``repeats`` after a warm-up), float32 then ``low``."""
    rows = []
    for name, step in _workloads().items():
        times = {}
        for dtype in ("float32", low):
            best = time_calls(lambda: step(dtype), repeats=repeats).best  # noqa: B023
            times[dtype] = round(best * 1e3, 3)
        rows.append((name, times["float32"], times[low]))
    return rows


_RESULT = None


def machine_probe(refresh=False):
    """The :class:`ProbeResult` of this machine: from this process's memory, the cache, or a
    fresh measurement (``refresh=True`` or ``MXAMP_REPROBE=1`` measure again).

    Never raises: a bfloat16 kernel that fails shows up as ``error``.
    """
    global _RESULT
    refresh = refresh or env.flag("MXAMP_REPROBE")
    if _RESULT is not None and not refresh:
        return _RESULT
    key = machine_key()
    use_cache = env.flag("MXAMP_PROBE_CACHE")
    if use_cache and not refresh:
        cached = _read_cache(key)
        if cached is not None:
            _RESULT = cached
            return cached
    start = time.perf_counter()
    computes, why = _kernels_here()
    if not computes:
        # a failed oneDNN primitive can poison later ones in this process: never try
        _RESULT = ProbeResult(key=key, error="not run: %s" % why)
        return _RESULT
    try:
        rows = measure()
        result = ProbeResult(key=key, rows=rows, speedup=speedup_of(rows))
    except Exception as err:  # noqa: BLE001 - no kernel, or any MXNet error, means "not faster"
        result = ProbeResult(key=key, error=str(err).splitlines()[0][:200])
    result.seconds = round(time.perf_counter() - start, 3)
    _LOG.info("mxamp probe: %s (%.2f s)", result.summary(), result.seconds)
    if use_cache and not result.error:
        _write_cache(result)
    _RESULT = result
    return result


def known_result():
    """The probe's result if this process or the cache already has it, else None (never
    measures: for messages that must not cost an amp.init half a second). None as well when
    ``MXAMP_PROBE=0``: then no measurement counts, not even one made earlier.

    >>> import os
    >>> os.environ['MXAMP_PROBE'] = '0'; known_result() is None   # the probe is off
    True
    >>> del os.environ['MXAMP_PROBE']
    """
    if not probe_enabled():
        return None
    if _RESULT is not None:
        return _RESULT
    if not env.flag("MXAMP_PROBE_CACHE"):
        return None
    return _read_cache(machine_key())


def _kernels_here():
    """(True, '') when oneDNN has bfloat16 kernels in this process, judged from the CPU's real
    flags and the ISA cap (not a class a test forced), else (False, why)."""
    found, why = classify_bf16(read_cpu_flags(), env.value("DNNL_MAX_CPU_ISA"),
                               onednn=onednn_enabled())
    return found != "none", why


def probe_enabled():
    """False when ``MXAMP_PROBE=0``: 'auto' then follows the CPU class alone.

    >>> isinstance(probe_enabled(), bool)
    True
    """
    return env.flag("MXAMP_PROBE")


def forget():
    """Drop this process's memory of the probe (the cache file stays).

    >>> forget()
    """
    global _RESULT
    _RESULT = None
