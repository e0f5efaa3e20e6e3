"""A squeeze-excitation unit's training step with its global pooling written three ways, in
float32 with MXNet alone, and as written under mxamp's ``amp.init('bfloat16')``: where the
pooling steering of ``mxamp/runtime/pooling_graphs.py`` comes from.

    python benchmark/bench_se_pooling.py                  # 16 and 64 channels at 28x28
    python benchmark/bench_se_pooling.py --channels 120 --size 28

Each row is one fresh process (``--child``), rows alternate over ``--rounds``; min and median
ms of ``--steps`` steps after 3 warm-up steps. ``DNNL_VERBOSE=1`` on a child shows the kernels.
"""
import argparse
import os
import subprocess
import sys
import time

ROWS = (("fp32", "global"), ("fp32", "reshape"), ("fp32", "mean"), ("mxamp", "global"))


def child(mode, variant, channels, size, steps):
    import mxnet as mx
    import numpy as np
    from mxnet import autograd
    from mxnet.gluon import nn
    if mode == "mxamp":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from mxamp import amp
        amp.init("bfloat16")

    class Unit(nn.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = nn.Conv2D(channels, 1, use_bias=False, in_channels=channels)
            self.bn = nn.BatchNorm(in_channels=channels)
            self.squeeze = nn.Conv2D(32, 1, in_channels=channels)
            self.excite = nn.Conv2D(channels, 1, in_channels=32)
            self.out = nn.Conv2D(channels, 1, use_bias=False, in_channels=channels)

        def hybrid_forward(self, F, x):
            y = F.relu(self.bn(self.conv(x)))
            if variant == "mean":
                pooled = F.mean(y, axis=(2, 3), keepdims=True)
            else:
                pooled = F.Pooling(F.reshape(y, shape=(-2,)) if variant == "reshape" else y,
                                   global_pool=True, pool_type="avg", kernel=(1, 1))
            gate = F.sigmoid(self.excite(F.relu(self.squeeze(pooled))))
            return self.out(F.broadcast_mul(y, gate))

    net = Unit()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (8, channels, size, size)))
    x.attach_grad()
    times = []
    for i in range(steps + 3):
        start = time.perf_counter()
        with autograd.record():
            loss = net(x).astype("float32").sum()
        loss.backward()
        mx.nd.waitall()
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    print("%-6s %-8s C=%-4d %dx%d  min %7.2f  median %7.2f ms" % (
        mode, variant, channels, size, size, times[0], times[len(times) // 2]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.channels[0], args.size, args.steps)
        return 0
    for channels in args.channels:
        for _ in range(args.rounds):
            for mode, variant in ROWS:
                subprocess.run([sys.executable, __file__, "--child", mode, variant, "--channels",
                                str(channels), "--size", str(args.size), "--steps",
                                str(args.steps)], check=False, stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
