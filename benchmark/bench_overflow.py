"""Overflow-check speed on ResNet-50-sized gradients: reference vs mxamp.

Builds ResNet-50 v1 (Gluon model zoo, no download), fills every trainable parameter's
gradient with random numbers (float32: 25.6 M values in its trainable arrays) and times, with
the median of ``--repeat`` runs after a warm-up:

* reference: ``mxnet.contrib.amp``'s ``LossScaler.has_overflow`` (``multi_all_finite`` in
  chunks of 200, then one ``asnumpy``);
* mxamp: ``TrainerScaler.has_overflow`` (what ``Trainer._update`` calls), the
  ``FiniteChecker`` it uses, and ``overflow.check_finite`` (which re-plans every call);
* alternatives measured to choose the method: ``FiniteChecker`` with other size thresholds
  between per-array ``all_finite`` and the shared ``multi_sum_sq`` (0 = every array its own
  ``all_finite``; infinity = one ``multi_sum_sq`` for all);
* the fused ``global_norm`` against Gluon's ``clip_global_norm``-style per-array ``norm``;
* float16 gradients (per-array ``all_finite`` path).

Targets (issue #3): mxamp <= 25 ms and >= 10x faster than the reference. Results are only
meaningful on an otherwise idle machine.

    python benchmark/bench_overflow.py [--repeat 15] [--omp 1,2]

``--omp 1,2`` runs the whole comparison once per OpenMP thread count (in a fresh process each,
since MXNet reads OMP_NUM_THREADS at import). On an oversubscribed machine MXNet's OpenMP
kernels with 2 threads can be many times slower than with 1: check the printed load average.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
from mxnet.contrib.amp.loss_scaler import LossScaler as ReferenceScaler
from mxnet.gluon.model_zoo import vision

from mxamp.training import overflow
from mxamp.training.scaler import LossScaler
from mxamp.training.trainer_scaler import TrainerScaler, trainable_grads


def median_ms(methods, repeat):
    """{name: (fn, runs)} -> {name: median ms}; runs interleave so load drift hits all alike."""
    for fn, _ in methods.values():
        fn()  # warm-up
    mx.nd.waitall()
    times = {name: [] for name in methods}
    for round_index in range(repeat):
        for name, (fn, runs) in methods.items():
            if round_index < runs:
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def with_threshold(threshold, fn):
    """Run ``fn`` with overflow.LARGE_ARRAY set to ``threshold``."""
    def run():
        saved, overflow.LARGE_ARRAY = overflow.LARGE_ARRAY, threshold
        try:
            return fn()
        finally:
            overflow.LARGE_ARRAY = saved
    return run


def resnet50_params():
    net = vision.resnet50_v1()
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 224, 224)))
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    rng = np.random.RandomState(0)
    for p in params:
        p.grad()[:] = rng.standard_normal(p.shape).astype(np.float32)
    mx.nd.waitall()
    return params


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="timed runs per method")
    parser.add_argument("--omp", default=None,
                        help="comma-separated OMP_NUM_THREADS values, one process each")
    args = parser.parse_args()
    if args.omp:
        for threads in args.omp.split(","):
            print("=== OMP_NUM_THREADS=%s ===" % threads, flush=True)
            env = dict(os.environ, OMP_NUM_THREADS=threads.strip())
            subprocess.run([sys.executable, os.path.abspath(__file__), "--repeat",
                            str(args.repeat)], env=env, check=True)
        return
    print("load average (1 min) %.2f on %d CPUs; OMP_NUM_THREADS=%s"
          % (os.getloadavg()[0], os.cpu_count(), os.environ.get("OMP_NUM_THREADS", "unset")))

    params = resnet50_params()
    grads = trainable_grads(params)[0]
    total = sum(g.size for g in grads)
    print("check_finite threshold LARGE_ARRAY = %d values" % overflow.LARGE_ARRAY)
    print("ResNet-50 v1 gradients: %d arrays, %.1f M float32 values, MXNet %s"
          % (len(grads), total / 1e6, mx.__version__))

    reference = ReferenceScaler()
    hook = TrainerScaler(LossScaler(), "float16")
    checker = overflow.FiniteChecker()
    grads16 = [g.astype("float16") for g in grads]
    mx.nd.waitall()
    few, many = max(3, args.repeat // 3), args.repeat
    methods = {
        "reference multi_all_finite (has_overflow)": (lambda: reference.has_overflow(params), few),
        "mxamp TrainerScaler.has_overflow": (lambda: hook.has_overflow(params), many),
        "mxamp FiniteChecker.check (plan remembered)": (
            lambda: checker.check(grads), many),
        "mxamp overflow.check_finite (plan rebuilt each call)": (
            lambda: overflow.check_finite(grads), many),
        "mxamp overflow.global_norm": (lambda: overflow.global_norm(grads), many),
        "alt: per-array norm + 1 copy (clip_global_norm style)": (
            lambda: mx.nd.concat(*[mx.nd.norm(g).reshape((1,)) for g in grads],
                                 dim=0).asnumpy(), few),
        "mxamp check_finite, float16 gradients (cast)": (
            lambda: overflow.check_finite(grads16), many),
        "alt: per-array float16 all_finite + 1 copy": (
            lambda: mx.nd.concat(*[mx.nd.all_finite(g) for g in grads16], dim=0).asnumpy(), few),
    }
    for threshold in (0, 1 << 12, 1 << 20, float("inf")):
        own_checker = overflow.FiniteChecker()
        methods["alt: FiniteChecker, own all_finite from %g values" % threshold] = (
            with_threshold(threshold, lambda c=own_checker: c.check(grads)), many)
    results = median_ms(methods, args.repeat)

    width = max(len(k) for k in results)
    for name, ms in results.items():
        print("%-*s %8.1f ms" % (width, name, ms))
    ref_ms = results["reference multi_all_finite (has_overflow)"]
    ours = results["mxamp TrainerScaler.has_overflow"]
    print("speed-up of mxamp has_overflow over the reference: %.1fx" % (ref_ms / ours))
    print("target <= 25 ms: %s; target >= 10x: %s"
          % ("met" if ours <= 25 else "NOT met", "met" if ref_ms / ours >= 10 else "NOT met"))


if __name__ == "__main__":
    main()
