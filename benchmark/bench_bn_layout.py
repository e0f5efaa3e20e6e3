"""Why the probe times BatchNorm after a convolution: BatchNorm's bfloat16 speed depends on the
layout it is handed, and so does what follows it.

Times, forward and backward, in float32 and bfloat16 (MXNet's own functions, no AMP):

* ``BatchNorm alone``: BatchNorm on a plain NCHW input (probe version 1's workload; oneDNN runs
  the generic ``ncsp_bnorm:any`` kernel there);
* ``Convolution+BatchNorm``: the same BatchNorm on a 3x3 convolution's output (a oneDNN layout,
  ``bnorm_jit``), as models run it;
* ``Convolution+BatchNorm+Activation(relu)`` and ``Convolution+BatchNorm+relu``: the ReLU as
  ``nn.Activation`` runs it, and as ``F.relu`` (MXNet's own op) runs it.

    python benchmark/bench_bn_layout.py            # add DNNL_VERBOSE=1 to see the kernels
"""
import time

import mxnet as mx
import numpy as np

BF16 = np.dtype([("bfloat16", np.uint16)])
SHAPE, CHANNELS = (8, 64, 28, 28), 64


def _block(kind):
    def run(x, w, stats):
        y = x if kind == "BatchNorm alone" else mx.nd.Convolution(
            x, w, kernel=(3, 3), pad=(1, 1), num_filter=CHANNELS, no_bias=True)
        y = mx.nd.BatchNorm(y, *stats, fix_gamma=False)
        if kind.endswith("Activation(relu)"):
            y = mx.nd.Activation(y, act_type="relu")
        elif kind.endswith("+relu"):
            y = mx.nd.relu(y)
        return y
    return run


def best_ms(kind, dtype, repeats=5):
    """Best of ``repeats`` forward+backward passes after one warm-up, in milliseconds."""
    x = mx.nd.amp_cast(mx.nd.random.uniform(-1, 1, shape=SHAPE), dtype=dtype)
    w = mx.nd.amp_cast(mx.nd.random.uniform(-.1, .1, shape=(CHANNELS, CHANNELS, 3, 3)),
                       dtype=dtype)
    stats = [mx.nd.ones((CHANNELS,)) for _ in range(4)]
    x.attach_grad()
    block = _block(kind)
    times, _ = pass_times(lambda: block(x, w, stats), repeats + 1)
    return min(times[1:]) * 1e3


def pass_times(run, passes):
    """The seconds of ``passes`` forward+backward passes of ``run()`` (which returns the
    output to differentiate) until MXNet's engine is idle, and the last output."""
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        with mx.autograd.record():
            y = run()
        y.backward()
        mx.nd.waitall()
        times.append(time.perf_counter() - start)
    return times, y


def main():
    print("| workload, %s | float32 ms | bfloat16 ms | float32 / bfloat16 |" % "x".join(
        map(str, SHAPE)))
    print("|---|---|---|---|")
    for kind in ("BatchNorm alone", "Convolution+BatchNorm",
                 "Convolution+BatchNorm+Activation(relu)", "Convolution+BatchNorm+relu"):
        f32, b16 = best_ms(kind, "float32"), best_ms(kind, BF16)
        print("| %s | %.2f | %.2f | %.2fx |" % (kind, f32, b16, f32 / b16))


if __name__ == "__main__":
    main()
