"""Convert a Gluon model-zoo ResNet for bfloat16 inference on a CPU, check it, time it.

    python example/convert_resnet.py                       # ResNet-50 v1, batch 8
    python example/convert_resnet.py --model resnet18_v1 --batch 4 --export /tmp/r18-bf16

Steps: build the float32 network (Xavier init: no download needed; pass --pretrained to use
the model-zoo weights if you have them), run it once, convert it with
``amp.convert_hybrid_block`` (weights stored in bfloat16), compare the outputs with float32
(relative L2 error, top-1 agreement), time both, and optionally export the converted model so
that ``SymbolBlock.imports`` loads it back with its casts.

``import mxamp`` comes before the first oneDNN operator so that it can switch oneDNN to Intel
AMX where the CPU has it (bfloat16 is much faster with AMX; see ``mxamp.backend.cpu``). What the
converted model computes depends on the CPU's bfloat16 class, and the script prints it: on a CPU
without bfloat16 kernels (class 'none') it computes in float32, with float32's outputs.
"""
import argparse
import statistics
import time

import mxamp  # noqa: F401  (first: lets mxamp enable AMX before oneDNN starts)
import mxnet as mx
import numpy as np
from mxamp import amp
from mxamp.backend import cpu


def median_ms(block, x, repeat):
    for _ in range(2):  # warm-up: graph build, oneDNN primitive creation
        block(x).wait_to_read()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        block(x).wait_to_read()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50_v1")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=10, help="timed forward passes per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pretrained", action="store_true", help="model-zoo weights")
    parser.add_argument("--export", default=None, help="path prefix to export the bf16 model")
    args = parser.parse_args()

    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    net = mx.gluon.model_zoo.vision.get_model(args.model, pretrained=args.pretrained)
    if not args.pretrained:
        net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    images = mx.nd.random.uniform(shape=(args.batch, 3, 224, 224))
    reference = net(images)

    bf16_net = amp.convert_hybrid_block(net, "bfloat16", cast_optional_params=True)
    bf16_net.hybridize(static_alloc=True, static_shape=True)
    output = bf16_net(images)

    ref, out = reference.asnumpy().astype(np.float64), output.asnumpy().astype(np.float64)
    rel_error = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    agree = int((out.argmax(1) == ref.argmax(1)).sum())
    plan = amp.precision_plan("bfloat16", mx.cpu())
    print("%s, batch %d, CPU class %r: %s" % (args.model, args.batch, plan.device, plan.summary()))
    print("converted vs float32: relative L2 error %.4f, top-1 agreement %d/%d"
          % (rel_error, agree, args.batch))

    fp32_ms = median_ms(net, images, args.repeat)
    bf16_ms = median_ms(bf16_net, images, args.repeat)
    features = cpu.cpu_features()
    print("forward, median of %d: float32 %.1f ms, converted (%s compute) %.1f ms, speedup "
          "x%.2f (AMX %s)" % (args.repeat, fp32_ms, plan.compute, bf16_ms, fp32_ms / bf16_ms,
                              "on" if features.amx_enabled else "off: " + (
                                  features.reason or "not available")))

    if args.export:
        bf16_net.export(args.export)
        back = mx.gluon.SymbolBlock.imports(args.export + "-symbol.json", ["data"],
                                            args.export + "-0000.params")
        same = np.array_equal(back(images).asnumpy(), output.asnumpy())
        print("exported to %s-symbol.json / -0000.params; re-imported outputs identical: %s"
              % (args.export, same))


if __name__ == "__main__":
    main()
