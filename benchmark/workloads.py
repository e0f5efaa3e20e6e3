"""The models and inputs of the benchmark suite, at full and at smoke-test ("quick") size.

Each workload builds an fp32 Gluon model and a fixed, seeded batch. Precision is not decided
here: the modes in :mod:`modes` (fp32, reference AMP, mxamp, ...) wrap these models.
"""
import math
from dataclasses import dataclass
from typing import Tuple

import numpy as np


@dataclass(frozen=True)
class Workload:
    """One row of the benchmark: what to build and how big the batch is."""

    name: str          # key used on the command line and in the results
    title: str         # row label of the report
    kind: str          # 'train' (fwd+bwd+optimizer step) or 'infer' (converted forward)
    model: str         # 'mlp', 'resnet18_v1', ..., 'transformer', or a GLUONCV_MODELS name
    data_shape: Tuple[int, ...]
    classes: int
    quick_shape: Tuple[int, ...]  # the --quick batch: same model, tiny batch
    suite: str = "main"  # 'main': run_all's default rows; 'survey': run_all --survey


#: The amp.init timings (no model): workload name -> target_dtype of the timed first init.
INIT_TARGETS = {"amp_init": "bfloat16", "amp_init_fp16": "float16"}
#: What issue #11 asks of mxamp's first amp.init, in milliseconds (2 cores).
INIT_LIMIT_MS = 20.0

WORKLOADS = {w.name: w for w in [
    Workload("mlp_train", "MLP 6xDense(2048)+Dense(10) train, batch 512x1024", "train", "mlp",
             (512, 1024), 10, (32, 1024)),
    Workload("resnet18_train", "ResNet-18 train, batch 32x3x64x64", "train", "resnet18_v1",
             (32, 3, 64, 64), 10, (4, 3, 32, 32)),
    Workload("resnet50_train", "ResNet-50 train, batch 16x3x224x224", "train", "resnet50_v1",
             (16, 3, 224, 224), 1000, (2, 3, 64, 64)),
    Workload("mobilenet_train", "MobileNet 1.0 train, batch 4x3x320x320", "train",
             "mobilenet1_0", (4, 3, 320, 320), 1000, (2, 3, 64, 64)),
    Workload("yolo3_train", "GluonCV YOLOv3-MobileNet1.0 train (generated VOC), batch 4x3x320x320",
             "train", "yolo3_mobilenet1.0_voc", (4, 3, 320, 320), 20, (2, 3, 160, 160)),
    # Elementwise-heavy models (hard-swish, squeeze-excitation gates): MXNet's generic bf16
    # kernels decide their speed (ci/probe_bf16_speed.py); GluonCV, pretrained=False.
    Workload("mobilenetv3_train", "GluonCV MobileNetV3-Large train, batch 8x3x224x224",
             "train", "mobilenetv3_large", (8, 3, 224, 224), 10, (2, 3, 64, 64)),
    Workload("se_resnet18_train", "GluonCV SE-ResNet-18 train, batch 16x3x112x112", "train",
             "se_resnet18_v1", (16, 3, 112, 112), 10, (2, 3, 64, 64)),
    # Channel counts off 16-channel blocks (58, 116, 232) and channel shuffles.
    Workload("shufflenet_v2_train", "GluonCV ShuffleNet V2 train, batch 8x3x112x112", "train",
             "shufflenet_v2", (8, 3, 112, 112), 10, (2, 3, 64, 64)),
    # Grouped convolutions of 4 to 32 channels per group.
    Workload("resnext50_train", "GluonCV ResNeXt-50 32x4d train, batch 8x3x112x112", "train",
             "resnext50_32x4d", (8, 3, 112, 112), 10, (2, 3, 64, 64)),
    Workload("transformer_train", "Transformer encoder block train, batch 32x128x512", "train",
             "transformer", (32, 128, 512), 0, (2, 32, 512)),
    Workload("resnet18_infer", "ResNet-18 converted inference, batch 8x3x224x224", "infer",
             "resnet18_v1", (8, 3, 224, 224), 1000, (1, 3, 64, 64)),
    Workload("resnet50_infer", "ResNet-50 converted inference, batch 8x3x224x224", "infer",
             "resnet50_v1", (8, 3, 224, 224), 1000, (1, 3, 64, 64)),
]}

# The GluonCV survey (``run_all.py --survey``): classifiers beside the main rows, trained one
# step at a time at 112 px, to find where bfloat16 training is slower than float32. These train
# at 112 px in float32 too; SqueezeNet, DenseNet, GoogLeNet, DLA-34, Inception V3, HRNet and
# ResidualAttentionNet need larger inputs, and NASNet fails in oneDNN (float32 as well).
_SURVEY = (
    # (model, batch, what it has that the main rows lack)
    ("mobilenetv3_small", 8, "5x5 depthwise convolutions, hard-swish, SE gates on 16-96 channels"),
    ("mobilenetv2_1.0", 8, "inverted residuals with 24- and 144-channel pointwise convolutions"),
    ("shufflenet_v1", 8, "grouped 1x1 convolutions of 3 groups and channel shuffles"),
    ("se_resnext50_32x4d", 4, "grouped convolutions of 4 channels per group with SE gates"),
    ("xception", 2, "separable convolutions"),
    ("resnest14", 8, "split attention: grouped convolutions and softmax over radix"),
    ("darknet53", 8, "LeakyReLU after every BatchNorm"),
    ("vgg11_bn", 8, "large dense layers after BatchNorm'd convolutions"),
)
WORKLOADS.update((w.name, w) for w in (
    Workload("survey_%s" % model.replace(".", "_"),
             "GluonCV %s train, batch %dx3x112x112: %s" % (model, batch, what), "train",
             model, (batch, 3, 112, 112), 10, (2, 3, 64, 64), suite="survey")
    for model, batch, what in _SURVEY))


def _mlp(classes):
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    for _ in range(6):
        net.add(nn.Dense(2048, activation="relu"))
    net.add(nn.Dense(classes))
    return net


def _transformer_block():
    from mxnet.gluon import nn

    class EncoderBlock(nn.HybridBlock):
        """Post-norm encoder layer: 8-head self-attention (batch_dot) + FFN 2048, LayerNorms."""

        def __init__(self, units=512, heads=8, hidden=2048, **kwargs):
            super().__init__(**kwargs)
            self._units, self._heads = units, heads
            with self.name_scope():
                self.qkv = nn.Dense(3 * units, flatten=False)
                self.proj = nn.Dense(units, flatten=False)
                self.norm1 = nn.LayerNorm()
                self.ffn1 = nn.Dense(hidden, activation="relu", flatten=False)
                self.ffn2 = nn.Dense(units, flatten=False)
                self.norm2 = nn.LayerNorm()

        def _split_heads(self, F, x):
            # (B, T, C) -> (B * H, T, C / H)
            x = F.reshape(x, shape=(0, 0, self._heads, -1))
            return F.reshape(F.transpose(x, axes=(0, 2, 1, 3)), shape=(-3, 0, 0))

        def hybrid_forward(self, F, x):
            q, k, v = F.split(self.qkv(x), num_outputs=3, axis=-1)
            q, k, v = (self._split_heads(F, t) for t in (q, k, v))
            scores = F.batch_dot(q, k, transpose_b=True) / math.sqrt(self._units // self._heads)
            context = F.batch_dot(F.softmax(scores, axis=-1), v)            # (B*H, T, D)
            context = F.reshape(context, shape=(-4, -1, self._heads, 0, 0))  # (B, H, T, D)
            context = F.reshape(F.transpose(context, axes=(0, 2, 1, 3)), shape=(0, 0, -3))
            x = self.norm1(x + self.proj(context))
            return self.norm2(x + self.ffn2(self.ffn1(x)))

    return EncoderBlock()


#: Classification models built from GluonCV's model zoo rather than MXNet's.
GLUONCV_MODELS = ("mobilenetv3_large", "se_resnet18_v1", "resnext50_32x4d", "shufflenet_v2")


def build_model(workload):
    """The fp32 model of ``workload`` (not initialised)."""
    if workload.model == "mlp":
        return _mlp(workload.classes)
    if workload.model == "transformer":
        return _transformer_block()
    if workload.model in GLUONCV_MODELS or workload.suite == "survey":
        from gluoncv.model_zoo import get_model
        return get_model(workload.model, pretrained=False, classes=workload.classes)
    from mxnet.gluon.model_zoo import vision
    return getattr(vision, workload.model)(classes=workload.classes)


def make_batch(workload, quick=False, seed=0):
    """Seeded ``(data, label)`` NDArrays on the CPU; label is a same-shape target for the
    transformer (L2 loss) and class indices otherwise."""
    import mxnet as mx
    shape = workload.quick_shape if quick else workload.data_shape
    rng = np.random.RandomState(seed)
    data = mx.nd.array(rng.uniform(-1, 1, shape).astype(np.float32))
    if workload.model == "transformer":
        label = mx.nd.array(rng.uniform(-1, 1, shape).astype(np.float32))
    else:
        label = mx.nd.array(rng.randint(0, workload.classes, shape[0]).astype(np.float32))
    return data, label


def make_loss(workload):
    """The loss block matching :func:`make_batch`'s label."""
    from mxnet import gluon
    if workload.model == "transformer":
        return gluon.loss.L2Loss()
    return gluon.loss.SoftmaxCrossEntropyLoss()
