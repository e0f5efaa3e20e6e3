"""Run MXNet 1.9.1's own AMP tests (tests/python/mkl/test_contrib_amp.py) with mxamp in the
reference's place, or against the reference itself, offline.

    python ci/reference_suite.py /path/to/mxnet-checkout            # mxamp as mxnet.contrib.amp
    python ci/reference_suite.py /path/to/mxnet-checkout --reference

The checkout must be at tag 1.9.1 (``git -C mxnet checkout 1.9.1``); nothing of it is copied into
this repository. The suite is staged in a temporary folder with three stand-ins: ``nose.tools``
(nose does not import on Python 3.11; MXNet's tests use its ``assert_raises`` and
``make_decorator``), an empty ``models`` module (``common.py`` imports it), and a
``download_model`` that builds a local symbolic ResNet-18 checkpoint with the node names of
MXNet's ``imagenet1k-resnet-18`` (random weights; the tests only run it). Extra arguments go
to pytest.

The suite runs bfloat16 graphs, so on a CPU without bfloat16 kernels (class 'none', AVX2)
``test_amp_conversion`` and ``test_amp_accuracy`` fail with "could not create a primitive
descriptor iterator" for the reference and for mxamp alike; on an AVX-512 CPU all five run.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NOSE_TOOLS = '''
import functools
import unittest

assert_raises = unittest.TestCase().assertRaises


def make_decorator(func):
    def decorate(newfunc):
        return functools.wraps(func)(newfunc)
    return decorate
'''

CONFTEST = '''
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mxnet as mx
import mxnet.test_utils as test_utils

if os.environ.get("MXAMP_AS_REFERENCE") == "1":
    import mxamp
    sys.modules["mxnet.contrib.amp"] = mxamp
    sys.modules["mxnet.contrib.amp.amp"] = mxamp.amp
    mx.contrib.amp = mxamp
sys.path.insert(0, {root!r})
from ci.reference_suite import local_resnet18_checkpoint
test_utils.download_model = local_resnet18_checkpoint
'''


def _unit(sym, data, filters, stride, same_shape, name):
    """A pre-activation residual unit named as MXNet's model-zoo symbols name them."""
    bn1 = sym.BatchNorm(data, fix_gamma=False, eps=2e-5, name=name + "_bn1")
    act1 = sym.Activation(bn1, act_type="relu", name=name + "_relu1")
    conv1 = sym.Convolution(act1, num_filter=filters, kernel=(3, 3), stride=stride, pad=(1, 1),
                            no_bias=True, name=name + "_conv1")
    bn2 = sym.BatchNorm(conv1, fix_gamma=False, eps=2e-5, name=name + "_bn2")
    act2 = sym.Activation(bn2, act_type="relu", name=name + "_relu2")
    conv2 = sym.Convolution(act2, num_filter=filters, kernel=(3, 3), pad=(1, 1), no_bias=True,
                            name=name + "_conv2")
    shortcut = data if same_shape else sym.Convolution(
        act1, num_filter=filters, kernel=(1, 1), stride=stride, no_bias=True, name=name + "_sc")
    return conv2 + shortcut


def resnet18_symbol(classes=1000):
    """ResNet-18 (v2) with imagenet1k-resnet-18's node names (``fc1``, ``stage2_unit1_conv2``)."""
    import mxnet as mx
    sym = mx.sym
    body = sym.BatchNorm(sym.var("data"), fix_gamma=True, eps=2e-5, name="bn_data")
    body = sym.Convolution(body, num_filter=64, kernel=(7, 7), stride=(2, 2), pad=(3, 3),
                           no_bias=True, name="conv0")
    body = sym.Activation(sym.BatchNorm(body, fix_gamma=False, eps=2e-5, name="bn0"),
                          act_type="relu", name="relu0")
    body = sym.Pooling(body, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max")
    for stage, filters in enumerate((64, 128, 256, 512), start=1):
        stride = (1, 1) if stage == 1 else (2, 2)
        body = _unit(sym, body, filters, stride, stage == 1, "stage%d_unit1" % stage)
        body = _unit(sym, body, filters, (1, 1), True, "stage%d_unit2" % stage)
    body = sym.Activation(sym.BatchNorm(body, fix_gamma=False, eps=2e-5, name="bn1"),
                          act_type="relu", name="relu1")
    body = sym.Flatten(sym.Pooling(body, global_pool=True, kernel=(7, 7), pool_type="avg",
                                   name="pool1"))
    return sym.SoftmaxOutput(sym.FullyConnected(body, num_hidden=classes, name="fc1"),
                             name="softmax")


def local_resnet18_checkpoint(model_name, dst_dir="./", meta_info=None):
    """``download_model`` for imagenet1k-resnet-18, built here (random weights, epoch 0)."""
    import mxnet as mx
    if model_name != "imagenet1k-resnet-18":
        raise ValueError("only imagenet1k-resnet-18 is built locally, not %r" % model_name)
    prefix = os.path.join(dst_dir, model_name)
    if not os.path.exists(prefix + "-0000.params"):
        mod = mx.mod.Module(resnet18_symbol(), context=mx.cpu())
        mod.bind(data_shapes=[("data", (1, 3, 224, 224))], label_shapes=[("softmax_label", (1,))])
        mod.init_params(mx.init.Xavier())
        mod.save_checkpoint(prefix, 0)
    return prefix, 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mxnet", help="an MXNet checkout at tag 1.9.1")
    parser.add_argument("--reference", action="store_true",
                        help="test mxnet.contrib.amp itself instead of mxamp")
    args, pytest_args = parser.parse_known_args()
    tests = os.path.join(args.mxnet, "tests", "python")
    stage = tempfile.mkdtemp(prefix="mxamp-reference-suite-")
    try:
        shutil.copy(os.path.join(tests, "mkl", "test_contrib_amp.py"), stage)
        shutil.copy(os.path.join(tests, "unittest", "common.py"), stage)
        os.makedirs(os.path.join(stage, "nose"))
        open(os.path.join(stage, "nose", "__init__.py"), "w").close()
        with open(os.path.join(stage, "nose", "tools.py"), "w") as out:
            out.write(NOSE_TOOLS)
        open(os.path.join(stage, "models.py"), "w").close()
        with open(os.path.join(stage, "conftest.py"), "w") as out:
            out.write(CONFTEST.format(root=ROOT))
        env = dict(os.environ, MXAMP_AS_REFERENCE="0" if args.reference else "1")
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "test_contrib_amp.py"] + pytest_args, cwd=stage, env=env)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
