"""ReLU6 after a BatchNorm (MobileNet V2's activation), written as MXNet's ``clip`` and as
``_maximum_scalar`` then ``_minimum_scalar``: the numbers behind ``mxamp/runtime/clip_graphs.py``.

    python benchmark/bench_relu6.py            # the ops alone, then two inverted residual units
    python benchmark/bench_relu6.py --rounds 3

Ops alone: forward ms on a plain float32 8x96x56x56 array of BatchNorm-like values (normal,
mean 0), for ``clip``, ``relu`` and the pair, and ``clip`` on values that rarely reach a bound
(mean 3, as MobileNetV3's hard sigmoid sees them). Units: a training step of two MobileNet V2
inverted residual units (24 -> 144 -> 24 channels, 28x28, batch 8), one fresh process a row
(``--child``), rows alternating over ``--rounds``, min and median of ``--steps`` steps after 3
warm-up steps:

* ``fp32 clip``, ``fp32 pair``: MXNet alone (the pair after a float32 BatchNorm is where oneDNN
  falls to ``bnorm_ref`` on a Zen 4: run a child with ``DNNL_VERBOSE=1``);
* ``mxamp clip``: ``amp.init('bfloat16')`` with the rewrite left off on the block;
* ``mxamp``: ``amp.init('bfloat16')`` as it is.
"""
import argparse
import os
import subprocess
import sys
import time

ROWS = (("fp32", "clip"), ("fp32", "pair"), ("mxamp", "clip"), ("mxamp", "as is"))


def _timed(run, steps):
    import mxnet as mx
    times = []
    for i in range(steps + 3):
        start = time.perf_counter()
        run()
        mx.nd.waitall()
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[0], times[len(times) // 2]


def ops_alone(steps):
    import mxnet as mx
    rng = mx.random
    rng.seed(0)
    centred = rng.normal(0, 1, (8, 96, 56, 56))
    inside = rng.normal(3, 1, (8, 96, 56, 56))
    rows = (("clip, mean 0", lambda: mx.nd.clip(centred, 0, 6)),
            ("relu, mean 0", lambda: mx.nd.relu(centred)),
            ("pair, mean 0", lambda: mx.nd.minimum(mx.nd.maximum(centred, 0), 6)),
            ("clip, mean 3", lambda: mx.nd.clip(inside, 0, 6)),
            ("pair, mean 3", lambda: mx.nd.minimum(mx.nd.maximum(inside, 0), 6)))
    for name, run in rows:
        low, median = _timed(run, steps)
        print("op   %-14s 8x96x56x56  min %7.2f  median %7.2f ms" % (name, low, median))


def child(mode, variant, steps):
    import mxnet as mx
    from mxnet import autograd
    from mxnet.gluon import nn
    if mode == "mxamp":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from mxamp import amp
        from mxamp.runtime.clip_graphs import TREATMENT_ATTR
        amp.init("bfloat16")

    class ReLU6(nn.HybridBlock):
        def hybrid_forward(self, F, x):
            if variant == "pair":
                return F.minimum(F.maximum(x, 0), 6)
            return F.clip(x, 0, 6)

    net = nn.HybridSequential()
    for _ in range(2):
        net.add(nn.Conv2D(144, 1, use_bias=False), nn.BatchNorm(), ReLU6(),
                nn.Conv2D(144, 3, padding=1, groups=144, use_bias=False), nn.BatchNorm(),
                ReLU6(), nn.Conv2D(24, 1, use_bias=False), nn.BatchNorm())
    net.initialize(mx.init.Xavier())
    if mode == "mxamp" and variant == "clip":
        net.__dict__[TREATMENT_ATTR] = ""      # as cast_model leaves a plan without it
    net.hybridize(static_alloc=True)
    x = mx.nd.random.normal(0, 1, (8, 24, 28, 28))

    def step():
        with autograd.record():
            y = net(x)
        y.backward()
    low, median = _timed(step, steps)
    print("unit %-6s %-6s  min %7.2f  median %7.2f ms" % (mode, variant, low, median))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.steps)
        return 0
    ops_alone(args.steps)
    for _ in range(args.rounds):
        for mode, variant in ROWS:
            subprocess.run([sys.executable, __file__, "--child", mode, variant, "--steps",
                            str(args.steps)], check=False, stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
