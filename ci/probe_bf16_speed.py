#!/usr/bin/env python
"""Time MXNet's bfloat16 CPU kernels against float32's: which ops are too slow to run in bf16.

``ci/probe_bf16_kernels.py`` asks whether a bfloat16 kernel works; this asks whether it pays.
MXNet 1.9.1 computes bfloat16 in two ways: oneDNN (Convolution, FullyConnected, BatchNorm,
Activation, Pooling, elemwise_add, Concat, ...) and its own generic kernels, which convert
each element to float and back in scalar code. On a Zen 4 the generic ones ran 5-30x slower
than float32 (``_mul_scalar`` 12x, ``clip`` 16x, ``elemwise_mul`` 24x, ``broadcast_add`` 12x,
forward and backward), and a model full of them (MobileNetV3: hard-swish, squeeze-excitation)
trained 3x slower in bfloat16 than in float32.

For every op the bf16 lists run in the input's dtype (neutral, widest, conditional), a forked
child feeds the probe's recipe, scaled to activation size (about 400,000 elements), in float32
and in bfloat16, and times forward plus backward (forward alone where the op has no gradient),
best of ``--repeats`` alternating runs. Computing such an op in float32 instead costs a cast
of its input and, where a bfloat16 op consumes it, one back: the child times that cast
(``amp_cast`` forward and backward, same shape). The verdict is ``slow`` when

    bf16 time > 1.25 x (float32 time + 2 x cast time)

(the 1.25 keeps timing noise out), else ``pays``. ``mxamp/lists/bfloat16.py`` computes the
``slow`` ops in float32 (``SLOW_BF16``); ``tests/test_slow_kernels.py`` checks that
list against the last full run, kept in ``ci/probe_results_bfloat16_speed.txt``.

Usage::

    python ci/probe_bf16_speed.py                         # the listed ops, ~2.5 min on 2 cores
    python ci/probe_bf16_speed.py --ops clip,Activation --out /tmp/speed.txt

Exit status 0; the table is the result. Run it on a quiet machine.
"""
import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402
from probe_bf16_kernels import (  # noqa: E402  (lives beside us)
    BFLOAT16, GRAD_KINDS, _call, _drain_errors, _listed_ops, _make_inputs, _op_info, _to_nd,
    forward_ops, one_name_per_op, run_forked)
from probe_recipes import GENERIC_SHAPES, IMG, RANDOM_OP, recipes_for  # noqa: E402

#: Activation-sized shapes that replace the recipes' small ones (401,408 elements each).
BIG = {GENERIC_SHAPES[0]: (3136, 128), GENERIC_SHAPES[1]: (8, 64, 28, 28), IMG: (8, 64, 28, 28)}
#: The second input of a broadcasting binary op in its broadcast form (a per-channel gate).
GATE = (8, 64, 1, 1)
#: bf16 must lose by more than this factor on top of the casts to be called slow.
MARGIN = 1.25
CASTS = 2
#: Ops AMP never moves, whatever their speed: casts (they are the conversions themselves) and
#: MXNet's internal gradient accumulation. Image pre-processing ops (reason ``R_IMG``) neither.
KEPT = ("Cast", "amp_cast", "amp_multicast", "_grad_add")
#: Keyword arguments sized for the recipes' small shapes: such recipes are not scaled.
SIZED_KWARGS = ("shape", "begin", "end", "size", "indices", "reps", "repeats", "sections",
                "lhs_", "rhs_", "length")


def speed_recipes(name, canonical, fp32_when=None):
    """The op's recipes at activation size: those whose every input has a small shape the
    table :data:`BIG` scales and a float or 0/1 kind. Broadcasting binary ops also get a
    broadcast form (second input :data:`GATE`)."""
    scaled = []
    for specs, kwargs in recipes_for(name, canonical):
        if any(word in key for key in kwargs for word in SIZED_KWARGS):
            continue        # sized for the small shapes (a target shape, begin/end, ...)
        if fp32_when and str(kwargs.get(fp32_when[0])) in fp32_when[1]:
            continue        # a case the lists already compute in float32
        if all(spec[0] in "fnb" and tuple(spec[1]) in BIG for spec in specs):
            big = [(spec[0], BIG[tuple(spec[1])]) + tuple(spec[2:]) for spec in specs]
            scaled.append((big, kwargs))
    if scaled and "broadcast" in canonical and len(scaled[0][0]) == 2:
        four_d = [r for r in scaled if len(r[0][0][1]) == 4]
        if four_d:
            specs, kwargs = four_d[0]
            scaled.append(([specs[0], (specs[1][0], GATE)], kwargs))
    return scaled


def _time(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        mx.nd.waitall()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _step_fn(handle, arrays, kwargs, np_op, kinds):
    """One forward (and backward where the op has a float output with a gradient)."""
    wrt = [i for i, kind in enumerate(kinds) if kind in GRAD_KINDS]
    for i in wrt:
        arrays[i].attach_grad()

    def forward_backward():
        with mx.util.np_shape(np_op), mx.util.np_array(np_op):
            with mx.autograd.record():
                outs = _call(handle, arrays, kwargs, np_op)
            heads = [o for o in outs if o.dtype in (np.float32, BFLOAT16)]
            if heads and wrt:
                mx.autograd.backward(heads)

    def forward():
        with mx.util.np_shape(np_op), mx.util.np_array(np_op):
            _call(handle, arrays, kwargs, np_op)

    for fn, what in ((forward_backward, "fwd+bwd"), (forward, "fwd")):
        try:
            fn()
            mx.nd.waitall()
            return fn, what
        except Exception:  # noqa: BLE001 - no gradient here: try the forward alone
            _drain_errors()
    raise ValueError("the recipe does not run at this size")


def _cast_ms(shape, repeats):
    x = mx.nd.amp_cast(mx.nd.ones(shape), dtype=BFLOAT16)
    x.attach_grad()

    def cast():
        with mx.autograd.record():
            y = mx.nd.amp_cast(x, dtype="float32")
        y.backward()
    cast()
    return _time(cast, repeats)


def _child_time(name, canonical, widest, repeats, fp32_when=None):
    np_op = name.startswith(("_np", "_npi", "_npx"))
    if RANDOM_OP.search(canonical):
        return {"status": "skipped", "detail": "random output"}
    rows = []
    for number, (specs, kwargs) in enumerate(speed_recipes(name, canonical, fp32_when)):
        host = _make_inputs(specs, "bfloat16", np.random.default_rng(7 + number), widest)
        kinds = [spec[0] for spec in specs]
        try:
            steps = {dt: _step_fn(_op_info(name)[0], [_to_nd(v, "float32" if f == "bfloat16"
                                                              else f) if dt == "float32" else
                                                      _to_nd(v, f) for v, f in host],
                                  kwargs, np_op, kinds) for dt in ("float32", "bfloat16")}
        except Exception:  # noqa: BLE001 - this recipe does not fit at this size
            continue
        times = {"float32": float("inf"), "bfloat16": float("inf")}
        for _ in range(repeats):        # alternate, so drift hits both alike
            for dt in times:
                times[dt] = min(times[dt], _time(steps[dt][0], 1))
        cast = _cast_ms(specs[0][1], repeats)
        slow = times["bfloat16"] > MARGIN * (times["float32"] + CASTS * cast)
        rows.append((slow, times["float32"], times["bfloat16"], cast, steps["bfloat16"][1],
                     "x".join(str(s[1]) for s in specs).replace(" ", "")))
    if not rows:
        return {"status": "skipped", "detail": "no recipe scales to activation size"}
    slow, fp32, bf16, cast, what, shapes = max(rows, key=lambda r: r[2] / r[1])
    return {"status": "slow" if any(r[0] for r in rows) else "pays",
            "detail": "fp32 %.2f ms, bf16 %.2f ms (%.1fx), cast %.2f ms, %s %s" % (
                fp32, bf16, bf16 / fp32, cast, what, shapes),
            "ratio": round(bf16 / fp32, 2)}


def _kept_because(name, canonical):
    """Why AMP never moves this op to float32 for speed, or ''."""
    from mxamp.lists import common, get_op_lists
    if name in KEPT or canonical in KEPT:
        return "a cast or MXNet's gradient accumulation: never moved"
    if get_op_lists("bfloat16").reason(name) == common.R_IMG:
        return "image pre-processing on the data pipeline's dtype: never moved"
    return ""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="", help="comma-separated op names to time")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="", help="also write the results table here")
    args = parser.parse_args(argv)
    ops = forward_ops()
    alias_of = {alias: canon for canon, names in ops.items() for alias in names}
    listed, conditions, widest = _listed_ops("bfloat16", ("neutral", "widest", "conditional_fp32"))
    wanted = set(args.ops.split(",")) if args.ops else listed
    unknown = sorted(wanted - set(alias_of))
    if unknown:
        parser.error("not registered forward operators: %s" % ", ".join(unknown))
    chosen = one_name_per_op(wanted, alias_of)
    lines, counts, start = [], {}, time.time()
    for canon in sorted(chosen, key=str.lower):
        name = chosen[canon]
        kept = _kept_because(name, canon)
        child = functools.partial(_child_time, name, canon, name in widest, args.repeats,
                                  conditions.get(name))
        result = {"status": "kept", "detail": kept} if kept else run_forked(name, child, 120.0)
        aliases = [n for n in ops[canon] if n != name]
        line = "%-40s %-8s %s%s" % (name, result["status"], result["detail"],
                                    " | aliases: " + ",".join(aliases) if aliases else "")
        lines.append(line)
        counts[result["status"]] = counts.get(result["status"], 0) + 1
        print(line, flush=True)
    tally = ", ".join("%s %d" % kv for kv in sorted(counts.items()))
    summary = ("# bfloat16 speed: %d ops timed in %.0f s: %s (slow: bf16 > %.2f x (fp32 + %d "
               "casts))") % (len(lines), time.time() - start, tally, MARGIN, CASTS)
    print(summary)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(summary + "\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
