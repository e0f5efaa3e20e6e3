"""Converted inference right after ``amp.tune``: the conversion must not pick up the graph of
tune's last candidate (casts included). Prints the cast count and ms per batch of
``convert_hybrid_block`` before tuning, after tuning, and after one plain call of the model.

    python benchmark/bench_convert_after_tune.py [--workload resnet50_infer]
"""
import argparse
import os
import sys
import time

import mxnet as mx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

from workloads import WORKLOADS, build_model, make_batch  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet50_infer")
    args = parser.parse_args(argv)
    from mxamp import amp
    from mxamp.backend.graphs import cast_nodes
    workload = WORKLOADS[args.workload]
    net = build_model(workload)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    data, _ = make_batch(workload)
    net(data).wait_to_read()

    def converted(when):
        lp = amp.convert_hybrid_block(net, "bfloat16", ctx=mx.cpu())
        lp(data).wait_to_read()
        times = []
        for _ in range(4):
            start = time.perf_counter()
            lp(data).wait_to_read()
            times.append(time.perf_counter() - start)
        print("| %s | %d | %.0f |" % (when, len(cast_nodes(lp._cached_graph[1])),
                                     min(times) * 1e3), flush=True)
    print("| convert_hybrid_block(net, 'bfloat16') | casts | ms per batch |")
    print("|---|---|---|")
    converted("before amp.tune")
    amp.tune(net, data, train=False, report=None, apply=False)
    converted("right after amp.tune")
    net(data).wait_to_read()
    converted("after one plain call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
