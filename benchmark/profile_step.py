"""Where does one training/inference step's time go? Top operators for one (workload, mode).

Runs the same step as ``bench_worker.py`` under ``mx.profiler`` and prints per-step time by
operator, then a roll-up into the costs AMP adds or removes: GEMM/convolution, casts, optimizer
updates, overflow checks, the rest. ``--dnnl`` re-runs the step in a child with
``DNNL_VERBOSE=1`` and sums oneDNN's own primitive times by kind, implementation and dtypes
(this is where layout reorders and the ISA, e.g. ``avx512_core_amx``, show up).

    python benchmark/profile_step.py mlp_train mxamp --steps 3 --top 15
    python benchmark/profile_step.py resnet18_train reference_amx --dnnl
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_worker  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

# Operator name patterns of each cost category (first match wins).
CATEGORIES = (
    ("cast", re.compile(r"amp_cast|amp_multicast|^Cast$|_backward_amp_cast|_backward_Cast")),
    ("optimizer update", re.compile(r"_update$|_update_|^_?mp_|preloaded_multi")),
    ("overflow check / unscale", re.compile(r"all_finite|multi_sum_sq|^norm$|_backward_norm")),
    ("GEMM / convolution", re.compile(r"FullyConnected|Convolution|batch_dot|^dot$|_linalg_gemm")),
)
DNNL_MARK = "PROFILE_STEPS_START"


def category(op_name):
    for name, pattern in CATEGORIES:
        if pattern.search(op_name):
            return name
    return "other"


def profile_operators(step, steps):
    """``{op: (count, total ms)}`` over ``steps`` calls of ``step`` under mx.profiler."""
    import mxnet as mx
    path = os.path.join(tempfile.mkdtemp(prefix="mxamp_profile_"), "profile.json")
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=path)
    mx.profiler.set_state("run")
    for _ in range(steps):
        step()
    mx.profiler.set_state("stop")
    stats = json.loads(mx.profiler.dumps(format="json", reset=True))
    ops = stats.get("Time", stats).get("operator", {})
    return {name: (row["Count"], row["Total"]) for name, row in ops.items()}


def print_operator_table(ops, steps, wall_ms, top):
    total = sum(t for _, t in ops.values())
    print("\nmx.profiler: %.1f ms of operator time per step (wall %.1f ms per step)"
          % (total / steps, wall_ms))
    print("%-42s %9s %7s %9s  %s" % ("operator", "ms/step", "share", "calls/st", "category"))
    for name, (count, ms) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]:
        print("%-42s %9.2f %6.1f%% %9.1f  %s" % (name[:42], ms / steps, 100 * ms / total,
                                                 count / steps, category(name)))
    rollup = collections.Counter()
    for name, (_, ms) in ops.items():
        rollup[category(name)] += ms
    print("\nby category:")
    for name, ms in rollup.most_common():
        print("  %-28s %9.2f ms/step %6.1f%%" % (name, ms / steps, 100 * ms / total))


def dnnl_summary(lines, top):
    """Sums ``dnnl_verbose,exec`` lines by (primitive, implementation, prop, dtypes)."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    isa = [l.split("isa:", 1)[1] for l in lines if ",info,cpu,isa:" in l]
    for line in lines:
        parts = line.split(",")
        if len(parts) < 10 or parts[1] != "exec":
            continue
        dtypes = "/".join(sorted(set(re.findall(r"_(f32|bf16|f16|s8|u8|s32)::", parts[6]))))
        key = (parts[3], parts[4], parts[5], dtypes)
        totals[key][0] += 1
        totals[key][1] += float(parts[-1])
    grand = sum(ms for _, ms in totals.values()) or 1.0
    print("\noneDNN primitives (ISA: %s), %.1f ms in total:" % (isa[0] if isa else "?", grand))
    print("%-14s %-34s %-18s %-9s %6s %9s %6s" % ("primitive", "implementation", "prop", "dtypes",
                                                  "calls", "ms", "share"))
    for (prim, impl, prop, dts), (count, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        print("%-14s %-34s %-18s %-9s %6d %9.1f %5.1f%%" % (prim, impl[:34], prop[:18], dts, count,
                                                         ms, 100 * ms / grand))
    reorders = sum(ms for (prim, _, _, _), (_, ms) in totals.items() if prim == "reorder")
    print("reorders (layout changes and oneDNN-side casts): %.1f ms = %.1f%%"
          % (reorders, 100 * reorders / grand))


def run_dnnl_child(args):
    env = dict(os.environ, DNNL_VERBOSE="1")
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), args.workload, args.mode, "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--dnnl-child"] + \
        (["--quick"] if args.quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit("the DNNL_VERBOSE child failed:\n" + proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    info = [l for l in lines if ",info," in l]
    after = lines[lines.index(DNNL_MARK) + 1:] if DNNL_MARK in lines else lines
    dnnl_summary(info + after, args.top)
    print("(primitive times over %d steps)" % args.steps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("mode", choices=bench_worker.MODES)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--dnnl", action="store_true", help="also sum DNNL_VERBOSE primitive times")
    parser.add_argument("--dnnl-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.mode == "reference_amx":
        bench_worker.grant_amx_by_hand()
    workload = WORKLOADS[args.workload]
    build = bench_worker.build_train_step if workload.kind == "train" \
        else bench_worker.build_infer_step
    step = build(workload, args.mode, args.quick)
    for _ in range(args.warmup):
        step()
    if args.dnnl_child:
        print(DNNL_MARK, flush=True)
        for _ in range(args.steps):
            step()
        sys.stdout.flush()
        return 0
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
    print("%s / %s: %.1f ms per step without profiler (%d steps; load average %.1f)"
          % (args.workload, args.mode, wall_ms, args.steps, os.getloadavg()[0]))
    if args.mode == "mxamp":
        import mxamp.backend.cpu
        print("mxamp CPU features:", mxamp.backend.cpu.cpu_features().as_dict())
    print_operator_table(profile_operators(step, args.steps), args.steps, wall_ms, args.top)
    if args.dnnl:
        run_dnnl_child(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
