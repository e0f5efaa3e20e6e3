"""The fixed costs around the GEMMs of one training step, for one workload's parameters.

A bf16 step can only be as fast as what stays when the GEMMs/convolutions get faster: the fp32
optimizer update, the weight casts to bf16, the overflow check. This times each of them alone
on the workload's real parameter set (median of ``--repeat`` runs, each synced):

- ``sgd_mom_update``: ``Trainer.step`` (SGD, momentum 0.9) over all fp32 parameters;
- ``cast_weights_bf16``: one ``amp_cast`` to bf16 of every weight (what a weight-cast cache costs
  once per step; the reference pays it on every use);
- ``mxamp_check_finite``: ``mxamp.training.overflow.check_finite`` over the gradients;
- ``reference_has_overflow``: the reference's ``LossScaler.has_overflow`` on the same gradients.

    python benchmark/bench_step_parts.py mlp_train --repeat 10
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

from workloads import WORKLOADS, build_model, make_batch  # noqa: E402


def median_ms(fn, repeat):
    """Median (wall ms, process CPU ms) of ``repeat`` synced calls after one warm-up call."""
    import mxnet as mx
    fn()
    mx.nd.waitall()
    wall, cpu = [], []
    for _ in range(repeat):
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        mx.nd.waitall()
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - cpu_start) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=[n for n, w in WORKLOADS.items() if w.kind == "train"])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)

    import mxnet as mx
    from mxnet import gluon
    from mxnet.contrib.amp.loss_scaler import LossScaler as ReferenceScaler
    from mxamp import dtypes
    from mxamp.training import overflow

    workload = WORKLOADS[args.workload]
    net = build_model(workload)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    data, _ = make_batch(workload, quick=True)
    net(data)  # finishes deferred initialisation
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    for p in params:
        p.grad()[:] = mx.nd.random.uniform(-1, 1, p.shape)
    grads = [p.grad() for p in params]
    weights = [p.data() for p in params]
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-6, "momentum": 0.9},
                            update_on_kvstore=False)
    reference = ReferenceScaler()
    total = sum(w.size for w in weights)
    print("%s: %d trainable arrays, %.1f M values; load average %.1f"
          % (args.workload, len(weights), total / 1e6, os.getloadavg()[0]))
    def update():
        for w in weights:
            w._fresh_grad = True  # what backward() marks; Trainer skips stale gradients
        trainer.step(1)

    parts = {
        "sgd_mom_update": update,
        "cast_weights_bf16": lambda: [mx.nd.amp_cast(w, dtype=dtypes.BFLOAT16) for w in weights],
        "mxamp_check_finite": lambda: overflow.check_finite(grads),
        "reference_has_overflow": lambda: reference.has_overflow(params),
    }
    print("%-24s %10s %10s" % ("part", "wall ms", "CPU ms"))
    for name, fn in parts.items():
        print("%-24s %10.1f %10.1f" % ((name,) + median_ms(fn, args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
