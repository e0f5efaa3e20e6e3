"""The two models ``train_mnist.py`` trains on 28x28 digits: a small ResNet (the main job's) and
LeNet-5 with BatchNorm. MXNet is imported when a model is built, so that a script can let
``amp.init()`` patch it first.

>>> net = build_resnet()
>>> net.initialize()
>>> import mxnet as mx
>>> net(mx.nd.zeros((2, 1, 28, 28))).shape
(2, 10)
"""
import functools


def build_lenet():
    """LeNet-5 with BatchNorm: two Conv-BN-ReLU-MaxPool stages, then two Dense layers."""
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=5), nn.BatchNorm(), nn.Activation("relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(50, kernel_size=5), nn.BatchNorm(), nn.Activation("relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(), nn.Dense(500, activation="relu"), nn.Dense(10))
    return net


def build_resnet():
    """A small ResNet for 28x28 digits: a 3x3 stem convolution, three stages of one basic
    residual block (32, 64 and 128 channels; the last two halve the resolution), global
    average pooling and a Dense layer. Every layer knows its input size (no deferred init)."""
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, padding=1, use_bias=False, in_channels=1),
            nn.BatchNorm(in_channels=32), nn.Activation("relu"))
    for channels, stride, in_channels in ((32, 1, 32), (64, 2, 32), (128, 2, 64)):
        net.add(ResidualBlock(channels, stride, in_channels))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(10, in_units=128))
    return net


@functools.lru_cache(maxsize=None)
def _residual_block_class():
    from mxnet.gluon import nn

    class _ResidualBlock(nn.HybridBlock):
        """conv-BN-ReLU-conv-BN plus the input (projected by a 1x1 convolution where the
        shape changes), then ReLU."""

        def __init__(self, channels, stride, in_channels, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.body = nn.HybridSequential()
                self.body.add(nn.Conv2D(channels, 3, stride, 1, use_bias=False,
                                        in_channels=in_channels),
                              nn.BatchNorm(in_channels=channels), nn.Activation("relu"),
                              nn.Conv2D(channels, 3, 1, 1, use_bias=False,
                                        in_channels=channels),
                              nn.BatchNorm(in_channels=channels))
                self.project = None
                if stride != 1 or in_channels != channels:
                    self.project = nn.HybridSequential()
                    self.project.add(nn.Conv2D(channels, 1, stride, use_bias=False,
                                               in_channels=in_channels),
                                     nn.BatchNorm(in_channels=channels))

        def hybrid_forward(self, F, x):
            skip = self.project(x) if self.project is not None else x
            return F.Activation(self.body(x) + skip, act_type="relu")
    return _ResidualBlock


def ResidualBlock(channels, stride, in_channels):  # noqa: N802 (a layer, named like one)
    """One basic residual block (the class is made on first use: mxnet is imported lazily)."""
    return _residual_block_class()(channels, stride, in_channels)
