"""What the copies of :mod:`mxamp.runtime.addto` cost: an MLP train step under
``amp.init('bfloat16')`` with ``grad_req='write'`` (no copies) and ``grad_req='add'`` (a
float32 copy of each weight before its cast), imperative and hybridized. One process per
measurement, alternating, because the heap and the allocator's pools outlive a run.

    python benchmark/bench_addto_copies.py --cycles 3

Prints one line per process and the median step time and peak RSS per setting.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = [(req, hybrid) for hybrid in (False, True) for req in ("write", "add")]


def one_run(grad_req, hybridize, steps=10, warmup=3):
    """Median step time (ms) and peak RSS (MB) of this process's MLP training."""
    sys.path.insert(0, ROOT)
    import numpy as np
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxamp import amp
    amp.init(target_dtype="bfloat16")
    net = gluon.nn.HybridSequential()
    for layer in range(6):
        net.add(gluon.nn.Dense(2048, activation="relu", in_units=2048 if layer else 1024))
    net.add(gluon.nn.Dense(10, in_units=2048))
    net.initialize(mx.init.Xavier())
    net.collect_params().setattr("grad_req", grad_req)
    if hybridize:
        net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    amp.init_trainer(trainer)
    rng = np.random.RandomState(0)
    data = mx.nd.array(rng.normal(0, 1, (256, 1024)))
    label = mx.nd.array(rng.randint(0, 10, (256,)))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(data), label)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(256)
        if grad_req == "add":
            net.collect_params().zero_grad()
        mx.nd.waitall()
        times.append(time.perf_counter() - start)
    return {"ms": 1000 * statistics.median(times[warmup:]),
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("GRAD_REQ", "HYBRIDIZE"))
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(one_run(args.child[0], args.child[1] == "1")))
        return
    results = {setting: [] for setting in SETTINGS}
    for cycle in range(args.cycles):
        for req, hybrid in SETTINGS:
            out = subprocess.run([sys.executable, __file__, "--child", req, str(int(hybrid))],
                                 capture_output=True, text=True, check=True).stdout
            result = json.loads(out.split("RESULT ", 1)[1])
            results[(req, hybrid)].append(result)
            print("cycle %d  %-5s %-10s %7.1f ms  %5.0f MB" % (
                cycle, req, "hybridized" if hybrid else "imperative", result["ms"],
                result["maxrss_mb"]), flush=True)
    for (req, hybrid), runs in results.items():
        print("median  %-5s %-10s %7.1f ms  %5.0f MB" % (
            req, "hybridized" if hybrid else "imperative",
            statistics.median(r["ms"] for r in runs),
            statistics.median(r["maxrss_mb"] for r in runs)))


if __name__ == "__main__":
    main()
