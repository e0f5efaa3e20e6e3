"""Train GluonCV's YOLOv3 with mixed precision, the way GluonCV's own train_yolo3.py does.

The loop follows ``scripts/detection/yolo/train_yolo3.py`` from GluonCV 0.10: the model from
``gluoncv.model_zoo.get_model``, its training transform and target generator, ``--amp`` with
``amp.init()``, a Trainer with ``update_on_kvstore=False``, ``amp.init_trainer`` and
``amp.scale_loss`` on the LIST of per-device losses inside ``autograd.record()``. The only
change for mxamp is the import. The data is a generated VOC-style set (no download).

    python example/gluoncv_yolo3.py --amp --iters 10            # mxamp, bfloat16 on a CPU
    python example/gluoncv_yolo3.py --iters 10                  # float32
    python example/gluoncv_yolo3.py --amp --impl reference      # mxnet.contrib.amp: fails on a
                                                                # CPU (see below)
    python -m mxamp run example/gluoncv_yolo3.py --amp --impl reference
                          # the reference's import and bare amp.init(), with mxamp in its place

With ``mxnet.contrib.amp`` in bfloat16 the same script stops before the first step: YOLOv3
concatenates bfloat16 and float32 feature maps, and the reference's ``Concat`` is not a
widest-type op ("Non-uniform data type in Concat"); its lists also force input-less ops such as
``_zeros`` to float32, which breaks hybridized blocks. ``--impl reference`` shows the failure
in one line and exits with code 2. With ``--impl reference`` and no ``--target-dtype`` the script
calls a bare ``amp.init()``, as GluonCV's does: float16, which the reference cannot run on a
CPU; under ``python -m mxamp run`` that bare call means 'auto' (bfloat16 where this CPU computes
it faster, float32 elsewhere), and the report says which dtype the patched operators computed.
"""
import argparse
import json
import logging
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train YOLOv3 on generated VOC-style data.")
    parser.add_argument("--network", default="mobilenet1.0",
                        help="base network: mobilenet0.25, mobilenet1.0 or darknet53")
    parser.add_argument("--dataset", default="voc", help="model-zoo variant (voc: 20 classes)")
    parser.add_argument("--data-shape", type=int, default=160,
                        help="input size in pixels (a multiple of 32)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-images", type=int, default=32, help="generated training images")
    parser.add_argument("--iters", type=int, default=10, help="training iterations to run")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", type=float, default=0.0005)
    parser.add_argument("--amp", action="store_true", help="train with automatic mixed precision")
    parser.add_argument("--target-dtype", default=None, choices=["auto", "bfloat16", "float16"],
                        help="auto (the default with mxamp): float16 on a GPU, bfloat16 on a "
                             "CPU; with --impl reference and none given, a bare amp.init()")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                        help="auto = the first GPU if MXNet sees one, else the CPU")
    parser.add_argument("--impl", choices=["mxamp", "reference"], default="mxamp",
                        help="which AMP: mxamp, or mxnet.contrib.amp for comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--json", default="", help="write the per-iteration losses here")
    args = parser.parse_args(argv)
    if args.data_shape % 32:
        parser.error("--data-shape must be a multiple of 32 (YOLOv3's largest stride)")
    if args.iters < 1 or args.batch_size < 1:
        parser.error("--iters and --batch-size must be positive")
    return args


def get_dataloader(net, train_dataset, data_shape, batch_size):
    """GluonCV's YOLOv3 loader: the transform also generates the training targets."""
    from gluoncv.data.batchify import Pad, Stack, Tuple
    from gluoncv.data.transforms.presets.yolo import YOLO3DefaultTrainTransform
    from mxnet import gluon

    width, height = data_shape, data_shape
    # image and the five fixed-size targets are stacked; the ground-truth boxes are padded
    batchify_fn = Tuple(*([Stack() for _ in range(6)] + [Pad(axis=0, pad_val=-1)]))
    return gluon.data.DataLoader(
        train_dataset.transform(YOLO3DefaultTrainTransform(width, height, net)),
        batch_size, shuffle=True, batchify_fn=batchify_fn, last_batch="rollover",
        num_workers=0)


def train(net, train_data, ctx, args, amp):
    """The body of GluonCV's ``train()``, for ``args.iters`` iterations."""
    import mxnet as mx
    from mxnet import autograd, gluon

    net.collect_params().reset_ctx(ctx)
    trainer = gluon.Trainer(
        net.collect_params(), "sgd",
        {"learning_rate": args.lr, "wd": args.wd, "momentum": args.momentum},
        kvstore="local", update_on_kvstore=(False if args.amp else None))
    if args.amp:
        amp.init_trainer(trainer)

    logger = logging.getLogger("yolo3")
    history = []
    net.hybridize()
    iteration = 0
    start = time.time()
    while iteration < args.iters:
        for batch in train_data:
            if iteration >= args.iters:
                break
            data = gluon.utils.split_and_load(batch[0], ctx_list=ctx, batch_axis=0)
            # objectness, center_targets, scale_targets, weights, class_targets
            fixed_targets = [gluon.utils.split_and_load(batch[it], ctx_list=ctx, batch_axis=0)
                             for it in range(1, 6)]
            gt_boxes = gluon.utils.split_and_load(batch[6], ctx_list=ctx, batch_axis=0)
            sum_losses, parts = [], []
            with autograd.record():
                for ix, x in enumerate(data):
                    obj_loss, center_loss, scale_loss, cls_loss = net(
                        x, gt_boxes[ix], *[ft[ix] for ft in fixed_targets])
                    sum_losses.append(obj_loss + center_loss + scale_loss + cls_loss)
                    parts.append((obj_loss, center_loss, scale_loss, cls_loss))
                if args.amp:
                    with amp.scale_loss(sum_losses, trainer) as scaled_loss:
                        autograd.backward(scaled_loss)
                else:
                    autograd.backward(sum_losses)
            trainer.step(args.batch_size)
            names = ("obj", "center", "scale", "cls")
            record = {name: float(np.mean([p[k].astype("float32").mean().asscalar()
                                           for p in parts])) for k, name in enumerate(names)}
            scaler = getattr(trainer, "_amp_loss_scaler", None)
            record["loss_scale"] = float(scaler.loss_scale) if scaler is not None else 1.0
            record["skipped_steps"] = int(getattr(scaler, "skipped_steps", 0) or 0)
            record["seconds"] = time.time() - start
            history.append(record)
            iteration += 1
            if iteration % args.log_interval == 0:
                logger.info("[iter %d] %.1f s, ObjLoss=%.3f, BoxCenterLoss=%.3f, "
                            "BoxScaleLoss=%.3f, ClassLoss=%.3f, loss scale=%g", iteration,
                            record["seconds"], record["obj"], record["center"],
                            record["scale"], record["cls"], record["loss_scale"])
    mx.nd.waitall()
    return history


def computes_in(mx):
    """The dtype a FullyConnected computes in now, as the (maybe patched) operator answers."""
    out = mx.nd.FullyConnected(mx.nd.ones((2, 8)), mx.nd.ones((4, 8)), no_bias=True,
                               num_hidden=4)
    dtype = np.dtype(out.dtype)
    return "bfloat16" if dtype.names == ("bfloat16",) else dtype.name


def _init_amp(args, on_gpu):
    """``(the AMP module or None, the target dtype)``, after ``amp.init`` as ``args`` ask."""
    if not args.amp:
        return None, "float32"
    if args.impl == "reference":
        from mxnet.contrib import amp
    else:
        from mxamp import amp
    target = args.target_dtype or ("amp.init()" if args.impl == "reference" else "auto")
    if target == "auto":
        target = "float16" if on_gpu else "bfloat16"
    if target == "amp.init()":
        amp.init()          # GluonCV's train_yolo3.py: `if args.amp: amp.init()`
    else:
        amp.init(target_dtype=target)
    return amp, target


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import mxnet as mx
    import gluoncv as gcv
    from gluoncv import model_zoo
    from synthetic_detection import SyntheticVOC

    on_gpu = (args.device == "gpu"
              or (args.device == "auto" and mx.context.num_gpus() > 0))
    amp, target = _init_amp(args, on_gpu)
    gcv.utils.random.seed(args.seed)
    ctx = [mx.gpu(0)] if on_gpu else [mx.cpu()]

    net_name = "_".join(("yolo3", args.network, args.dataset))
    net = model_zoo.get_model(net_name, pretrained=False, pretrained_base=False)
    with warnings.catch_warnings(record=True):  # as GluonCV's script: hush deferred-init notes
        warnings.simplefilter("always")
        net.initialize()
    train_dataset = SyntheticVOC(num_images=args.num_images, size=args.data_shape,
                                 seed=args.seed)

    precision = (f"{target} ({args.impl})" if args.amp else "float32")
    # what really computes: a bfloat16 request on a CPU without bf16 kernels runs in float32
    ran = amp.precision_plan(target, ctx[0]).summary() if args.amp and args.impl == "mxamp" \
        else "AMP computes %s" % computes_in(mx) if args.amp else precision
    logging.info("training %s on %d generated images (%dx%d), batch %d, %d iterations, %s",
                 net_name, len(train_dataset), args.data_shape, args.data_shape,
                 args.batch_size, args.iters, precision)
    try:
        # building the transform already runs the network once (to get its anchors)
        train_data = get_dataloader(net, train_dataset, args.data_shape, args.batch_size)
        history = train(net, train_data, ctx, args, amp)
    except mx.base.MXNetError as err:
        if not (args.amp and args.impl == "reference"):
            raise
        # the known failure of mxnet.contrib.amp here: report it in one line, exit non-zero
        reason = [line for line in str(err).splitlines() if line.strip()][-1]
        print(f"mxnet.contrib.amp failed to train {net_name} in {target}: {reason}")
        return 2
    totals = [sum(h[k] for k in ("obj", "center", "scale", "cls")) for h in history]
    finite = bool(np.all(np.isfinite(totals)))
    print(f"done: {len(history)} iterations in {precision} ({ran}), total loss "
          f"{totals[0]:.3f} -> {totals[-1]:.3f}, skipped steps "
          f"{history[-1]['skipped_steps']}, final loss scale {history[-1]['loss_scale']:g}, "
          f"{'all losses finite' if finite else 'NON-FINITE LOSS'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"precision": precision, "what_ran": ran, "history": history}, f)
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
