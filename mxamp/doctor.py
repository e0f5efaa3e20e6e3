"""``python -m mxamp.doctor``: what mixed precision does on this machine, and how fast it is.

Prints the MXNet build, the CPU and the bfloat16 class mxamp decided for it (:mod:`mxamp.backend.cpu`),
what ``amp.init`` does for each ``target_dtype`` here (:mod:`mxamp.precision.device_plan`), oneDNN's own
report of its ISA, and a few-second timing of one GEMM and one convolution in float32 and in
bfloat16 on this machine. The bfloat16 kernels are first tried in a child process: on a CPU
without them oneDNN raises ("could not create a primitive descriptor iterator"), which the
doctor reports instead of timing. A class that disagrees with what oneDNN did is flagged.

    python -m mxamp.doctor               # the report, timings included (a few seconds)
    python -m mxamp.doctor --no-timing   # the report only
    python -m mxamp.doctor --json        # the same facts as one JSON object

>>> from mxamp import doctor
>>> facts = doctor.collect(timing=False, probe=False)
>>> facts['cpu']['bf16_class'] in ('none', 'emulated', 'native', 'amx')
True
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap

import mxnet as mx

from mxamp.precision.device_plan import op_summary
from mxamp import dtypes
from mxamp._version import __version__
from mxamp.backend import env
from mxamp.backend.timing import time_calls
from mxamp.backend.cpu import cpu_features, read_cpuinfo
from mxamp.backend.graph_memory import backward_segments, storage_plans
from mxamp.backend.heap import (c_heap_arenas, cpu_temp_space, freed_pages, primitive_cache,
                                trim_policy)
from mxamp.precision.plan import precision_plan
from mxamp.backend.probe import cache_path, machine_probe

# (name, builder) of the two workloads timed: shapes of a transformer FFN and a ResNet stage.
GEMM = "FullyConnected 256x1024 @ 1024x1024"
CONV = "Convolution 3x3, 64->64 channels, 8x64x28x28"

# Run in a child with DNNL_VERBOSE=1: oneDNN's ISA line, and whether bf16 GEMM/conv run.
_PROBE = textwrap.dedent("""
    import json
    import mxnet as mx
    from mxamp import dtypes
    out = {}
    x = mx.nd.ones((4, 64)); w = mx.nd.ones((32, 64))
    mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=32).wait_to_read()
    for name, run in (
            ("gemm", lambda c: mx.nd.FullyConnected(c(x), c(w), no_bias=True, num_hidden=32)),
            ("conv", lambda c: mx.nd.Convolution(c(mx.nd.ones((1, 8, 8, 8))),
                                                 c(mx.nd.ones((8, 8, 3, 3))), kernel=(3, 3),
                                                 num_filter=8, no_bias=True))):
        try:
            run(lambda a: mx.nd.amp_cast(a, dtype=dtypes.BFLOAT16)).wait_to_read()
            out[name] = "runs"
        except mx.base.MXNetError as err:
            out[name] = str(err).splitlines()[0]
    print("RESULT " + json.dumps(out), flush=True)
""")


def _build():
    features = mx.runtime.Features()
    names = [n for n in ("MKLDNN", "CUDA", "CUDNN", "NCCL", "TENSORRT") if n in features]
    try:
        from importlib import metadata  # pylint: disable=import-outside-toplevel
        dist = next((d for d in ("mxnet", "mxnet-cu112", "mxnet-cu110", "mxnet-cu102")
                     if _has_dist(metadata, d)), "mxnet (source build?)")
    except ImportError:  # pragma: no cover - Python < 3.8
        dist = "mxnet"
    return {"mxnet": mx.__version__, "distribution": dist,
            "features": {n: features.is_enabled(n) for n in names},
            "gpus": mx.context.num_gpus() if features.is_enabled("CUDA") else 0}


def _has_dist(metadata, name):
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def _probe_onednn():
    """oneDNN's ISA line and the fate of a bf16 GEMM and convolution, from a fresh child."""
    verbose = dict(os.environ, DNNL_VERBOSE="1")
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          env=verbose, timeout=120)
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    isa = next((l.split("isa:", 1)[1] for l in lines if ",info,cpu,isa:" in l), "unknown")
    found = [json.loads(l[len("RESULT "):]) for l in lines if l.startswith("RESULT ")]
    if proc.returncode != 0 or not found:
        return {"isa": isa, "gemm": "probe failed: %s" % (proc.stderr.strip()[-300:] or
                                                           "exit %d" % proc.returncode),
                "conv": "probe failed"}
    return dict(found[0], isa=isa)


def _time(fn, seconds):
    """Median milliseconds of ``fn()`` (synchronised) over about ``seconds``."""
    # one warm-up (primitive creation, allocation), then at least 3 calls and ``seconds``
    return time_calls(lambda: fn().wait_to_read(), repeats=3, min_seconds=seconds,
                      at_most=200).median * 1e3


def _workloads(dtype_name):
    def cast(a):
        return a if dtype_name == "float32" else mx.nd.amp_cast(a, dtype=dtypes.to_mx(dtype_name))
    x, w = cast(mx.nd.random.uniform(-1, 1, (256, 1024))), cast(
        mx.nd.random.uniform(-1, 1, (1024, 1024)))
    img, k = cast(mx.nd.random.uniform(-1, 1, (8, 64, 28, 28))), cast(
        mx.nd.random.uniform(-1, 1, (64, 64, 3, 3)))
    return {
        GEMM: lambda: mx.nd.FullyConnected(x, w, no_bias=True, num_hidden=1024),
        CONV: lambda: mx.nd.Convolution(img, k, kernel=(3, 3), pad=(1, 1), num_filter=64,
                                        no_bias=True),
    }


def collect(timing=True, probe=True, seconds=0.5):
    """The doctor's facts as a dict (what ``--json`` prints).

    >>> sorted(collect(timing=False, probe=False))
    ['build', 'consistent', 'cpu', 'installed', 'mxamp', 'onednn', 'plans', 'probe', 'timing']
    """
    features = cpu_features()
    model, flags = read_cpuinfo()
    facts = {
        "mxamp": __version__,
        # mxamp.install() makes the reference's module name mean mxamp's amp (read by name:
        # the stand-in is above this command)
        "installed": getattr(sys.modules.get("mxnet.contrib.amp"), "__name__", "") == "mxamp.amp",
        "build": _build(),
        "cpu": {"model": model or "unknown", "logical_cores": os.cpu_count(),
                "vector_flags": sorted(f for f in flags if f.startswith(("avx", "amx"))),
                "DNNL_MAX_CPU_ISA": env.value("DNNL_MAX_CPU_ISA"),
                "bf16_class": features.bf16_class, "bf16_reason": features.bf16_reason,
                "decided_ms": features.decided_ms, "amx_enabled": features.amx_enabled,
                "amx_in_effect": features.amx_in_effect, "amx_check": features.amx_check,
                "amx_reason": features.reason, "temp_space": cpu_temp_space(),
                "primitive_cache": primitive_cache(), "c_heap_arenas": c_heap_arenas(),
                "freed_pages": freed_pages(),
                "backward_segments": backward_segments(),
                "storage_plans": storage_plans(),
                "heap_trim": trim_policy(), "MXAMP_TRIM_HEAP": env.value("MXAMP_TRIM_HEAP")},
        "plans": {}, "onednn": None, "timing": {}, "consistent": None, "probe": None,
    }
    places = [("cpu", mx.cpu())] + ([("gpu", mx.gpu(0))] if facts["build"]["gpus"] else [])
    for place, ctx in places:
        for target in ("float16", "bfloat16", dtypes.AUTO):
            plan = precision_plan(target, ctx)
            facts["plans"]["%s/%s" % (place, target)] = {
                "compute": plan.compute, "summary": plan.summary(),
                "fp32_ops": op_summary(plan.fp32_ops) if plan.target == "bfloat16"
                else ""}
    runs = {"gemm": "not probed", "conv": "not probed"}
    if probe:
        facts["onednn"] = _probe_onednn()
        runs = facts["onednn"]
        bf16_ran = runs["gemm"] == "runs" and runs["conv"] == "runs"
        facts["consistent"] = bf16_ran == (features.bf16_class != "none")
    if timing and probe:
        measured = machine_probe()
        facts["probe"] = {"summary": measured.summary(), "rows": measured.rows,
                          "speedup": measured.speedup, "bf16_pays": measured.bf16_pays,
                          "cached": measured.cached, "seconds": measured.seconds,
                          "cache": cache_path()}
    if timing:
        for dtype_name in ("float32", "bfloat16"):
            if dtype_name == "bfloat16" and (not probe or runs["gemm"] != "runs"):
                continue
            for name, fn in _workloads(dtype_name).items():
                if dtype_name == "bfloat16" and runs["conv" if name == CONV else "gemm"] != "runs":
                    continue
                facts["timing"].setdefault(name, {})[dtype_name] = round(_time(fn, seconds), 3)
    return facts


def _amx_line(c):
    """Whether AMX computes this process's bfloat16, and how that is known."""
    if c.get("amx_in_effect"):
        return "in effect (%s)" % c["amx_check"]
    if c.get("amx_enabled") or c.get("amx_check"):
        return "asked for but NOT in effect (%s)" % (c["amx_check"] or "unchecked")
    return "not in use (%s)" % (c.get("amx_reason") or "not asked for")


def format_report(facts):
    """The facts as the text the command prints.

    >>> 'bfloat16 class' in format_report(collect(timing=False, probe=False))
    True
    """
    return "\n".join(_machine_lines(facts) + _decision_lines(facts))


def _machine_lines(facts):
    """The report's lines on MXNet's build, the CPU and what ``import mxamp`` set."""
    b, c = facts["build"], facts["cpu"]
    on = [n for n, v in b["features"].items() if v]
    lines = ["mxamp %s doctor" % facts["mxamp"],
             "mxnet.contrib.amp is %s" % ("mxamp (mxamp.install() or python -m mxamp run)"
                                          if facts.get("installed") else "MXNet's own"),
             "MXNet %s (%s): %s; %d GPU(s)" % (b["mxnet"], b["distribution"],
                                               ", ".join(on) or "no oneDNN/CUDA", b["gpus"]),
             "CPU: %s, %s logical cores" % (c["model"], c["logical_cores"]),
             "  vector flags: %s" % (" ".join(c["vector_flags"]) or "none of avx*/amx*"),
             "  DNNL_MAX_CPU_ISA: %s" % (c["DNNL_MAX_CPU_ISA"] or "not set"),
             "  bfloat16 class: %s (%s); decided in %.1f ms" % (
                 c["bf16_class"], c["bf16_reason"], c["decided_ms"]),
             "  AMX: %s" % _amx_line(c),
             "  MXNet's CPU temp space: %s" % c.get("temp_space", "unknown"),
             "  MXNet's oneDNN primitive cache: %s" % c.get("primitive_cache", "unknown"),
             "  C heap arenas: %s" % c.get("c_heap_arenas", "unknown"),
             "  C heap's freed pages: %s" % c.get("freed_pages", "unknown"),
             "  MXNet's backward segments: %s" % c.get("backward_segments", "unknown"),
             "  MXNet's graph memory plans: %s" % c.get("storage_plans", "unknown"),
             "  C heap trim in amp.scale_loss: %s (MXAMP_TRIM_HEAP%s)" % (
                 c.get("heap_trim", "unknown"), " unset" if c.get("MXAMP_TRIM_HEAP") is None
                 else "=" + c["MXAMP_TRIM_HEAP"])]
    if facts["onednn"]:
        o = facts["onednn"]
        lines.append("  oneDNN reports: %s" % o["isa"])
        for op in ("gemm", "conv"):
            lines.append("  bfloat16 %s: %s" % (op, "runs" if o[op] == "runs"
                                                 else "no kernel (%s)" % o[op]))
        if facts["consistent"] is False:
            lines.append("  MISMATCH: the class says %r but oneDNN %s bfloat16 here; please "
                         "report this with the lines above" % (
                             c["bf16_class"], "ran" if o["gemm"] == "runs" else "refused"))
    return lines


def _decision_lines(facts):
    """The report's lines on what each target computes, the probe's rows and the timings."""
    lines = ["What amp.init(target_dtype=...) computes here:"]
    for key, plan in facts["plans"].items():
        place, target = key.split("/")
        extra = ""
        if plan["fp32_ops"] and plan["compute"] != "float32":
            extra = " (float32 on this CPU: %s)" % plan["fp32_ops"]
        lines.append("  %-4s %-10r %s%s" % (place, target, plan["summary"], extra))
    if facts.get("probe"):
        p = facts["probe"]
        lines.append("The probe 'auto' decides by (%s; %s):" % (
            "cached" if p["cached"] else "measured now, %.2f s" % p["seconds"], p["cache"]))
        for name, f32, b16 in p["rows"]:
            lines.append("  %-46s float32 %8.2f   bfloat16 %8.2f   %.2fx" % (name, f32, b16,
                                                                          f32 / b16))
        lines.append("  => %s; 'auto' on this CPU: %s" % (
            p["summary"], "bfloat16" if p["bf16_pays"] else "float32"))
    if facts["timing"]:
        lines.append("Timing on this machine (median ms; float32 vs bfloat16):")
        for name, row in facts["timing"].items():
            f32, b16 = row.get("float32"), row.get("bfloat16")
            if b16 is None:
                lines.append("  %-46s float32 %8.2f   bfloat16: no kernel here" % (name, f32))
            else:
                lines.append("  %-46s float32 %8.2f   bfloat16 %8.2f   bf16 is %.2fx %s" % (
                    name, f32, b16, max(f32, b16) / min(f32, b16),
                    "faster" if b16 < f32 else "slower"))
    return lines


def main(argv=None):
    """Entry point of ``python -m mxamp.doctor``; returns the exit status (1 on a mismatch)."""
    parser = argparse.ArgumentParser(prog="python -m mxamp.doctor", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--no-timing", action="store_true", help="skip the GEMM/conv timing")
    parser.add_argument("--seconds", type=float, default=0.5,
                        help="time spent timing each kernel (default 0.5)")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.add_argument("--reprobe", action="store_true",
                        help="measure the probe again instead of reading its cache")
    args = parser.parse_args(argv)
    if args.reprobe:
        os.environ["MXAMP_REPROBE"] = "1"
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    facts = collect(timing=not args.no_timing, seconds=args.seconds)
    print(json.dumps(facts, indent=2) if args.json else format_report(facts))
    return 1 if facts["consistent"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
