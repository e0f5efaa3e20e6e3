"""Turns the suite's summarized cells into the Markdown report and the PNG bar chart."""
from workloads import INIT_LIMIT_MS, INIT_TARGETS, WORKLOADS

COLUMNS = (("fp32", "fp32"), ("fp32_mxamp_imported", "fp32 after `import mxamp`"),
           ("reference", "reference bf16"),
           ("reference_amx", "reference bf16 + AMX by hand"), ("mxamp", "mxamp bf16"),
           ("mxamp_auto", "mxamp auto"), ("mxamp_tuned", "mxamp tuned (policy)"),
           ("mxamp_as_tuned", "mxamp untuned, tuned's policy"), ("mxamp_o2", "mxamp O2"))
# (name, workload, numerator mode, denominator mode, minimum ratio)
SPEED_TARGETS = (
    ("MLP training, fp32 / mxamp", "mlp_train", "fp32", "mxamp", 2.0),
    ("ResNet-18 training, fp32 / mxamp", "resnet18_train", "fp32", "mxamp", 1.3),
    ("ResNet-18 converted inference, fp32 / mxamp", "resnet18_infer", "fp32", "mxamp", 4.0))
OVERFLOW_TARGET = ("ResNet-50 overflow check, reference / mxamp", "overflow", "reference",
                   "mxamp", 10.0)
#: Where bfloat16 cannot pay (no kernels, or emulated ones), the mode that computes in float32
#: must cost no more than AMP's own overhead: at most 1.05x float32's time (issue #10).
OVERHEAD_WORKLOADS = (("MLP training", "mlp_train"), ("ResNet-18 training", "resnet18_train"),
                      ("ResNet-18 converted inference", "resnet18_infer"))


def targets_for(bf16_class):
    """The targets that make sense on a CPU of ``bf16_class``: speedups where bfloat16 is
    native, float32's speed (within 1.05x) for the float32-compute mode elsewhere.

    >>> [t[3] for t in targets_for('none')][:1], [t[3] for t in targets_for('emulated')][:1]
    (['mxamp'], ['mxamp_auto'])
    """
    if bf16_class in ("native", "amx"):
        return SPEED_TARGETS + (OVERFLOW_TARGET,)
    mode = "mxamp" if bf16_class == "none" else "mxamp_auto"
    label = "bf16" if mode == "mxamp" else "auto"
    return tuple(("%s, fp32 / mxamp %s (float32 compute)" % (text, label), name, "fp32", mode,
                  1 / 1.05) for text, name in OVERHEAD_WORKLOADS) + (OVERFLOW_TARGET,)


def ratio(cells, workload, numerator, denominator):
    """``numerator time / denominator time`` (a speedup of the denominator), or None."""
    top, bottom = cells.get((workload, numerator), {}), cells.get((workload, denominator), {})
    if top.get("median_ms") and bottom.get("median_ms"):
        return top["median_ms"] / bottom["median_ms"]
    return None


def _cell(cell, key="median_ms", fmt="%.1f"):
    if not cell:
        return ""
    if key not in cell:
        text = " ".join(cell.get("error", cell.get("status", "?")).split()).replace("|", "/")
        return "%s: %s" % (cell.get("status", "error"), text[:80])
    text = fmt % cell[key]
    if cell.get("policy") and key == "median_ms":
        text += " (%s)" % cell["policy"]
    if cell.get("status") == "partial":
        text += " (%d of %d runs failed)" % (cell["runs"] - cell["ok"], cell["runs"])
    return text


def _ratio_text(value):
    return "" if value is None else "%.2fx" % value


def _workload_rows(cells, quick=False):
    titles = {name: w.title + (" [--quick: %s]" % "x".join(map(str, w.quick_shape)) if quick else "")
              for name, w in WORKLOADS.items()}
    for name, target in INIT_TARGETS.items():
        titles[name] = "`amp.init(target_dtype='%s')`, first call (import: below)" % target
    return [(name, titles[name]) for name in list(WORKLOADS) + list(INIT_TARGETS)
            if any(key[0] == name for key in cells)]


def _amx_text(features):
    if not features:
        return "mxamp's CPU features: not reported (no mxamp run succeeded)."
    if features.get("amx_in_effect"):
        return "AMX in effect for oneDNN (%s)." % features.get("amx_check")
    if features.get("amx_enabled"):
        return ("mxamp asked for AMX but it is NOT in effect (%s)."
                % (features.get("amx_check") or "unchecked"))
    note = {"none": " **This CPU has no bfloat16 kernels: mxamp computes a bfloat16 request in "
                    "float32 here, so the mxamp columns measure AMP's own overhead.**",
            "emulated": " **This CPU has no native bf16: oneDNN emulates it, bf16 is expected "
                        "to be slower than fp32 here; `auto` computes in float32.**"}
    return "mxamp did not enable AMX: %s.%s" % (features.get("reason"),
                                                 note.get(features.get("bf16_class"), ""))


def markdown(info, cells):
    """The report: machine, times with ratios, peak memory, overflow check, targets."""
    quick = info.get("quick")
    return "\n".join(_machine_lines(info) + _time_tables(cells, quick)
                     + memory_tables(cells, quick) + _bookkeeping_tables(cells)
                     + _target_lines(cells, info.get("bf16_class", "unknown"))) + "\n"


def _machine_lines(info):
    """The report's opening: the CPU's class, the machine, AMX, the command."""
    return ["# mxamp benchmark", "",
            "**CPU bfloat16 class: `%s`** (%s). What mxamp does on each class: README, "
            "\"CPU classes\"." % (info.get("bf16_class", "unknown"), info.get("bf16_reason", "")),
            "",
            "Machine: %s, %s cores (bf16 CPU flags: %s), kernel %s; Python %s, MXNet %s, "
            "OMP_NUM_THREADS=%s. Run %s%s, %s repeat(s) per cell, %s min; load average %.1f "
            "at the start, %.1f at the end." % (
                info.get("cpu"), info.get("cores"), ", ".join(info.get("bf16_flags", []))
                or "none", info.get("kernel"), info.get("python"), info.get("mxnet"),
                info.get("omp_num_threads"), info.get("date_utc"),
                " (--quick: tiny batches and 1 step, NOT representative)"
                if info.get("quick") else "",
                info.get("repeats"), info.get("suite_minutes"), info.get("loadavg_start", 0),
                info.get("loadavg_end", 0)),
            "", _amx_text(info.get("mxamp_cpu_features")), "",
            "Command: `%s`" % info.get("command", "python benchmark/run_all.py"), ""]


def _time_tables(cells, quick):
    """Step times with their ratios, then CPU time per step."""
    lines = ["Each cell: median over fresh processes of each process's median step time (ms). "
             "Ratios > 1 mean mxamp is faster.", ""]
    header = ["workload"] + [title for _, title in COLUMNS] + \
        ["fp32 / mxamp", "reference / mxamp", "fp32 / mxamp auto", "fp32 / mxamp O2"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, title in _workload_rows(cells, quick):
        row = [title] + [_cell(cells.get((name, mode))) for mode, _ in COLUMNS]
        row += [_ratio_text(ratio(cells, name, top, bottom))
                for top, bottom in (("fp32", "mxamp"), ("reference", "mxamp"),
                                    ("fp32", "mxamp_auto"), ("fp32", "mxamp_o2"))]
        lines.append("| " + " | ".join(row) + " |")

    lines += ["", "CPU time per step (ms, all threads of the process; steadier than wall time on a "
              "loaded machine when OMP_NUM_THREADS=1):", "",
              "| workload | " + " | ".join(t for _, t in COLUMNS) + " | fp32 / mxamp |",
              "|" + "---|" * (len(COLUMNS) + 2)]
    for name, title in _workload_rows(cells, quick):
        if name in INIT_TARGETS:
            continue
        row = [title] + [_cell(cells.get((name, mode)), "median_cpu_ms") for mode, _ in COLUMNS]
        top, bottom = (cells.get((name, m), {}).get("median_cpu_ms") for m in ("fp32", "mxamp"))
        row.append(_ratio_text(top / bottom if top and bottom else None))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _bookkeeping_tables(cells):
    """Import and first ``amp.init`` times, and the overflow check, where they ran."""
    lines = []
    imports = [(INIT_TARGETS[name], mode, cells[(name, mode)]) for name in INIT_TARGETS
               for mode in ("reference", "mxamp")
               if cells.get((name, mode), {}).get("import_ms") is not None]
    if imports:
        lines += ["", "Importing the AMP module after `import mxnet`, then its first `amp.init` "
                  "(ms, median over processes; mxamp computes at import what init needs, "
                  "issue #11 asks init <= %.0f ms):" % INIT_LIMIT_MS, "",
                  "| target | module | import | first amp.init |", "|---|---|---|---|"]
        lines += ["| %s | %s | %.1f | %.1f |" % (target, mode, cell["import_ms"], cell["median_ms"])
                  for target, mode, cell in imports]

    overflow = sorted((mode, cell) for (name, mode), cell in cells.items() if name == "overflow")
    if overflow:
        lines += ["", "AMP bookkeeping on ResNet-50's gradients (overflow check + unscale, "
                  "`benchmark/bench_overflow.py`):", "", "| implementation | median ms |", "|---|---|"]
        lines += ["| %s | %s |" % (mode, _cell(cell)) for mode, cell in overflow]
    return lines


def _target_lines(cells, bf16_class):
    """Each target of the issues: measured, required, met."""
    lines = ["", "Targets for a CPU of class `%s` (speedups: issue #5; float32-compute overhead: "
             "issue #10):" % bf16_class, "", "| target | measured | required | met |",
             "|---|---|---|---|"]
    for text, name, top, bottom, minimum in targets_for(bf16_class):
        value = ratio(cells, name, top, bottom)
        met = "n/a" if value is None else ("yes" if value >= minimum else "**no**")
        lines.append("| %s | %s | >= %.2fx | %s |" % (text, _ratio_text(value) or "missing",
                                                      minimum, met))
    for text, name, mode, base, least, most in memory_targets_for(bf16_class):
        value = memory_ratio(cells, name, mode, base)
        met = "n/a" if value is None else ("yes" if least <= value <= most else "**no**")
        required = "<= %.2fx" % most if not least else "%.2fx to %.2fx" % (least, most)
        lines.append("| %s (issue #25) | %s | %s | %s |" % (
            text, _ratio_text(value) or "missing", required, met))
    for name, target in INIT_TARGETS.items():
        cell = cells.get((name, "mxamp"), {})
        value = cell.get("median_ms")
        met = "n/a" if value is None else ("yes" if value <= INIT_LIMIT_MS else "**no**")
        lines.append("| mxamp's first `amp.init('%s')` (issue #11) | %s | <= %.0f ms | %s |" % (
            target, "missing" if value is None else "%.1f ms" % value, INIT_LIMIT_MS, met))
    return lines


#: Peak memory targets where bfloat16 computes: (text, workload, mode, base mode, at most
#: this ratio).
MEMORY_TARGETS = tuple(
    ("%s, O2 / fp32 peak memory" % title, name, "mxamp_o2", "fp32", 1.0)
    for name, title in (("mlp_train", "MLP training"), ("resnet18_train", "ResNet-18 training"),
                        ("mobilenet_train", "MobileNet training"),
                        ("transformer_train", "Transformer block training"))) + (
    ("ResNet-50 training, O2 / fp32 peak memory", "resnet50_train", "mxamp_o2", "fp32", 0.65),
    ("ResNet-50 training, mxamp / fp32 peak memory", "resnet50_train", "mxamp", "fp32", 0.7),
    ("ResNet-50 training, mxamp / reference peak memory", "resnet50_train", "mxamp",
     "reference", 1.0),
    ("ResNet-50 converted inference, mxamp / fp32 peak memory", "resnet50_infer", "mxamp",
     "fp32", 1.0))
_MEMORY_WORKLOADS = (("mlp_train", "MLP training"), ("resnet18_train", "ResNet-18 training"),
                     ("resnet50_train", "ResNet-50 training"),
                     ("mobilenet_train", "MobileNet training"),
                     ("transformer_train", "Transformer block training"),
                     ("resnet50_infer", "ResNet-50 converted inference"))


def memory_targets_for(bf16_class):
    """Issue #25's memory targets on a CPU of ``bf16_class``, as (text, workload, mode, base,
    least, most): where bfloat16 computes, :data:`MEMORY_TARGETS`; elsewhere the
    float32-compute mode (``mxamp`` on class 'none', ``mxamp_auto`` on 'emulated') at most
    1.02x float32, and within 2% of float32 after ``import mxamp`` (its settings, AMP's
    cost alone). On every class a tuned run peaks at most 1.05x an untuned run of its policy.

    >>> [t[2:] for t in memory_targets_for('none')][:2]
    [('mxamp', 'fp32', 0, 1.02), ('mxamp', 'fp32_mxamp_imported', 0.98, 1.02)]
    """
    tuned = tuple(("%s, tuned / untuned of the same policy, peak memory" % title, name,
                   "mxamp_tuned", "mxamp_as_tuned", 0, 1.05)
                  for name, title in _MEMORY_WORKLOADS if name != "resnet18_train")
    if bf16_class in ("native", "amx"):
        return tuple(t[:-1] + (0, t[-1]) for t in MEMORY_TARGETS) + tuned
    mode = "mxamp" if bf16_class == "none" else "mxamp_auto"
    computes = "%s (float32 compute)" % ("mxamp bf16" if mode == "mxamp" else "mxamp auto")
    return tuple(target for name, title in _MEMORY_WORKLOADS for target in (
        ("%s, %s / fp32 peak memory" % (title, computes), name, mode, "fp32", 0, 1.02),
        ("%s, %s / fp32 after `import mxamp`, peak memory" % (title, computes), name, mode,
         "fp32_mxamp_imported", 0.98, 1.02))) + tuned


MEMORY_RATIOS = (("mxamp / fp32", "mxamp", "fp32"), ("mxamp / reference", "mxamp", "reference"),
                 ("auto / fp32", "mxamp_auto", "fp32"), ("tuned / fp32", "mxamp_tuned", "fp32"),
                 ("tuned / untuned, same policy", "mxamp_tuned", "mxamp_as_tuned"),
                 ("O2 / fp32", "mxamp_o2", "fp32"))
ACCOUNT_MODES = (("fp32", "fp32"), ("reference", "reference bf16"), ("mxamp", "mxamp bf16"),
                 ("mxamp_o2", "mxamp O2"))


def memory_ratio(cells, workload, mode, base, key="maxrss_mb"):
    """``mode``'s memory over ``base``'s (< 1: mxamp holds less), or None. Tuned over untuned
    is taken process by process (run_all's ``peak_over_untuned``): two tuned processes may
    choose different policies, and each is held against the twin that ran its own."""
    if (mode, base, key) == ("mxamp_tuned", "mxamp_as_tuned", "maxrss_mb"):
        return cells.get((workload, mode), {}).get("peak_over_untuned")
    top, bottom = (cells.get((workload, m), {}).get(key) for m in (mode, base))
    return top / bottom if top and bottom else None


def _peak_cell(cell):
    """The highest peak of a cell, and its lowest where the processes differ by 1% or more.

    >>> _peak_cell({"maxrss_mb": 614.2, "spread_maxrss_mb": [598.1, 614.2]})
    '614 (598)'
    >>> _peak_cell({"maxrss_mb": 603.0, "spread_maxrss_mb": [602.4, 603.0]})
    '603'
    """
    text = _cell(cell, "maxrss_mb", "%.0f")
    low, high = (cell or {}).get("spread_maxrss_mb") or (None, None)
    if low and high and high - low >= 0.01 * high:
        text += " (%.0f)" % low
    return text


def memory_tables(cells, quick=False):
    """Peak memory per mode with ratios, the training delta, and where the bytes go."""
    rows = [(name, title) for name, title in _workload_rows(cells, quick) if name in WORKLOADS]
    lines = ["", "Peak resident memory of the process (maxrss, MB): the highest of the cell's "
             "processes, with the lowest after it where they differ by 1% or more; ratios, from "
             "the highest, < 1 mean less memory than the other mode:", "",
             "| workload | " + " | ".join(t for _, t in COLUMNS) + " | "
             + " | ".join(t for t, _, _ in MEMORY_RATIOS) + " |",
             "|" + "---|" * (len(COLUMNS) + len(MEMORY_RATIOS) + 1)]
    for name, title in rows:
        row = [title] + [_peak_cell(cells.get((name, mode))) for mode, _ in COLUMNS]
        row += [_ratio_text(memory_ratio(cells, name, m, b)) for _, m, b in MEMORY_RATIOS]
        lines.append("| " + " | ".join(row) + " |")
    trials = ["%s %.0f MB" % (title, cells[(name, "mxamp_tuned")]["trials_maxrss_mb"])
              for name, title in rows
              if cells.get((name, "mxamp_tuned"), {}).get("trials_maxrss_mb")]
    if trials:
        lines += ["", "`amp.tune` times each candidate in a forked copy of the process, whose "
                  "memory ends with it (not in the tuned column); the largest copy's peak: "
                  + "; ".join(trials) + "."]
    lines += ["", "Above the model's baseline (peak after the model, AMP, O2's cast and tuning "
              "were set up, before the first step): what the steps added (MB):", "",
              "| workload | " + " | ".join(t for _, t in COLUMNS) + " |",
              "|" + "---|" * (len(COLUMNS) + 1)]
    for name, title in rows:
        row = [title]
        for mode, _ in COLUMNS:
            cell = cells.get((name, mode), {})
            both = cell.get("maxrss_mb"), cell.get("baseline_mb")
            row.append("%.0f" % (both[0] - both[1]) if all(both) else "")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Where the bytes go (MB, `benchmark/memory_account.py`): parameters, "
              "gradients and optimizer state (float32 masters included) counted from the "
              "arrays; mxamp's float32 workspace; graph = what MXNet's storage grew by in the "
              "second step (the first made the optimizer state) beyond those arrays "
              "(activations kept for backward, cast copies, workspaces), of which weight "
              "casts = the low-precision copies of parameters the graph makes each step "
              "(counted from the graph):", "",
              "| workload | mode | parameters | gradients | optimizer | workspace | graph | "
              "of which weight casts | baseline | peak |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, title in rows:
        for mode, label in ACCOUNT_MODES:
            cell = cells.get((name, mode), {})
            if "params_mb" not in cell:
                continue
            lines.append("| %s | %s | %s |" % (title, label, " | ".join(
                "%.0f" % cell[k] if cell.get(k) is not None else "" for k in (
                    "params_mb", "grads_mb", "optimizer_mb", "workspace_mb", "graph_mb",
                    "weight_casts_mb", "baseline_mb", "maxrss_mb"))))
    return lines


def bar_chart(cells, path):
    """Speedup over fp32 per workload and mode; returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [name for name in WORKLOADS if (name, "fp32") in cells]
    modes = [(mode, title) for mode, title in COLUMNS if mode != "fp32"]
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(max(8, 1.8 * len(names)), 4.5))
    for i, (mode, title) in enumerate(modes):
        values = [ratio(cells, name, "fp32", mode) or 0.0 for name in names]
        ax.bar([x + (i - (len(modes) - 1) / 2) * width for x in range(len(names))], values,
               width, label=title)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.replace("_", "\n") for n in names])
    ax.set_ylabel("speedup over fp32 (higher is better)")
    ax.set_title("bf16 mixed precision vs fp32 (0 = not run / failed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
