"""How ``train_mnist.py`` shows its runs side by side: a Markdown table (accuracy, time per
epoch, speedup over fp32, peak memory, skipped steps, final loss scale, what ran) and a PNG of
the loss curves and the loss-scale history.

>>> print(format_table([{"run": "patch", "failed": "exit 1"}]).splitlines()[-1])
| amp.init() patching | FAILED (exit 1) |  |  |  |  |  |  |  |
"""
import numpy as np

RUNS = {"fp32": "float32 baseline", "patch": "amp.init() patching",
        "auto": "amp.init('auto') patching", "tuned": "amp.tune() policy",
        "o2": "O2 (model cast)"}
COLORS = {"fp32": "C0", "patch": "C1", "auto": "C3", "tuned": "C4", "o2": "C2"}


def format_table(results):
    """A Markdown table comparing the runs; speedup is relative to the fp32 run."""
    baseline = next((r for r in results if r["run"] == "fp32" and "failed" not in r), None)
    header = ("| run | dtype | test acc | s/epoch | speedup | peak MB | skipped steps "
              "| final loss scale | what ran |")
    lines = [header, "|" + "---|" * 9]
    for r in results:
        if "failed" in r:
            lines.append(f"| {RUNS[r['run']]} | FAILED ({r['failed']}) |  |  |  |  |  |  |  |")
            continue
        speedup = (f"{baseline['seconds_per_epoch'] / r['seconds_per_epoch']:.2f}x"
                   if baseline else "n/a")
        scale = "-" if r["run"] == "fp32" else f"{r['final_loss_scale']:g}"
        skipped = "-" if r["run"] == "fp32" else str(r["skipped_steps"])
        dtype = r["dtype"] + (" (mxnet.contrib.amp)" if r.get("impl") == "reference"
                              and r["run"] != "fp32" else "")
        lines.append(f"| {RUNS[r['run']]} | {dtype} | {100 * r['test_accuracy']:.1f}% "
                     f"| {r['seconds_per_epoch']:.2f} | {speedup} | {r['peak_rss_mb']:.0f} "
                     f"| {skipped} | {scale} | {r.get('what_ran', '')} |")
    return "\n".join(lines)


def plot(results, path):
    """Loss curves (moving average over 10 steps) and loss-scale history, one PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_scale) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        if "failed" in r:
            continue
        label = f"{RUNS[r['run']]} ({r['dtype']})"
        losses = np.asarray(r["losses"])
        window = min(10, len(losses))
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax_loss.plot(np.arange(window, len(losses) + 1), smooth, label=label,
                     color=COLORS[r["run"]])
        if r["run"] != "fp32":
            ax_scale.step(np.arange(1, len(r["loss_scales"]) + 1), r["loss_scales"],
                          where="post", label=label, color=COLORS[r["run"]],
                          linestyle="--" if r["run"] == "o2" else "-")  # runs may overlap
    ax_loss.set(xlabel="step", ylabel="training loss (10-step mean)", yscale="log",
                title="MNIST-5k")
    ax_scale.set(xlabel="step", ylabel="loss scale", yscale="log", title="Loss-scale history")
    for ax in (ax_loss, ax_scale):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
