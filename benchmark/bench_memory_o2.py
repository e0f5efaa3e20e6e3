"""Peak memory of ResNet-18 training: float32 vs patching mode (amp.init) vs O2 (amp.cast_model).

    python benchmark/bench_memory_o2.py                     # batch 16 x 3 x 224 x 224, 3 steps
    python benchmark/bench_memory_o2.py --batch 32 --steps 5 --dtype bfloat16

Each mode runs in a fresh subprocess (peak RSS is a per-process high-water mark and MXNet's
memory pools never shrink). The child builds the model, runs one inference pass to finish
initialisation, records its peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) as the
baseline, trains ``--steps`` SGD-momentum steps, and records the peak again. The training
delta (peak after minus baseline) is what the parameters' gradients, optimizer state, master
weights and the activations kept for backward cost; the script prints it per mode and its ratio
to float32.

Expectations: O2 stores activations and gradients in 16 bits, so its activation memory is about
half; its parameter-side memory is not smaller (16-bit weight and gradient plus a float32
master copy and float32 momentum = 12 bytes/parameter, like float32's 4+4+4). Patching mode
keeps float32 weights and adds low-precision copies of activations around each cast op.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, sys
import mxamp
import mxnet as mx
import numpy as np
from mxamp import amp
from mxamp.conversion.o2 import cast_model  # also amp.cast_model

mode, target = sys.argv[1], sys.argv[2]
batch, steps, size = (int(v) for v in sys.argv[3:6])
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
mx.random.seed(0)
if mode == "patching":
    amp.init(target_dtype=target)
net = mx.gluon.model_zoo.vision.resnet18_v1(classes=1000)
net.initialize(mx.init.Xavier())
x = mx.nd.random.uniform(shape=(batch, 3, size, size))
y = mx.nd.array(np.random.RandomState(0).randint(0, 1000, size=batch))
net(x[:1]).wait_to_read()
if mode == "o2":
    cast_model(net, target)
net.hybridize(static_alloc=True)
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9},
                           kvstore=None)
if mode != "fp32":
    amp.init_trainer(trainer)
loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
baseline = peak_mb()
for _ in range(steps):
    with mx.autograd.record():
        loss = loss_fn(net(x), y)
        if mode == "fp32":
            loss.backward()
        else:
            with amp.scale_loss(loss, trainer) as scaled:
                mx.autograd.backward(scaled)
    trainer.step(batch)
    loss.wait_to_read()
mx.nd.waitall()

def nbytes(obj):
    if isinstance(obj, mx.nd.NDArray):
        return obj.size * np.dtype(obj.dtype).itemsize
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(o) for o in obj)
    return 0
params = list(net.collect_params().values())
weights = sum(nbytes(p.data()) for p in params)
grads = sum(nbytes(p.grad()) for p in params if p.grad_req != "null")
states = sum(nbytes(v) for u in trainer._updaters for v in u.states.values())
print(json.dumps({"mode": mode, "baseline_mb": baseline, "peak_mb": peak_mb(),
                  "weights_mb": weights / 2**20, "grads_mb": grads / 2**20,
                  "optimizer_mb": states / 2**20, "loss": float(loss.mean().asscalar())}))
"""

MODES = ("fp32", "patching", "o2")


def run_mode(mode, args):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, "-c", CHILD, mode, args.dtype, str(args.batch), str(args.steps),
           str(args.size)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"mode": mode, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (CPU) or float16 (GPU)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=224, help="image side")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    args = parser.parse_args()

    print("ResNet-18 training, batch %dx3x%dx%d, %d steps, target %s; peak RSS per fresh "
          "process" % (args.batch, args.size, args.size, args.steps, args.dtype))
    results = [run_mode(mode, args) for mode in args.modes]
    fp32 = next((r for r in results if r["mode"] == "fp32" and "error" not in r), None)
    print("%-9s %9s %9s %9s %8s %8s %8s %12s %8s" % (
        "mode", "base MB", "peak MB", "train MB", "vs fp32", "weights", "grads", "optimizer",
        "loss"))
    for r in results:
        if "error" in r:
            print("%-9s failed: %s" % (r["mode"], r["error"]))
            continue
        delta = r["peak_mb"] - r["baseline_mb"]
        ratio = delta / (fp32["peak_mb"] - fp32["baseline_mb"]) if fp32 else float("nan")
        print("%-9s %9.0f %9.0f %9.0f %7.2fx %8.1f %8.1f %12.1f %8.3f" % (
            r["mode"], r["baseline_mb"], r["peak_mb"], delta, ratio, r["weights_mb"],
            r["grads_mb"], r["optimizer_mb"], r["loss"]))
    print("train MB: peak RSS growth during training (activations kept for backward, "
          "workspace, gradients and optimizer state allocated at the first step); weights/"
          "grads/optimizer: exact bytes of those arrays (optimizer includes fp32 master "
          "weights of 16-bit parameters).")


if __name__ == "__main__":
    main()
