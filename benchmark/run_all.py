"""Runs the whole benchmark suite and writes ``benchmark/results/latest.{md,json,png}``.

Every measurement is a fresh process (``bench_worker.py``); the modes of one workload take turns
(the order rotates every repeat) so that a slow spell of a shared machine hits all of them.
A failing or hanging measurement becomes an error cell; the suite goes on.

    python benchmark/run_all.py            # full suite, 3 repeats (~30-60 min on 2 cores)
    python benchmark/run_all.py --quick    # tiny batches, 1 repeat: a smoke test of everything
    python benchmark/run_all.py --only mlp_train,resnet18_infer --modes fp32,mxamp --repeats 5
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

TRAIN_MODES = ("fp32", "fp32_mxamp_imported", "reference", "reference_amx", "mxamp",
               "mxamp_auto", "mxamp_tuned", "mxamp_as_tuned", "mxamp_o2")
INFER_MODES = TRAIN_MODES[:-1]
#: This mode runs right after each mxamp_tuned process, with the policy that process chose.
AS_TUNED = "mxamp_as_tuned"
INIT_MODES = ("reference", "mxamp")
# (timed steps, warmup steps) per workload at full size; --quick uses (2, 1).
STEPS = {"mlp_train": (10, 3), "resnet18_train": (10, 3), "resnet50_train": (3, 1),
         "mobilenet_train": (5, 2), "yolo3_train": (5, 2), "mobilenetv3_train": (4, 2),
         "se_resnet18_train": (4, 2), "shufflenet_v2_train": (4, 2), "resnext50_train": (3, 2),
         "transformer_train": (5, 2), "resnet18_infer": (10, 3), "resnet50_infer": (6, 2)}
#: The memory account's fields (benchmark/memory_account.py), medians over the repeats.
ACCOUNT_KEYS = ("params_mb", "grads_mb", "optimizer_mb", "workspace_mb", "graph_mb",
                "weight_casts_mb", "step_storage_mb")
OVERFLOW_SCRIPT = os.path.join(HERE, "bench_overflow.py")


def plan(only, modes, suite="main"):
    """``[(workload, modes)]`` in suite order, filtered by --only / --modes; ``suite`` picks
    the rows run without --only ('main', or 'survey': the GluonCV survey of workloads.py)."""
    rows = [(name, TRAIN_MODES if w.kind == "train" else INFER_MODES)
            for name, w in WORKLOADS.items() if only or w.suite == suite]
    rows += [] if suite == "survey" else [("amp_init", INIT_MODES), ("amp_init_fp16", INIT_MODES)]
    if only:
        unknown = set(only) - {name for name, _ in rows} - {"overflow"}
        if unknown:
            raise SystemExit("unknown workload(s) %s; known: %s, overflow" % (
                sorted(unknown), ", ".join(name for name, _ in rows)))
        rows = [row for row in rows if row[0] in only]
    if modes:
        rows = [(name, tuple(m for m in ms if m in modes)) for name, ms in rows]
    return [row for row in rows if row[1]]


def _child_env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    # import times as installed packages see them: with cached bytecode (pip compiles MXNet's
    # at install; without this mxamp's source would be compiled again in every process)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def parse_result(stdout):
    """The dict after the last ``RESULT `` line of a child's output, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            try:
                return json.loads(line[len("RESULT "):])
            except ValueError:
                return None
    return None


def run_child(cmd, timeout):
    """Runs one measurement process; always returns a RESULT-like dict."""
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=_child_env(), cwd=os.path.dirname(HERE))
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": "timeout after %ds" % timeout}
    result = parse_result(proc.stdout)
    if result is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        result = {"status": "error",
                  "error": "exit code %d: %s" % (proc.returncode, tail[:200])}
    elif result.get("status") == "error" and proc.stderr:
        result["stderr_tail"] = proc.stderr.strip().splitlines()[-1][:200]
    result["wall_s"] = round(time.time() - start, 1)
    return result


def run_suite(args):
    rows = plan(args.only, args.modes, "survey" if args.survey else "main")
    runs = []  # every child's RESULT dict
    for name, modes in rows:
        turns = tuple(m for m in modes if m != AS_TUNED)   # it follows mxamp_tuned, or no one
        for repeat in range(args.repeats if turns else 0):
            shift = repeat % len(turns)
            for mode in turns[shift:] + turns[:shift]:
                policy_file = None
                if mode == "mxamp_tuned" and AS_TUNED in modes:
                    # the untuned run of the policy this process chooses comes next
                    policy_file = os.path.join(args.out, "policy-%s-%d.json" % (name, repeat))
                for each in (mode, AS_TUNED) if policy_file else (mode,):
                    runs.append(_run_mode(args, name, each, repeat, policy_file))
    if (not args.only and not args.survey) or "overflow" in (args.only or ()):
        runs.extend(run_overflow(args))
    return runs


def _run_mode(args, name, mode, repeat, policy_file=None):
    """One measurement process of ``name`` in ``mode``, printed as it ends."""
    survey = WORKLOADS[name].suite == "survey" if name in WORKLOADS else False
    steps, warmup = (1, 1) if args.quick else STEPS.get(name, (4, 2) if survey else (1, 0))
    cmd = [sys.executable, os.path.join(HERE, "bench_worker.py"), name, mode,
           "--steps", str(steps), "--warmup", str(warmup)]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--policy", policy_file] if policy_file else []
    result = run_child(cmd, args.timeout)
    result.update(workload=name, mode=mode, repeat=repeat)
    print("%-18s %-14s #%d %-6s %s" % (name, mode, repeat, result["status"],
          "%.1f ms" % result["median_ms"] if result["status"] == "ok"
          else result.get("error", "")), flush=True)
    return result


# bench_overflow.py's row names -> the report's modes (other rows keep their own names).
OVERFLOW_MODES = {"reference multi_all_finite (has_overflow)": "reference",
                  "mxamp TrainerScaler.has_overflow": "mxamp"}
_TIMING_LINE = re.compile(r"^(\S.*?)\s+([0-9.]+) ms$")


def parse_overflow(stdout):
    """Rows of bench_overflow.py (``<name>  <x> ms`` lines) as RESULT-like dicts."""
    found = []
    for line in stdout.splitlines():
        match = _TIMING_LINE.match(line.strip())
        if match:
            name = match.group(1).strip()
            found.append({"mode": OVERFLOW_MODES.get(name, name), "status": "ok",
                          "median_ms": float(match.group(2))})
    return found


def run_overflow(args):
    """ResNet-50 overflow check + unscale: bench_overflow.py (helper H2's script), one process
    per repeat; it times the reference and mxamp side by side itself."""
    if not os.path.exists(OVERFLOW_SCRIPT):
        return [{"workload": "overflow", "mode": "mxamp", "status": "error",
                 "error": "benchmark/bench_overflow.py is missing"}]
    runs = []
    for repeat in range(args.repeats):
        cmd = [sys.executable, OVERFLOW_SCRIPT, "--repeat", "3" if args.quick else "15"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=_child_env(), cwd=os.path.dirname(HERE))
            found = parse_overflow(proc.stdout)
            if not found or proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                found = [{"mode": "mxamp", "status": "error",
                          "error": "exit %d: %s" % (proc.returncode, tail[:200])}]
        except subprocess.TimeoutExpired:
            found = [{"mode": "mxamp", "status": "error", "error": "timeout"}]
        for result in found:
            result.update(workload="overflow", repeat=repeat)
            print("%-18s %-14s #%d %-6s %s" % ("overflow", result["mode"][:14], repeat,
                  result["status"], result.get("median_ms", result.get("error", ""))), flush=True)
        runs.extend(found)
    return runs


def summarize(runs):
    """``{(workload, mode): cell}``: median over the repeats' medians, the highest peak RSS
    (and the lowest: processes of one cell differ by where the C heap put freed blocks),
    errors."""
    cells = {}
    for key in sorted({(r["workload"], r["mode"]) for r in runs}):
        mine = [r for r in runs if (r["workload"], r["mode"]) == key]
        ok = [r for r in mine if r.get("status") == "ok"]
        cell = {"runs": len(mine), "ok": len(ok)}
        if ok:
            if all("import_ms" in r for r in ok):
                cell["import_ms"] = statistics.median(r["import_ms"] for r in ok)
            cell.update(median_ms=statistics.median(r["median_ms"] for r in ok),
                        spread_ms=[min(r["median_ms"] for r in ok),
                                   max(r["median_ms"] for r in ok)],
                        maxrss_mb=max(r.get("maxrss_mb", 0) for r in ok),
                        spread_maxrss_mb=[min(r.get("maxrss_mb", 0) for r in ok),
                                          max(r.get("maxrss_mb", 0) for r in ok)],
                        trials_maxrss_mb=max(r.get("trials_maxrss_mb", 0) for r in ok),
                        median_cpu_ms=statistics.median(r.get("median_cpu_ms", 0) for r in ok),
                        loadavg=statistics.median(r.get("loadavg", 0) for r in ok))
            for key_mb in ACCOUNT_KEYS:
                values = [r[key_mb] for r in ok if r.get(key_mb) is not None]
                if values:
                    cell[key_mb] = statistics.median(values)
            if any("baseline_mb" in r for r in ok):
                cell["baseline_mb"] = max(r.get("baseline_mb", 0) for r in ok)
            policies = sorted({r["policy"] for r in ok if r.get("policy")})
            if policies:
                cell["policy"] = " / ".join(policies)
        bad = [r for r in mine if r.get("status") != "ok"]
        if bad:
            cell["status"] = bad[0]["status"] if not ok else "partial"
            cell["error"] = bad[0].get("error", "")
        else:
            cell["status"] = "ok"
        cells[key] = cell
    _pair_tuned_runs(runs, cells)
    return cells


def _pair_tuned_runs(runs, cells):
    """Each tuned process's peak over its untuned twin's (``mxamp_as_tuned``, the same policy,
    the process after it): the highest such ratio goes in the tuned cell."""
    twins = {(r["workload"], r["repeat"]): r for r in runs
             if r["mode"] == AS_TUNED and r.get("status") == "ok"}
    ratios = [(r["workload"], r["maxrss_mb"] / twins[(r["workload"], r["repeat"])]["maxrss_mb"])
              for r in runs if r["mode"] == "mxamp_tuned" and r.get("status") == "ok"
              and (r["workload"], r["repeat"]) in twins]
    for workload in {w for w, _ in ratios}:
        cells[(workload, "mxamp_tuned")]["peak_over_untuned"] = max(
            r for w, r in ratios if w == workload)


def machine_info():
    """CPU model, cores, bf16/AMX flags, library versions, date: the report's header."""
    import mxnet
    info = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": "unknown", "cores": os.cpu_count(), "python": platform.python_version(),
            "mxnet": mxnet.__version__, "omp_num_threads": _child_env()["OMP_NUM_THREADS"],
            "kernel": platform.release()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        info["cpu"] = next(l.split(":", 1)[1].strip() for l in text.splitlines()
                           if l.startswith("model name"))
        flags = next(l.split(":", 1)[1].split() for l in text.splitlines()
                     if l.startswith("flags"))
        info["bf16_flags"] = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    except (OSError, StopIteration):
        pass
    info["loadavg_start"] = os.getloadavg()[0]
    # The bfloat16 class decides what the ratios should be; computed as the workers compute it.
    proc = subprocess.run([sys.executable, "-c", "import json; from mxamp.backend import cpu; "
                           "f = cpu.cpu_features(); print(json.dumps([f.bf16_class, "
                           "f.bf16_reason]))"], capture_output=True, text=True,
                          env=_child_env(), cwd=os.path.dirname(HERE), timeout=120)
    try:
        info["bf16_class"], info["bf16_reason"] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info["bf16_class"], info["bf16_reason"] = "unknown", proc.stderr.strip()[-200:]
    return info


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny batches, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="processes per cell (3)")
    parser.add_argument("--only", type=lambda s: s.split(","), default=None,
                        help="comma-separated workloads (%s, amp_init, amp_init_fp16, overflow)"
                        % ", ".join(n for n, w in WORKLOADS.items() if w.suite == "main"))
    parser.add_argument("--survey", action="store_true",
                        help="run the GluonCV survey's rows (workloads.py) instead of the main ones")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=None,
                        help="comma-separated modes (%s)" % ", ".join(TRAIN_MODES))
    parser.add_argument("--timeout", type=int, default=None,
                        help="seconds per process (default 900, --quick 240)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"),
                        help="directory of latest.md/.json/.png")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.timeout = args.timeout or (240 if args.quick else 900)

    info = machine_info()
    os.makedirs(args.out, exist_ok=True)   # mxamp_tuned saves its policies there
    started = time.time()
    runs = run_suite(args)
    info.update(loadavg_end=os.getloadavg()[0], suite_minutes=round((time.time() - started) / 60, 1),
                quick=args.quick, repeats=args.repeats,
                command=" ".join(["python benchmark/run_all.py"] + (argv or sys.argv[1:])))
    features = [r["cpu_features"] for r in runs if r.get("cpu_features")]
    info["mxamp_cpu_features"] = features[0] if features else None
    cells = summarize(runs)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump({"machine": info, "runs": runs,
                   "cells": {"%s/%s" % k: v for k, v in cells.items()}}, f, indent=1)
    markdown = report.markdown(info, cells)
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(markdown)
    chart = report.bar_chart(cells, os.path.join(args.out, "latest.png"))
    print(markdown)
    print("wrote %s/latest.md, latest.json%s" % (args.out, ", latest.png" if chart else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
