"""Speed of a mode against float32, measured so that a shared machine's drift cancels.

``run_all.py`` times each (workload, mode) in its own processes, one after another. On a shared
VM the machine's speed drifts by far more than the differences it is asked to resolve (seen on
this project's 2-vCPU Zen 4: GluonCV ShuffleNet V2 float32 at 94-139 ms a step within minutes),
so a row near 1.0x can read 0.80x or 1.10x by chance. This script measures two ways in which
both sides see the same machine:

* pairs: a float32 process and a process of the mode run *at the same time*, each pinned to its
  own core with one OpenMP thread, the cores swapped every pair; each pair gives one ratio.
  Any mode of ``bench_worker.py`` (``mxamp``, ``mxamp_auto``, ``mxamp_o2``, ...).
* alternating: one process, one model and trainer, steps under ``amp.init`` and after
  ``amp.reset()`` alternating (``mxamp`` and ``mxamp_auto`` only), with the OpenMP threads
  ``run_all.py`` gives (the CPU count, unless ``OMP_NUM_THREADS`` is set). What happens once
  per process (``import mxamp``'s heap settings) is on both sides here, and only in the pairs.

It prints float32 / mode (above 1.0: the mode is faster) with the inter-quartile range of the
ratios, and a ``RESULT {json}`` line.

    python benchmark/bench_paired.py --only shufflenet_v2_train,survey_xception \\
        --modes mxamp,mxamp_o2 --pairs 6 --alternate 16
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

#: The modes that ``amp.init``/``amp.reset`` can switch inside one process.
ALTERNATING_MODES = ("mxamp", "mxamp_auto")


def speedups(time_ratios):
    """``{"median", "q1", "q3", "n"}`` of float32/mode from ratios mode/float32 of step times.

    >>> speedups([1.25, 0.8, 1.0, 0.5])
    {'median': 1.125, 'q1': 1.0, 'q3': 2.0, 'n': 4}
    """
    ordered = sorted(1.0 / r for r in time_ratios)
    return {"median": statistics.median(ordered), "q1": ordered[len(ordered) // 4],
            "q3": ordered[(3 * len(ordered)) // 4], "n": len(ordered)}


def _cell(result):
    if result is None:
        return ""
    return "%.2fx (%.2f-%.2f, %d)" % (result["median"], result["q1"], result["q3"], result["n"])


def main(argv=None):
    # before MXNet loads (workloads.py and bench_overhead import it lazily): run_all's threads
    os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    from workloads import WORKLOADS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", type=lambda s: s.split(","), required=True,
                        help="training workloads, comma-separated (survey rows too)")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["mxamp"])
    parser.add_argument("--pairs", type=int, default=6, help="process pairs per cell (0: none)")
    parser.add_argument("--alternate", type=int, default=0,
                        help="alternating rounds per cell, mxamp and mxamp_auto (0: none)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per paired process")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    unknown = [w for w in args.only if WORKLOADS.get(w) is None or WORKLOADS[w].kind != "train"]
    if unknown:
        parser.error("not training workloads of workloads.py: %s" % ", ".join(unknown))
    import bench_overhead
    from mxamp.backend import cpu
    features = cpu.cpu_features()
    print("CPU %s, bfloat16 class %r; alternating with OMP_NUM_THREADS=%s" % (
        features.cpu_model, features.bf16_class, os.environ["OMP_NUM_THREADS"]), flush=True)
    rows = []
    for workload in args.only:
        for mode in args.modes:
            row = {"workload": workload, "mode": mode, "pairs": None, "alternating": None}
            if args.pairs > 0:
                row["pairs"] = speedups(bench_overhead.paired_training(
                    workload, mode, args.pairs, args.steps, args.warmup))
            if args.alternate > 0 and mode in ALTERNATING_MODES:
                row["alternating"] = speedups(bench_overhead.alternating_training(
                    workload, mode, args.alternate))
            rows.append(row)
    print("\nfloat32 / mode, median (inter-quartile range, count); above 1.0 the mode is faster")
    print("\n| workload | mode | pairs, 1 thread each | alternating, %s threads |"
          % os.environ["OMP_NUM_THREADS"])
    print("|---|---|---|---|")
    for row in rows:
        print("| %s | %s | %s | %s |" % (row["workload"], row["mode"], _cell(row["pairs"]),
                                         _cell(row["alternating"])))
    print("RESULT " + json.dumps({"bf16_class": features.bf16_class, "cpu": features.cpu_model,
                                  "omp_num_threads": os.environ["OMP_NUM_THREADS"],
                                  "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
