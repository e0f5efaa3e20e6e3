"""Where to steer BatchNorm's layout on an AMX CPU: mxamp's Reshape before it, against ops after
it, on a MobileNet unit in bfloat16 (MXNet's own functions, no AMP), forward and backward.

With AMX, oneDNN 2.4 lays 1x1 convolutions out as nhwc and depthwise ones as nChw16c. A
BatchNorm between the two gets its input in one layout and its gradient in the other, and its
backward runs the reference kernel ``bnorm_ref`` (NOTES.md 2c). MXNet reorders one side only
when that side is plain (``mkldnn_batch_norm-inl.h``), so any op that hands BatchNorm a plain
input or a plain gradient steers it. Each costs something else (the AMX Xeon's verbose output
for mxamp's Reshape: BatchNorm forward on the plain layout, ``ncsp_bnorm``, a quarter of the
primitive time; reorders another third):

* ``none``: nothing; on AMX the backward runs ``bnorm_ref``;
* ``reshape_before``: MXNet's Reshape to the same shape before BatchNorm (what mxamp does):
  BatchNorm's input is plain, so forward runs ``ncsp_bnorm``;
* ``clip_after_bn``: ``clip`` after BatchNorm. ``clip`` has no oneDNN kernel, so MXNet hands it
  a plain copy and its backward returns a plain gradient: BatchNorm keeps the convolution's
  layout forward, and its gradient is reordered to it;
* ``scale_after_relu``: ``x * 1`` (``_mul_scalar``, no oneDNN kernel either) after the ReLU that
  follows BatchNorm, so BatchNorm and the ReLU both keep the convolution's layout forward.

Every variant computes the same function (the ops are identities; other BatchNorm kernels round
otherwise: output sums agree to 2e-6). Each runs in its own process
that imports mxamp first (no ``amp.init``), so AMX is in effect where mxamp grants it: the median
forward+backward ms of 8 passes after 2, and with ``--kernels`` the count of oneDNN's BatchNorm
kernels and reorders from its verbose output. On a CPU without AMX no mismatch arises, so only
the variants' own costs show (a Zen 4: ``results/native-amd-epyc-zen4/bn-steering-*.md``).

    python benchmark/bench_bn_steering.py
    python benchmark/bench_bn_steering.py --kernels       # DNNL_VERBOSE=1 in the children
"""
import argparse
import collections
import json
import os
import subprocess
import sys

from bench_bn_layout import pass_times

VARIANTS = ("float32", "none", "reshape_before", "clip_after_bn", "scale_after_relu")
SHAPE, CHANNELS = (4, 64, 56, 56), 64


def _unit(variant):
    import mxnet as mx

    def bn_relu(y, stats):
        if variant == "reshape_before":
            y = mx.nd.reshape(y, shape=(-2,))
        y = mx.nd.BatchNorm(y, *stats, fix_gamma=False)
        if variant == "clip_after_bn":
            y = mx.nd.clip(y, -3e38, 3e38)
        y = mx.nd.Activation(y, act_type="relu")
        return y * 1.0 if variant == "scale_after_relu" else y

    def run(x, weights, stats):
        pointwise, depthwise, last = weights
        y = mx.nd.Convolution(x, pointwise, kernel=(1, 1), num_filter=CHANNELS, no_bias=True)
        y = bn_relu(y, stats[0])
        y = mx.nd.Convolution(y, depthwise, kernel=(3, 3), pad=(1, 1), num_filter=CHANNELS,
                              num_group=CHANNELS, no_bias=True)
        y = bn_relu(y, stats[1])
        y = mx.nd.Convolution(y, last, kernel=(1, 1), num_filter=CHANNELS, no_bias=True)
        return bn_relu(y, stats[2])
    return run


def child(variant, passes=8, warmup=2):
    """Time ``variant`` in this process; print one RESULT line."""
    from mxamp.backend import cpu   # import mxamp: its AMX grant, where the CPU has AMX
    import mxnet as mx
    import numpy as np
    dtype = "float32" if variant == "float32" else np.dtype([("bfloat16", np.uint16)])
    mx.random.seed(0)

    def arr(shape, scale):
        return mx.nd.amp_cast(mx.nd.random.uniform(-scale, scale, shape=shape), dtype=dtype)
    x = arr(SHAPE, 1)
    weights = [arr((CHANNELS, CHANNELS, 1, 1), .1), arr((CHANNELS, 1, 3, 3), .3),
               arr((CHANNELS, CHANNELS, 1, 1), .1)]
    for w in weights:
        w.attach_grad()
    stats = [[mx.nd.ones((CHANNELS,)) for _ in range(4)] for _ in range(3)]
    unit = _unit(variant)
    times, y = pass_times(lambda: unit(x, weights, stats), warmup + passes)
    out = float(mx.nd.amp_cast(y, dtype="float32").sum().asscalar())
    print("RESULT " + json.dumps({"variant": variant, "ms": 1e3 * float(np.median(times[warmup:])),
                                  "sum": out, "amx": cpu.cpu_features().amx_in_effect}),
          flush=True)


def kernel_counts(verbose_text):
    """oneDNN's BatchNorm kernels (``impl/propagation``) and reorders, counted from its verbose
    lines (``dnnl_verbose,exec,cpu,PRIMITIVE,IMPL,PROP,...``)."""
    counts = collections.Counter()
    for line in verbose_text.splitlines():
        fields = line.split(",")
        if len(fields) > 5 and fields[1] == "exec":
            if fields[3] == "batch_normalization":
                counts["%s/%s" % (fields[4].split(":")[0], fields[5])] += 1
            elif fields[3] == "reorder":
                counts["reorder"] += 1
    return dict(counts)


def run_variant(variant, kernels):
    env = dict(os.environ, DNNL_VERBOSE="1" if kernels else "0")
    done = subprocess.run([sys.executable, __file__, "--child", variant], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"variant": variant, "error": (done.stderr or done.stdout)[-300:]}
    result = json.loads(lines[-1][len("RESULT "):])
    if kernels:
        result["kernels"] = kernel_counts(done.stdout)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=VARIANTS)
    parser.add_argument("--kernels", action="store_true",
                        help="also count oneDNN's kernels (DNNL_VERBOSE=1; times include it)")
    parser.add_argument("--only", type=lambda s: s.split(","), default=list(VARIANTS))
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    print("| variant, %s | ms (fwd+bwd) | vs float32 | output sum | AMX | kernels |" % "x".join(
        map(str, SHAPE)))
    print("|---|---|---|---|---|---|")
    results = [run_variant(v, args.kernels) for v in args.only]
    base = next((r["ms"] for r in results if r["variant"] == "float32" and "ms" in r), None)
    for r in results:
        if "error" in r:
            print("| %s | failed: %s | | | | |" % (r["variant"], " ".join(r["error"].split())))
            continue
        ratio = "%.2fx" % (base / r["ms"]) if base else "-"
        print("| %s | %.2f | %s | %.3f | %s | %s |" % (r["variant"], r["ms"], ratio, r["sum"],
                                                      r["amx"], r.get("kernels", "")))
    print("RESULT " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
