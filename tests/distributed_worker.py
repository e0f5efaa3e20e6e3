"""The worker script of ``test_distributed.py``: run in the processes its tests launch
(``python distributed_worker.py MODE ...``, under ``mxamp.launch`` or ``horovodrun --gloo``).
Workers print one ``MXAMP-STEP {json}`` line per step and save their final parameters; mode
``reference`` is the single process that sums the same per-worker gradients.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

STEPS, INJECT_STEP, INJECT_RANK, SAVE_AT = 7, 3, 1, 4
BATCH = 16


def _batch(rank, step):
    rng = np.random.RandomState(1000 * rank + step)
    return rng.randn(BATCH, 8).astype(np.float32), rng.randint(0, 4, BATCH).astype(np.float32)


def _net(mx, offset=0.0):
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, activation="relu"), mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 8)))
    for param in net.collect_params().values():
        param.set_data(param.data() + offset)
    return net


def _weights(net):
    return np.concatenate([p.data().asnumpy().ravel() for p in net.collect_params().values()])


def _checksum(net):
    return hashlib.md5(_weights(net).tobytes()).hexdigest()[:16]


def _report(kind, **fields):
    print("MXAMP-%s %s" % (kind, json.dumps(fields, sort_keys=True)), flush=True)


def _losses(mx, net, rank, step, inject):
    x, y = _batch(rank, step)
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(mx.nd.array(x)), mx.nd.array(y)).sum()
    return loss * float("inf") if inject else loss


def _train(args):
    """AMP training; rank INJECT_RANK makes its loss inf at step INJECT_STEP."""
    import mxnet as mx
    from mxamp import amp
    from mxamp.training import distributed
    hvd_rank = 0
    if args.horovod:
        import horovod.mxnet as hvd
        hvd.init()
        hvd_rank = hvd.rank()
    net = _net(mx, offset=hvd_rank)  # Horovod ranks start apart, see before_first_step below
    if args.resume:
        net.load_parameters(os.path.join(args.resume, "net.params"))
    optimizer_params = {"learning_rate": 0.05, "momentum": 0.9}
    if args.horovod:
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", optimizer_params)
        rank = hvd_rank
    else:
        # The Trainer creates a kvstore it is given by name only at the first step; the data
        # of step 1 needs the rank before that, so the kvstore is created here.
        store = mx.kv.create(args.kvstore)
        rank = store.rank
        uok = {"none": None, "true": True, "false": False}[args.update_on_kvstore]
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", optimizer_params,
                                   kvstore=store, update_on_kvstore=uok)
    amp.init_trainer(trainer, target_dtype="float16", growth_interval=2)
    if args.horovod:  # ranks started from different weights: rank 0's must win before step 1
        distributed.before_first_step(trainer)
    first = 1
    if args.resume:  # every worker loads the files rank 0 wrote
        trainer.load_states(os.path.join(args.resume, "trainer.states"))
        first = SAVE_AT + 1
        state = distributed.check_scaler_in_sync(trainer)
        _report("RESUMED", rank=rank, scale=state["scale"])
    for step in range(first, args.steps + 1):
        with mx.autograd.record():
            loss = _losses(mx, net, rank, step, step == INJECT_STEP and rank == INJECT_RANK)
            with amp.scale_loss(loss, trainer) as scaled:
                mx.autograd.backward(scaled)
        trainer.step(BATCH)
        hook = trainer._amp_loss_scaler
        _report("STEP", rank=rank, step=step, scale=hook.loss_scale,
                skipped=hook.skipped_steps, checksum=_checksum(net))
        if args.save and step == SAVE_AT:
            if rank == 0:
                net.save_parameters(os.path.join(args.save, "net.params"))
                trainer.save_states(os.path.join(args.save, "trainer.states"))
    state = distributed.check_scaler_in_sync(trainer)  # a collective through kvstore/Horovod
    _report("SYNCED", rank=rank, scale=state["scale"], skipped=state["skipped_steps"])
    net.save_parameters(os.path.join(args.out, "rank%d.params" % rank))


def _start(args):
    """No AMP: workers start from different weights; before_first_step must align them."""
    import mxnet as mx
    from mxamp.training import distributed
    store = mx.kv.create("dist_sync")
    net = _net(mx, offset=store.rank)
    uok = args.update_on_kvstore == "true"
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.05, "momentum": 0.9},
                               kvstore=store, update_on_kvstore=uok)
    distributed.before_first_step(trainer, batch_size=BATCH)
    distributed.before_first_step(trainer, batch_size=BATCH)  # idempotent: no second barrier
    _report("START", rank=store.rank, checksum=_checksum(net))
    for step in range(1, 4):
        with mx.autograd.record():
            loss = _losses(mx, net, store.rank, step, False)
        loss.backward()
        trainer.step(BATCH)
    _report("STEP", rank=store.rank, step=3, checksum=_checksum(net))
    net.save_parameters(os.path.join(args.out, "rank%d.params" % store.rank))


def _collectives(args):
    """The kvstore sum of non-finite values, gather / any_worker / check_scaler_in_sync."""
    import mxnet as mx
    from mxamp import amp
    from mxamp.training import distributed
    store = mx.kv.create("dist_sync")
    rank = store.rank
    inf, nan = float("inf"), float("nan")
    mine = [[inf, 1.0, inf, nan, 1.0], [1.0, -inf, -inf, 1.0, 1.0]][rank]
    store.init(99, mx.nd.zeros((5,)))  # keys 0.. belong to the trainer below
    summed = mx.nd.zeros((5,))
    store.pushpull(99, mx.nd.array(mine), out=summed)
    net = _net(mx)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                               kvstore=store, update_on_kvstore=False)
    amp.init_trainer(trainer, target_dtype="float16")
    rows = distributed.gather([rank, 10.0 + rank], trainer)
    flags = [distributed.any_worker(rank == 1, trainer), distributed.any_worker(False, trainer)]
    in_sync = distributed.check_scaler_in_sync(trainer)["scale"]
    trainer._amp_loss_scaler._loss_scale = 1024.0 * (rank + 1)  # a worker loaded another file
    try:
        distributed.check_scaler_in_sync(trainer)
        mismatch = None
    except RuntimeError as err:
        mismatch = str(err)
    _report("COLLECTIVES", rank=rank, summed=[repr(v) for v in summed.asnumpy().tolist()],
            rows=rows, flags=flags, in_sync=in_sync, mismatch=mismatch)


def _reference(args):
    """One process, two simulated workers: the sum of their gradients, as the kvstore does."""
    import mxnet as mx
    from mxamp import amp
    net = _net(mx)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.05, "momentum": 0.9}, kvstore=None)
    if args.amp:
        amp.init_trainer(trainer, target_dtype="float16", growth_interval=2)
    for step in range(1, args.steps + 1):
        with mx.autograd.record():
            loss = sum(_losses(mx, net, rank, step, args.amp and step == INJECT_STEP
                               and rank == INJECT_RANK) for rank in range(2))
            if args.amp:
                with amp.scale_loss(loss, trainer) as scaled:
                    mx.autograd.backward(scaled)
        if not args.amp:
            loss.backward()
        trainer.step(BATCH * args.average)
        if args.amp:
            _report("STEP", rank=-1, step=step, scale=trainer._amp_loss_scaler.loss_scale)
    net.save_parameters(os.path.join(args.out, "reference.params"))


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "start", "collectives", "reference"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--update-on-kvstore", default="none", choices=["none", "true", "false"])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--save")
    parser.add_argument("--resume")
    parser.add_argument("--horovod", action="store_true")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--average", type=int, default=1)
    args = parser.parse_args(argv)
    {"train": _train, "start": _start, "collectives": _collectives,
     "reference": _reference}[args.mode](args)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
